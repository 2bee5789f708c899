"""Target gates, checked from config.json alone before any calibration or lowering.

- The target must allow the tensorrt backend with the recipe's format (the profile's
  `[backends.tensorrt] quant_formats`).
- CUDA capability from the profile's `codegen.cuda_arch` (sm_87 on Jetson Orin): Marlin / GPTQ /
  AWQ kernels need sm_80+; FP8 needs sm_89+, so Orin takes no FP8 dtype; kernels must be built for
  the exact arch or shipped as PTX (noted with the profile's nvcc gencode list).
- Everything the ONNX lowering needs (`arkinfer/lowering/onnx_preflight.py`): the formats and
  bits the backend declares (its `Capabilities`: marlin / gptq / awq at 4 bits) and the format's
  own shape rules on every quantised linear (Marlin: in_features multiple of 128, out_features
  multiple of 64, vLLM's min_k_threads / min_n_threads).

Errors are `TargetError`s naming the first layer that fails and every layer name pattern affected.
"""

from __future__ import annotations

import re
from typing import Any

from arkinfer.backend import get_backend
from arkinfer.errors import TargetError
from arkinfer.lowering.onnx_preflight import check_lowerable

FP8_DTYPES = ("f8_e4m3", "f8_e5m2")


def capability(target: Any) -> int | None:
    """80 for sm_80, 87 for sm_87 ...; None when the profile names no CUDA arch."""
    arch = getattr(getattr(target, "codegen", None), "cuda_arch", None)
    m = re.fullmatch(r"sm_(\d+)", arch or "")
    return int(m.group(1)) if m else None


def preflight(raw_config: dict, recipe: Any, target: Any, dtype: str | None = None) -> list[str]:
    """Raise TargetError when the build cannot work on `target`; else the notes to report."""
    # the declaration from the registry: backend.py imports this module, so this one does not
    # import backend.py
    caps = get_backend("tensorrt").capabilities
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
        if fmt in caps.formats and cap < 80:
            raise TargetError(f"{fmt} kernels need sm_80+; target '{target.id}' is {arch}",
                              hint="use --quant f16 on this device")
        gencode = ", ".join(target.codegen.cuda_gencode) or f"arch=compute_{cap},code=sm_{cap}"
        notes.append(f"CUDA kernels / TensorRT plugins must be built for {arch} ({gencode}); "
                     "cubins for another arch do not load on this device")
    check_lowerable(raw_config, recipe, "tensorrt", caps)
    return notes
