"""The weights ArkInfer's reference model runs to reproduce an MLX artifact exactly.

    folder = reference_folder(artifact_dir)       # <cache>/mlx-reference/<key>/

A quantised artifact's tensors are MLX affine (mx.quantize's biases are group minima, which have
no canonical zero point), so the reference model cannot read them through `quant.load`. This
writes them once, dequantised by MLX's formula scale*q + bias in float32
(`quant/formats/mlx.py: MLXFormat.dequantize`, numpy), as a float32 Hugging Face folder in
ArkInfer's cache (`arkinfer.lowering.reference_folder`); verify then checks the MLX runtime against the reference model on the same
weights. The key is a SHA-256 of the artifact's config and weight files, so an artifact rebuilt
in place gets a new folder. A float artifact is already a Hugging Face folder: it is returned
as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from arkinfer.quant.formats import get_format

from arkinfer.errors import ArkError
from arkinfer.frontend.checkpoint import read_config
from arkinfer.frontend.safetensors_io import weight_files
from arkinfer.frontend.shard_writer import TensorSpec, write_shards
from arkinfer.lowering.reference_folder import (
    REFERENCE_SHARD_BYTES,
    cached_reference_folder,
)

from .config import quantization_of

REFERENCE_VERSION = "1"


def _float_tensors(files: list[Path], raw: dict) -> tuple[list[TensorSpec], Callable]:
    """(the float32 tensors' specs, produce(spec) -> float32 numpy): quantised linears
    dequantised by MLX's formula, one tensor in memory at a time (mx.load is lazy)."""
    import mlx.core as mx

    bits, group, layers = quantization_of(raw)
    mlx_fmt = get_format("mlx")
    arrays: dict = {}
    for f in files:
        arrays.update(mx.load(str(f)))
    specs, params = [], {}
    for name, a in arrays.items():
        owner, _, key = name.rpartition(".")
        if key in ("scales", "biases") and f"{owner}.weight" in arrays:
            continue
        if key == "weight" and f"{owner}.scales" in arrays:
            entry = layers.get(owner)
            b = int(entry.get("bits", bits)) if isinstance(entry, dict) else bits
            g = int(entry.get("group_size", group)) if isinstance(entry, dict) else group
            params[name] = (owner, b, g)
            specs.append(TensorSpec(name, (a.shape[0], a.shape[1] * 32 // b)))
        else:
            specs.append(TensorSpec(name, tuple(a.shape)))

    def produce(spec: TensorSpec) -> np.ndarray:
        if spec.name not in params:
            return np.array(arrays[spec.name].astype(mx.float32))
        owner, b, g = params[spec.name]
        tensors = {"weight": np.array(arrays[spec.name]),
                   "scales": np.array(arrays[f"{owner}.scales"].astype(mx.float32)),
                   "biases": np.array(arrays[f"{owner}.biases"].astype(mx.float32))}
        return mlx_fmt.dequantize(tensors, spec.shape[0], spec.shape[1], bits=b, group_size=g)

    return specs, produce


def reference_folder(artifact_dir: str | Path) -> Path:
    """A float Hugging Face folder with the artifact's exact (dequantised) weights."""
    artifact = Path(artifact_dir)
    raw = read_config(artifact)
    if quantization_of(raw) is None:
        return artifact
    files = [f for f in weight_files(artifact) if f.suffix == ".safetensors"]
    if not files:
        raise ArkError(f"{artifact} has no model*.safetensors", hint="rebuild the artifact")

    def write_tensors(out: Path) -> None:
        write_shards(out, *_float_tensors(files, raw), "f32", REFERENCE_SHARD_BYTES)

    # mlx_lm.convert also writes a copy as "quantization_config", which the reference loader
    # would read as a (non-MLX) quantised folder: drop both.
    return cached_reference_folder("mlx", artifact, [artifact / "config.json", *files], raw,
                                   ("quantization", "quantization_config"), write_tensors,
                                   REFERENCE_VERSION)
