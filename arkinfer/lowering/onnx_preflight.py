"""What the ONNX lowering can take, checked from config.json alone before any weight is read.
Shared by the backends that write the ONNX graph: onnx, and tensorrt (which adds its device
gates: backends/tensorrt/preflight.py).

    check_lowerable(raw_config, recipe, "onnx", caps)   # TargetError, or None

- Quantised linears become `arkinfer.MarlinLinear` / `arkinfer.Int4Linear` functions: the
  formats and bits the backend declares (`Capabilities`: marlin, gptq and awq at 4 bits), and
  the format's own shape rules (`Format.shape_refusal`, e.g. Marlin's in_features multiple of
  128 and out_features multiple of 64) on every linear the recipe quantises.
- `sparse_config.use_nope=true` (selection on pre-RoPE q/k) has no lowering yet.

Errors are `TargetError`s naming the first layer that fails and every layer name pattern affected.
"""

from __future__ import annotations

import re
from typing import Any

from arkinfer.backend import Capabilities
from arkinfer.errors import TargetError
from arkinfer.lowering.linears import linear_shapes


def check_shapes(raw_config: dict, recipe: Any) -> None:
    """Raise TargetError naming the layers a recipe's format cannot take (the format's own
    `shape_refusal`: for Marlin in_features % 128, out_features % 64, group size)."""
    from arkinfer.quant.formats import get_format

    fmt = get_format(recipe.format)
    bad: list[tuple[str, str]] = []
    for name, (out, inp) in linear_shapes(raw_config).items():
        if recipe.skips(name):
            continue
        why = fmt.shape_refusal(out, inp, bits=recipe.bits, group_size=int(recipe.group_size))
        if why is not None:
            bad.append((f"{name} [{out}x{inp}]", why))
    if bad:
        pattern = sorted({re.sub(r"\.\d+\.", ".*.", layer.split(" ")[0]) for layer, _ in bad})
        raise TargetError(f"{fmt.name} cannot take layer '{bad[0][0]}': {bad[0][1]} "
                          f"({len(bad)} layers fail: {', '.join(pattern)})",
                          hint="pick --quant gptq or awq with a group size dividing the rows "
                          "(e.g. 64 or 32), or skip those layers in the recipe")


def check_lowerable(raw_config: dict, recipe: Any, backend: str,
                    caps: Capabilities) -> None:
    """Raise TargetError unless the ONNX lowering takes this model and recipe (`caps`: the
    declaration of `backend`, onnx or one built on it)."""
    if recipe is not None:
        fmt = recipe.format
        if fmt not in caps.formats:
            raise TargetError(f"quant format {fmt!r} has no arkinfer ONNX op in the {backend} "
                              "backend", hint=f"use --quant {', '.join(caps.formats)}")
        if int(recipe.bits) not in caps.bits:
            bits = " or ".join(map(str, caps.bits))
            raise TargetError(f"{fmt} with {recipe.bits} bits: the {backend} backend's linears "
                              f"(MarlinLinear / Int4Linear) are {bits}-bit",
                              hint=f"quantise with --bits {caps.bits[0]}")
        check_shapes(raw_config, recipe)
    if (raw_config.get("sparse_config") or {}).get("use_nope"):
        raise TargetError("sparse_config.use_nope=true is not supported by "
                          "arkinfer.InfLLMv2Attention yet", hint="use a config with use_nope=false")
