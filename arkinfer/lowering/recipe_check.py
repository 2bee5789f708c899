"""The quantisation recipe against a backend's declaration, refused before any weight is read.

    check_declared(recipe, caps, "coreml", stores="constexpr_blockwise_shift_scale",
                   hint="use --quant int4 (gptq), gptq, awq or q4_0")

Asks `Capabilities.formats`, `.bits` and `.act_order` (arkinfer/backend.py) in that order and
raises `TargetError` at the first one the recipe misses, naming the recipe, what the backend
declares and where its weights go (`stores`); `hint` says what to pick instead. What is special
to a backend (MLX's group sizes, a kernel's word alignment) stays in its own preflight.
"""

from __future__ import annotations

from typing import Any

from arkinfer.backend import Capabilities
from arkinfer.errors import TargetError


def check_declared(recipe: Any, caps: Capabilities, backend: str, *, stores: str,
                   hint: str) -> None:
    """Raise TargetError unless `caps` declares the recipe's format, code width and act-order
    (see the module docstring); nothing to check without a recipe (float builds)."""
    if recipe is None:
        return
    what = f"--quant {recipe.describe()}"
    if recipe.format not in caps.formats:
        raise TargetError(f"{what}: the {backend} backend stores {', '.join(caps.formats)} "
                          f"({stores}), not {recipe.format}", hint=hint)
    if caps.bits and int(recipe.bits) not in caps.bits:
        widths = " or ".join(f"{b}-bit" for b in caps.bits)
        raise TargetError(f"{what}: {recipe.bits}-bit codes; the {backend} backend's {stores} "
                          f"holds {widths} codes", hint=hint)
    if recipe.desc_act and not caps.act_order:
        raise TargetError(f"{what}: act-order weights (desc_act=True, a permuting g_idx) have no "
                          f"{backend} layout ({stores} groups consecutive input columns)",
                          hint="quantise with desc_act=False, or act-order over static groups "
                          "(arkinfer quantize --act-order --static-groups)")
