"""Ternary (BitNet b1.58 / BitCPM) post-training quantiser, docs/quant.md §5 (absmean).

Per scope (a group of `group_size` input columns of a row, a whole row, or the whole tensor):

    s = max(mean(|W_scope|), eps)      t = clamp(round(W / s), -1, 1)      W ≈ s * t

Stored canonically as `QuantizedWeight(kind="ternary", bits=2, codes = t + 1, zeros = 1)`, so the
usual `scale * (code - zero)` gives `s * t`. A tensor-wide scale is stored as `group_size=-1`
with every row's scale equal. `scale_dtype=torch.float16` rounds `s` before the trits are chosen,
which makes the weight lossless in GGUF TQ1_0 / TQ2_0 when each 256-block shares one scale
("row" or "tensor"; groups of 32/64 are not representable there).
"""

from __future__ import annotations

from typing import Literal

import torch

from .weight import Kind, QuantError, QuantizedWeight

TernaryScope = int | Literal["row", "tensor"]


def quantize_ternary(w: torch.Tensor, group_size: TernaryScope = "row", *, eps: float = 1e-5,
                     scale_dtype: torch.dtype | None = None, name: str = "") -> QuantizedWeight:
    """Absmean ternarisation of `w` [out, in]; `group_size` is an int dividing in_features,
    "row" (one scale per output row) or "tensor" (one scale for everything)."""
    if w.dim() != 2:
        raise QuantError(f"weight {name!r} has shape {tuple(w.shape)}; quantize_ternary takes a "
                         "2-D [out_features, in_features] weight", "reshape it to [out, in]")
    out, inp = w.shape
    wf = w.float()
    if group_size == "tensor":
        s = wf.abs().mean().clamp_min(eps).expand(out, 1).clone()
        stored_group = -1
    elif group_size == "row" or group_size == -1:
        s = wf.abs().mean(dim=1, keepdim=True).clamp_min(eps)
        stored_group = -1
    elif isinstance(group_size, int) and group_size > 0 and inp % group_size == 0:
        s = wf.reshape(out, inp // group_size, group_size).abs().mean(dim=2).clamp_min(eps)
        stored_group = group_size
    else:
        ok = [g for g in (32, 64, 128, 256) if inp % g == 0]
        raise QuantError(f"group_size={group_size!r} of {name or 'the weight'!r} is not a "
                         f"divisor of in_features={inp}, 'row' or 'tensor'",
                         f"use 'row', 'tensor' or one of {ok or 'its divisors'}")
    if scale_dtype is not None:
        s = s.to(scale_dtype).float()
        s = torch.where(s == 0, torch.finfo(scale_dtype).smallest_normal, s)
    size = inp if stored_group == -1 else stored_group
    per_col = s.repeat_interleave(size, dim=1)
    trits = torch.clamp(torch.round(wf / per_col), -1, 1)
    return QuantizedWeight(codes=(trits + 1).to(torch.uint8), scales=s,
                           zeros=torch.ones_like(s, dtype=torch.int32), bits=2,
                           group_size=stored_group, sym=True, kind=Kind.TERNARY, name=name)
