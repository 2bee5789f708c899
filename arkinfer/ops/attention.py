"""`arkinfer::attention` — causal GQA attention over a KV cache (dense).

Queries are the last T positions of the S cached keys: query i sits at absolute position
S - T + i and sees keys t <= S - T + i. InfLLM v2 sparse attention plugs in beside this op with
its sparse_config (arkinfer.ops.infllmv2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from arkinfer.ops._autograd import register_recompute_autograd


def _attention_impl(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """q [B, Hq, T, D], k/v [B, Hkv, S, D] (S >= T, Hq % Hkv == 0) -> [B, Hq, T, D]; fp32 softmax."""
    t, s = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    qf, kf, vf = q.float(), k.float(), v.float()
    if t == 1:
        out = F.scaled_dot_product_attention(qf, kf, vf, scale=scale)
    elif t == s:
        out = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True, scale=scale)
    else:
        rows = torch.arange(s - t, s, device=q.device)[:, None]
        mask = torch.arange(s, device=q.device)[None, :] <= rows
        out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, scale=scale)
    return out.to(q.dtype)


@torch.library.custom_op("arkinfer::attention", mutates_args=())
def attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """See `_attention_impl`."""
    return _attention_impl(q, k, v, scale)


register_recompute_autograd(attention, _attention_impl)


@attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    return torch.empty_like(q)
