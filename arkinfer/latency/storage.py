"""How one linear weight is stored under a recipe, and its bytes — asked of the storage format.

Each registered format (`arkinfer.quant.formats`) owns its facts: `Format.nbytes` (packed size,
scales and zero points included) and `Format.shape_refusal` (its shape rules, from constraint
data alone). This module only decides float vs quantised per layer: a layer the recipe skips or
the format refuses stays in float, as `quant.export` writes it. Byte layouts: docs/quant.md §6.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arkinfer.errors import ConfigError

# Bytes per element of the float dtypes (safetensors tags and ArkInfer's short names).
FLOAT_BYTES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "F64": 8, "F32": 4, "F16": 2, "BF16": 2}
TORCH_DTYPE_NAMES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float": "f32",
                     "half": "f16"}


def format_bytes(fmt: str, out_features: int, in_features: int, *, bits: int, group_size: int,
                 sym: bool) -> int:
    """Bytes of one `[out, in]` weight packed in the registered format `fmt`."""
    from arkinfer.quant.formats import get_format

    return get_format(fmt).nbytes(out_features, in_features, bits=bits, group_size=group_size,
                                  sym=sym)


def refusal(recipe: Any, out_features: int, in_features: int) -> str | None:
    """Why the recipe's format cannot store an `[out, in]` weight (None when it can)."""
    from arkinfer.quant.formats import get_format

    return get_format(recipe.format).shape_refusal(out_features, in_features, bits=recipe.bits,
                                                   group_size=recipe.group_size)


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
