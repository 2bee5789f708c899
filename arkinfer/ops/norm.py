"""`arkinfer::rms_norm` — RMSNorm computed in fp32 and cast back (MiniCPM4 / Llama semantics)."""

from __future__ import annotations

import torch
from torch import Tensor

from arkinfer.ops._autograd import register_recompute_autograd


def _rms_norm_impl(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x [..., H], weight [H] -> [..., H]: `x * rsqrt(mean(x²) + eps)` in fp32, cast, times weight."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))  # at least fp32
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


@torch.library.custom_op("arkinfer::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """See `_rms_norm_impl`."""
    return _rms_norm_impl(x, weight, eps)


register_recompute_autograd(rms_norm, _rms_norm_impl)


@rms_norm.register_fake
def _(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return torch.empty_like(x, dtype=torch.promote_types(x.dtype, weight.dtype))
