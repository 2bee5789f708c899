"""The affine bias -scale * zero, shared by the formats that store it instead of a zero point:
MLX affine (`biases`, mlx.py) and GGUF Q4_1 (`m`, gguf.py).

    bias = affine_bias(scales, zeros, "float16")   # float32 array of fp16(-scale * zero)
    check_bias_recovers_zero(qw, refuse)            # refuse(...) unless round(-bias/scale) == zero
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ..weight import QuantizedWeight

ScaleStorage = Literal["float16", "float32"]


def affine_bias(scales: np.ndarray, zeros: np.ndarray,
                scale_dtype: ScaleStorage = "float16") -> np.ndarray:
    """-scale * zero rounded to `scale_dtype`, as float32."""
    exact = -(scales.astype(np.float32) * zeros.astype(np.float32))
    return exact.astype(np.float16).astype(np.float32) if scale_dtype == "float16" else exact


def check_bias_recovers_zero(qw: QuantizedWeight, refuse) -> None:
    """The stored bias fp16(-scale * zero) must give the zero point back (it does unless the
    scale is below the fp16 normal range); `refuse(message, hint)` builds the error raised."""
    scales, zeros = qw.scales.numpy(), qw.zeros.numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        back = np.where(scales == 0, 0, np.rint(-affine_bias(scales, zeros) / scales))
    bad = (back != zeros) & ~((scales == 0) & (zeros == 0))
    if bad.any():
        o, g = np.argwhere(bad)[0]
        raise refuse(f"zero point {int(zeros[o, g])} with scale {float(scales[o, g])!r} is not "
                     "recoverable from the fp16 bias -scale * zero",
                     "use a symmetric recipe, larger scales, or pack with scale_dtype='float32'")
