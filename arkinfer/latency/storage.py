"""Bytes one linear weight occupies in a storage format, scales and zero points included.

Linear weight `W` is `[N, K]` = `[out_features, in_features]`; `ng` = K / group_size (1 for a
whole-row group). The layouts are those of `arkinfer.quant.formats` (specs/quant.md §6); the test
`tests/test_latency_storage.py` checks every formula against the bytes the packer really writes.

| format       | codes                | scales            | zero points / extra                      |
|--------------|----------------------|-------------------|------------------------------------------|
| marlin       | N·K·b/8              | ng·N fp16         | none (symmetric only)                    |
| gptq         | N·K·b/8              | ng·N fp16         | qzeros ng·N·b/8 (always) + g_idx K int32 |
| awq          | N·K·b/8              | ng·N fp16         | qzeros ng·N·b/8 (always)                 |
| mlx          | N·K·b/8              | ng·N fp16         | biases ng·N fp16 (always)                |
| ternary      | N·K·2/8              | ng·N fp16         | none (ArkInfer's own ternary layout)     |
| ort          | N·K·b/8              | ng·N fp32         | N·ceil(ng·b/8) uint8 when asymmetric     |
| onnx-qdq     | ceil(N·K·b/8)        | ng·N fp32         | ceil(ng·N·b/8) uint8 when asymmetric     |
| gguf-q4_0    | N·K/32 blocks x 18 B (fp16 d + 32 nibbles)                                |
| gguf-q4_1    | N·K/32 blocks x 20 B (fp16 d, fp16 m + 32 nibbles)                        |
| gguf-q8_0    | N·K/32 blocks x 34 B (fp16 d + 32 int8)                                   |
| gguf-tq1_0   | N·K/256 blocks x 54 B (base-3 packed trits + fp16 d)                      |
| gguf-tq2_0   | N·K/256 blocks x 66 B (2-bit trits + fp16 d)                              |

A layer the format cannot take (shape rules of its `Constraints`) stays in float, as
`quant.export` writes it; `linear_storage` says which happened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arkinfer.errors import ConfigError

# Bytes per element of the float dtypes (safetensors tags and ArkInfer's short names).
FLOAT_BYTES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "F64": 8, "F32": 4, "F16": 2, "BF16": 2}
TORCH_DTYPE_NAMES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float": "f32",
                     "half": "f16"}

# gguf block types: (weights per block, bytes per block)
GGUF_BLOCKS = {"gguf-q4_0": (32, 18), "gguf-q4_1": (32, 20), "gguf-q8_0": (32, 34),
               "gguf-tq1_0": (256, 54), "gguf-tq2_0": (256, 66)}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def format_bytes(fmt: str, out_features: int, in_features: int, *, bits: int, group_size: int,
                 sym: bool) -> int:
    """Bytes of one `[out, in]` weight packed in `fmt` (see the module table)."""
    n, k = out_features, in_features
    ng = 1 if group_size == -1 else k // group_size
    codes = n * k * bits // 8
    if fmt in GGUF_BLOCKS:
        per_block, block_bytes = GGUF_BLOCKS[fmt]
        return n * (k // per_block) * block_bytes
    if fmt in ("marlin", "ternary"):
        return codes + 2 * ng * n
    if fmt == "gptq":
        return codes + ng * n * bits // 8 + 2 * ng * n + 4 * k
    if fmt == "awq":
        return codes + ng * n * bits // 8 + 2 * ng * n
    if fmt == "mlx":
        return codes + 2 * ng * n + 2 * ng * n
    if fmt == "ort":
        return codes + 4 * ng * n + (0 if sym else n * _ceil_div(ng * bits, 8))
    if fmt == "onnx-qdq":
        return _ceil_div(n * k * bits, 8) + 4 * ng * n + (0 if sym else _ceil_div(ng * n * bits, 8))
    known = sorted([*GGUF_BLOCKS, "marlin", "ternary", "gptq", "awq", "mlx", "ort", "onnx-qdq"])
    raise ConfigError(f"storage format {fmt!r} has no size formula in arkinfer.latency",
                      hint=f"known: {', '.join(known)}; add its row to latency/storage.py")


def refusal(recipe: Any, out_features: int, in_features: int) -> str | None:
    """Why the recipe's format cannot store an `[out, in]` weight (None when it can).

    Mirrors the shape rules of `Format.check` (constraint data only: values are not known here)."""
    from arkinfer.quant.formats import get_format

    c = get_format(recipe.format).constraints
    g = recipe.group_size
    if g > 0 and in_features % g:
        return f"group_size={g} does not divide in_features={in_features}"
    step_in, step_out = c.in_step(recipe.bits, g), c.out_step(recipe.bits)
    if in_features % step_in:
        return f"in_features={in_features} is not a multiple of {step_in}"
    if out_features % step_out:
        return f"out_features={out_features} is not a multiple of {step_out}"
    return None


@dataclass(frozen=True)
class Storage:
    """How one linear weight is stored: `kind` "quantised" (in `fmt`) or "float" (`fmt` is the
    dtype), its bytes, and why it stayed float when it did."""

    kind: str
    fmt: str
    nbytes: int
    reason: str | None = None


def linear_storage(name: str, out_features: int, in_features: int, recipe: Any | None,
                   float_dtype: str) -> Storage:
    """Storage of linear `name` under `recipe` (None = float build in `float_dtype`).

    Skipped layers (`recipe.skips(name)`, e.g. lm_head) and layers the format refuses keep
    `float_dtype` (the source dtype in a quantised build)."""
    float_bytes = out_features * in_features * FLOAT_BYTES[float_dtype]
    if recipe is None:
        return Storage("float", float_dtype, float_bytes)
    if recipe.skips(name):
        return Storage("float", float_dtype, float_bytes, f"skipped by the recipe ({name})")
    why = refusal(recipe, out_features, in_features)
    if why is not None:
        return Storage("float", float_dtype, float_bytes, f"{recipe.format} refuses it: {why}")
    return Storage("quantised", recipe.format,
                   format_bytes(recipe.format, out_features, in_features, bits=recipe.bits,
                                group_size=recipe.group_size, sym=recipe.sym))


def dtype_of(raw_config: dict[str, Any]) -> str:
    """The float dtype config.json's `torch_dtype` names ("bf16" for "bfloat16"); f32 if absent
    (transformers' default)."""
    name = raw_config.get("torch_dtype") or raw_config.get("dtype") or "float32"
    short = TORCH_DTYPE_NAMES.get(str(name))
    if short is None:
        raise ConfigError(f"config.json torch_dtype={name!r} is not a float dtype ArkInfer sizes",
                          hint=f"use one of {', '.join(TORCH_DTYPE_NAMES)}")
    return short
