"""Scales stored in a float dtype chosen at pack time (MLX's scales and biases, TVM's int4
scales): float16 (2 bytes; every scale must be exact in it) or float32 (4 bytes; always exact).

    scale_storage("float32", "mlx scales and biases")   # "float32", FormatError otherwise
    SCALE_BYTES["float16"]                               # 2
    exact_scale_dtype(scales)    # "float16" when every scale survives fp16, else "float32"
"""

from __future__ import annotations

import numpy as np

from .base import FormatError, ScaleDType

SCALE_BYTES: dict[str, int] = {"float16": 2, "float32": 4}


def scale_storage(scale_dtype: str, what: str) -> ScaleDType:
    """`scale_dtype` checked against the storage dtypes; `what` names the tensors in the error."""
    if scale_dtype not in SCALE_BYTES:
        raise FormatError(f"{what}: scale_dtype={scale_dtype!r} is not a storage dtype "
                          f"(allowed {sorted(SCALE_BYTES)})",
                          "use 'float16' (2 bytes, exact fp16 scales only) or 'float32' (exact)")
    return scale_dtype  # type: ignore[return-value]


def exact_scale_dtype(scales: np.ndarray) -> ScaleDType:
    """"float16" when every scale survives a round trip through fp16, else "float32"."""
    scales = np.asarray(scales, np.float32)
    return "float16" if np.array_equal(scales.astype(np.float16).astype(np.float32), scales) \
        else "float32"
