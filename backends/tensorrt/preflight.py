"""Target gates, checked from config.json alone before any calibration or lowering.

- The target must allow the tensorrt backend with the recipe's format (the profile's
  `[backends.tensorrt] quant_formats`).
- CUDA capability from the profile's `codegen.cuda_arch` (sm_87 on Jetson Orin): Marlin / GPTQ /
  AWQ kernels need sm_80+; FP8 needs sm_89+, so Orin takes no FP8 dtype; kernels must be built for
  the exact arch or shipped as PTX (noted with the profile's nvcc gencode list).
- The format's shape rules (`Format.shape_refusal`, e.g. Marlin's in_features multiple of 128 and
  out_features multiple of 64, vLLM's min_k_threads / min_n_threads) for every linear the recipe
  quantises; GPTQ / AWQ: 4 bits (arkinfer.Int4Linear).

Errors are `TargetError`s naming the first layer that fails and every layer name pattern affected.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from arkinfer import models
from arkinfer.errors import TargetError

FP8_DTYPES = ("f8_e4m3", "f8_e5m2")


def capability(target: Any) -> int | None:
    """80 for sm_80, 87 for sm_87 ...; None when the profile names no CUDA arch."""
    arch = getattr(getattr(target, "codegen", None), "cuda_arch", None)
    m = re.fullmatch(r"sm_(\d+)", arch or "")
    return int(m.group(1)) if m else None


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


def preflight(raw_config: dict, recipe: Any, target: Any, dtype: str | None = None) -> list[str]:
    """Raise TargetError when the build cannot work on `target`; else the notes to report."""
    notes: list[str] = []
    fmt = recipe.format if recipe is not None else None
    if target is not None:
        target.check("tensorrt", fmt, None)
    cap = capability(target)
    if cap is not None:
        arch = f"sm_{cap}"
        if dtype in FP8_DTYPES and cap < 89:
            raise TargetError(f"dtype {dtype} needs FP8 tensor cores (sm_89+); target "
                              f"'{target.id}' is {arch}", hint="build with --dtype f16 or bf16")
        if fmt in ("marlin", "gptq", "awq") and cap < 80:
            raise TargetError(f"{fmt} kernels need sm_80+; target '{target.id}' is {arch}",
                              hint="use --quant f16 on this device")
        gencode = ", ".join(target.codegen.cuda_gencode) or f"arch=compute_{cap},code=sm_{cap}"
        notes.append(f"CUDA kernels / TensorRT plugins must be built for {arch} ({gencode}); "
                     "cubins for another arch do not load on this device")
    if recipe is not None:
        if fmt not in ("marlin", "gptq", "awq"):
            raise TargetError(f"quant format {fmt!r} has no arkinfer ONNX op in the tensorrt "
                              "backend", hint="use --quant marlin, gptq or awq")
        if int(recipe.bits) != 4:
            raise TargetError(f"{fmt} with {recipe.bits} bits: the tensorrt backend's linears "
                              "(MarlinLinear / Int4Linear) are 4-bit", hint="quantise with --bits 4")
        check_shapes(raw_config, recipe)
    if (raw_config.get("sparse_config") or {}).get("use_nope"):
        raise TargetError("sparse_config.use_nope=true is not supported by "
                          "arkinfer.InfLLMv2Attention yet", hint="use a config with use_nope=false")
    return notes
