"""Random 4-bit symmetric weights for the Marlin kernel tests (imported by the test files beside
it, as tests/import_graph.py is)."""

from __future__ import annotations

import numpy as np
from arkinfer.quant.weight import QuantizedWeight


def random_marlin_weight(rng: np.random.Generator, n: int, k: int, group_size: int,
                         scale_low: float, scale_span: float) -> QuantizedWeight:
    """[n, k] codes uniform in 0..15, zero points 8, fp16-exact scales uniform in
    [scale_low, scale_low + scale_span) per group (group_size -1: one group per row)."""
    groups = 1 if group_size == -1 else k // group_size
    codes = rng.integers(0, 16, (n, k)).astype(np.uint8)
    scales = (rng.random((n, groups)) * scale_span + scale_low).astype(np.float16).astype(np.float32)
    return QuantizedWeight(codes=codes, scales=scales, zeros=np.full((n, groups), 8, np.int32),
                           bits=4, group_size=group_size, sym=True)
