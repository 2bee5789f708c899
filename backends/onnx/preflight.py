"""What the ONNX lowering can take, checked from config.json alone before any weight is read.

- Quantised linears become `arkinfer.MarlinLinear` / `arkinfer.Int4Linear` functions: formats
  marlin, gptq and awq, 4 bits, and the format's own shape rules (`Format.shape_refusal`, e.g.
  Marlin's in_features multiple of 128 and out_features multiple of 64) on every linear the
  recipe quantises.
- `sparse_config.use_nope=true` (selection on pre-RoPE q/k) has no lowering yet.

Errors are `TargetError`s naming the first layer that fails and every layer name pattern affected.
Backends built on this one (tensorrt) add their device gates.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from arkinfer import models
from arkinfer.errors import TargetError

from .weights import FUNCTION_FORMATS


def linear_shapes(raw_config: dict) -> dict[str, tuple[int, int]]:
    """Every nn.Linear of the model: name -> (out_features, in_features), from config.json."""
    config = models.parse_config(raw_config, "config.json")
    with torch.device("meta"):
        model = models.build_model(config)
    return {name: (m.out_features, m.in_features) for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear)}


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


def check_lowerable(raw_config: dict, recipe: Any, backend: str = "onnx") -> None:
    """Raise TargetError unless the ONNX lowering takes this model and recipe."""
    if recipe is not None:
        fmt = recipe.format
        if fmt not in FUNCTION_FORMATS:
            raise TargetError(f"quant format {fmt!r} has no arkinfer ONNX op in the {backend} "
                              "backend", hint="use --quant marlin, gptq or awq")
        if int(recipe.bits) != 4:
            raise TargetError(f"{fmt} with {recipe.bits} bits: the {backend} backend's linears "
                              "(MarlinLinear / Int4Linear) are 4-bit", hint="quantise with --bits 4")
        check_shapes(raw_config, recipe)
    if (raw_config.get("sparse_config") or {}).get("use_nope"):
        raise TargetError("sparse_config.use_nope=true is not supported by "
                          "arkinfer.InfLLMv2Attention yet", hint="use a config with use_nope=false")
