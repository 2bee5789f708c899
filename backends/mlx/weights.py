"""An MLX artifact's tensors as the runtime's linears and embedding (the read side of the layout
tensors.py writes; mlx-lm reads the same files).

    weights = read_weights(artifact_dir, raw_config)   # {"model.layers.0.mlp.up_proj": Linear}

Layout (mlx-lm's; the registered `mlx` format's `packed_shapes` and `shape_refusal` state its
shapes and rules): a quantised linear `<name>` is `<name>.weight` uint32 [N, K*bits/32] (first
value in the low bits), `<name>.scales` and `<name>.biases` [N, K/group_size] (fp16 or fp32),
`w = scales*q + biases` per group; `<name>.bias` (Qwen2) stays float. A linear without
`.scales` is float `<name>.weight` [N, K]. bits / group_size come from config.json
"quantization" (per-layer dicts override the global pair). The embedding may be quantised the
same way (mlx_lm.convert does; ArkInfer's writer keeps it float).

Loading is strict: every tensor the architecture needs, no unknown tensor, every shape right, all
problems in one CheckpointError.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from arkinfer.errors import CheckpointError
from arkinfer.frontend.safetensors_io import weight_files
from arkinfer.quant.formats.mlx import MLX

from .config import quantization_of
from .tensors import model_layout

__all__ = ["Embedding", "Linear", "read_weights"]

_MAX_LISTED = 8


@dataclass(frozen=True)
class Linear:
    """y = x @ W^T (+ bias). Quantised when `scales` is set (mx.quantized_matmul on the packed
    weight), float otherwise."""

    weight: mx.array
    scales: mx.array | None = None
    biases: mx.array | None = None
    bias: mx.array | None = None
    bits: int = 0
    group_size: int = 0

    def __call__(self, x: mx.array) -> mx.array:
        if self.scales is None:
            if self.bias is not None:
                return mx.addmm(self.bias, x, self.weight.T)
            return x @ self.weight.T
        y = mx.quantized_matmul(x, self.weight, self.scales, self.biases, transpose=True,
                                group_size=self.group_size, bits=self.bits)
        return y if self.bias is None else y + self.bias


@dataclass(frozen=True)
class Embedding:
    """Rows of the token embedding [V, H] (dequantised on the fly when quantised), and the same
    matrix as the tied output projection."""

    table: Linear

    def __call__(self, ids: mx.array) -> mx.array:
        t = self.table
        if t.scales is None:
            return t.weight[ids]
        return mx.dequantize(t.weight[ids], t.scales[ids], t.biases[ids],
                             group_size=t.group_size, bits=t.bits)

    def as_linear(self, x: mx.array) -> mx.array:
        return self.table(x)


def _load_arrays(folder: Path) -> dict[str, mx.array]:
    arrays: dict[str, mx.array] = {}
    files = [f for f in weight_files(folder) if f.suffix == ".safetensors"]
    if not files:
        raise CheckpointError(f"{folder} has no model*.safetensors",
                              hint="rebuild the artifact (arkinfer build ... --backend mlx)")
    for f in files:
        arrays.update(mx.load(str(f)))
    return arrays


def _quant_params(owner: str, raw: dict[str, Any], problems: list[str]) -> tuple[int, int]:
    q = quantization_of(raw)
    if q is None:
        problems.append(f"'{owner}' is quantised (has .scales) but config.json has no "
                        "'quantization' entry")
        return 0, 0
    bits, group, layers = q
    entry = layers.get(owner)
    if entry is False:
        problems.append(f"'{owner}' has .scales but config.json's quantization marks it float")
    if isinstance(entry, dict):
        return int(entry.get("bits", bits)), int(entry.get("group_size", group))
    return bits, group


def _linear(owner: str, shape: tuple[int, ...], arrays: dict[str, mx.array], raw: dict[str, Any],
            used: set[str], problems: list[str]) -> Linear | None:
    """The linear (or embedding table) `owner` whose float weight would be `shape` [N, K]."""
    names = {k: f"{owner}.{k}" for k in ("weight", "scales", "biases", "bias")}
    present = {k: arrays.get(n) for k, n in names.items() if n in arrays}
    used.update(names[k] for k in present)
    if "weight" not in present:
        problems.append(f"missing '{names['weight']}' {list(shape)}")
        return None
    n, k = shape
    w, bias = present["weight"], present.get("bias")
    if bias is not None and tuple(bias.shape) != (n,):
        problems.append(f"'{names['bias']}' has shape {list(bias.shape)}, expected [{n}]")
    if "scales" not in present:
        if w.dtype == mx.uint32:
            problems.append(f"missing '{owner}.scales' ('{names['weight']}' is uint32-packed)")
        elif tuple(w.shape) != (n, k):
            problems.append(f"'{names['weight']}' has shape {list(w.shape)}, expected [{n}, {k}]")
        return Linear(w, bias=bias)
    bits, group = _quant_params(owner, raw, problems)
    if not bits or not group:
        return None
    if "biases" not in present:
        problems.append(f"'{owner}' has .scales but no '{names['biases']}'")
        return None
    why = MLX.shape_refusal(n, k, bits=bits, group_size=group)
    if why is not None:
        problems.append(f"'{owner}': {why} (bits={bits}, group_size={group})")
    want = MLX.packed_shapes(n, k, bits=bits, group_size=group)
    if w.dtype != mx.uint32 or tuple(w.shape) != want["weight"]:
        problems.append(f"'{names['weight']}' is {w.dtype} {list(w.shape)}, expected uint32 "
                        f"{list(want['weight'])} ({bits}-bit packed)")
    for key in ("scales", "biases"):
        if tuple(present[key].shape) != want[key]:
            problems.append(f"'{names[key]}' has shape {list(present[key].shape)}, expected "
                            f"{list(want[key])} (group_size {group})")
    return Linear(w, present["scales"], present["biases"], bias, bits, group)


def read_weights(folder: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """{module name: Linear | Embedding | mx.array} for every tensor of the architecture:
    linears by module name (`model.layers.0.self_attn.q_proj`), the embedding as
    `model.embed_tokens`, everything else (norm weights) by tensor name."""
    expected, linears = model_layout(raw)
    arrays = _load_arrays(folder)
    out: dict[str, Any] = {}
    used: set[str] = set()
    problems: list[str] = []
    for name, shape in expected.items():
        owner = name.rpartition(".")[0]
        if owner in linears or owner == "model.embed_tokens":
            if name.endswith(".bias"):  # read with its linear (Qwen2's q/k/v biases)
                if name not in arrays:
                    problems.append(f"missing '{name}' {list(shape)}")
                continue
            layer = _linear(owner, shape, arrays, raw, used, problems)
            out[owner] = Embedding(layer) if owner == "model.embed_tokens" and layer else layer
        elif name not in arrays:
            problems.append(f"missing '{name}' {list(shape)}")
        else:
            used.add(name)
            if tuple(arrays[name].shape) != tuple(shape):
                problems.append(f"'{name}' has shape {list(arrays[name].shape)}, expected "
                                f"{list(shape)}")
            out[name] = arrays[name]
    unexpected = sorted(set(arrays) - used)
    if unexpected:
        listed = ", ".join(unexpected[:_MAX_LISTED])
        more = f" and {len(unexpected) - _MAX_LISTED} more" if len(unexpected) > _MAX_LISTED else ""
        problems.append(f"unexpected tensors {listed}{more}")
    if problems:
        listed = "; ".join(problems[:_MAX_LISTED])
        more = f"; and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
        raise CheckpointError(f"{folder} does not hold the MLX weights its config.json "
                              f"describes: {listed}{more}",
                              hint="rebuild the artifact with arkinfer build ... --backend mlx, "
                              "or check that config.json belongs to these weights")
    return out
