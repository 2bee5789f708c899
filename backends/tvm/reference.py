"""The weights ArkInfer's reference model runs to reproduce a TVM artifact exactly.

    folder = reference_folder(artifact_dir)     # <cache>/tvm-reference/<key>/

Written once from the artifact's own params.safetensors: q4 linears dequantised by
`weights.dequantize_q4` and Q8_0 float matrices by `weights.dequantize_q8` (the numpy
references of the kernels' formulas), float tensors as they are, as a float32 Hugging Face folder (config.json without quantization_config, tokenizer files).
verify then compares the host module with the reference model on the same weights, which
separates lowering / runtime error from quantisation error. The key hashes the artifact's
params and config, so an artifact rebuilt in place gets a new folder
(`arkinfer.lowering.reference_folder`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from arkinfer.frontend.checkpoint import read_config
from arkinfer.frontend.shard_writer import TensorSpec, write_shards
from arkinfer.lowering.reference_folder import (
    REFERENCE_SHARD_BYTES,
    cached_reference_folder,
)

from .weights import (
    CODES,
    Q8_CODES,
    Q8_SCALES,
    SCALES,
    ZEROS,
    dequantize_q4,
    dequantize_q8,
)

REFERENCE_VERSION = "2"   # 2: Q8_0 float matrices


def reference_folder(artifact_dir: str | Path) -> Path:
    """A float Hugging Face folder with the artifact's exact (dequantised) weights."""
    from safetensors import safe_open

    from .runner import read_module_info

    artifact = Path(artifact_dir)
    info = read_module_info(artifact)
    params = artifact / info["params_file"]

    def write_tensors(out: Path) -> None:
        with safe_open(str(params), "numpy") as f:
            names = list(f.keys())
            specs, packed = [], {}
            for name in names:
                owner, _, key = name.rpartition(".")
                if name.startswith("rope.") or key in (SCALES, ZEROS, Q8_SCALES):
                    continue  # computed from the config / read with their codes
                if key == Q8_CODES:
                    packed[f"{owner}.weight"] = owner
                    specs.append(TensorSpec(f"{owner}.weight",
                                            tuple(f.get_slice(name).get_shape())))
                elif key == CODES:
                    shape = f.get_slice(name).get_shape()
                    packed[f"{owner}.weight"] = owner
                    specs.append(TensorSpec(f"{owner}.weight", (shape[0], shape[1] * 8)))
                else:
                    specs.append(TensorSpec(name, tuple(f.get_slice(name).get_shape())))

            def produce(spec: TensorSpec) -> np.ndarray:
                if spec.name not in packed:
                    return f.get_tensor(spec.name).astype(np.float32)
                owner = packed[spec.name]
                if f"{owner}.{Q8_CODES}" in names:
                    return dequantize_q8({k: f.get_tensor(f"{owner}.{k}")
                                          for k in (Q8_CODES, Q8_SCALES)})
                tensors = {k: f.get_tensor(f"{owner}.{k}") for k in (CODES, SCALES, ZEROS)
                           if f"{owner}.{k}" in names}
                return dequantize_q4(tensors, spec.shape[1])

            write_shards(out, specs, produce, "f32", REFERENCE_SHARD_BYTES)

    return cached_reference_folder("tvm", artifact, [artifact / "config.json", params],
                                   read_config(artifact), ("quantization_config",), write_tensors,
                                   REFERENCE_VERSION)
