"""`arkinfer_ir::longrope_select` — LongRoPE's short/long frequency choice as one graph node.

The reference model picks the factor set in Python (`total > original_max`), which under
torch.export becomes a guard on the symbolic lengths and cannot be exported for every length.
During tracing the config's `inv_freq` returns this op instead, so the choice stays in the graph
and lowering turns it into the `long_after` / `length` attributes of the IR's rope op.
"""

from __future__ import annotations

import torch
from torch import Tensor


@torch.library.custom_op("arkinfer_ir::longrope_select", mutates_args=())
def longrope_select(short: Tensor, long: Tensor, length: int, threshold: int) -> Tensor:
    """`long` when `length > threshold`, else `short` (both [D/2] fp32); a copy, never an alias."""
    return (long if length > threshold else short).clone()


@longrope_select.register_fake
def _(short: Tensor, long: Tensor, length: int, threshold: int) -> Tensor:
    return torch.empty_like(short)
