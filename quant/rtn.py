"""Uniform round-to-nearest quantiser (docs/quant.md §1): the shared primitive GPTQ/AWQ reuse.

Per row of a group `w_group` `[rows, cols]`:

    xmin = min(min(w), 0); xmax = max(max(w), 0)          # the range always contains 0
    sym:  xmax = max(|xmin|, xmax); xmin = -xmax
    scale = (xmax - xmin) / (2^bits - 1)
    zero  = 2^(bits-1) if sym else round(-xmin / scale)
    q     = clamp(round(w / scale) + zero, 0, 2^bits - 1)  # dequantised: scale * (q - zero)

`round` is torch.round (half to even), as in the GPTQ reference. Two cases §1 leaves open follow
the GPTQ reference (`IST-DASLab/gptq`, quant.py): an all-zero row gets xmin=-1, xmax=+1 (so the
scale is finite and every code equals the zero point). One deliberate difference: for sym the
reference keeps `xmin = 0` when a row has no negative value (and then clips its upper half);
§1 says `xmin = -xmax` unconditionally and that is what this module does.

`scale_dtype` (e.g. torch.float16) rounds the scale through that dtype *before* the zero point
and codes are computed, so formats storing fp16 scales (GPTQ, AWQ, Marlin, GGUF, MLX) hold the
weight without further loss.
"""

from __future__ import annotations

import torch

from .weight import UNIFORM_BITS, QuantError, QuantizedWeight


def _check_bits(bits: int) -> None:
    if bits not in UNIFORM_BITS:
        raise QuantError(f"bits={bits} is not supported by the uniform quantiser; allowed "
                         f"{UNIFORM_BITS}", "pick one of the allowed bit widths")


def find_params(w_group: torch.Tensor, bits: int, sym: bool,
                scale_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point per row of `w_group` [rows, cols] -> (scale fp32 [rows, 1],
    zero fp32 [rows, 1], integer-valued)."""
    _check_bits(bits)
    w = w_group.float()
    if w.dim() == 1:
        w = w[None]
    maxq = (1 << bits) - 1
    zero_ = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device)
    xmin = torch.minimum(w.amin(dim=1), zero_)
    xmax = torch.maximum(w.amax(dim=1), zero_)
    if sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = -xmax
    dead = (xmin == 0) & (xmax == 0)
    xmin = torch.where(dead, -1.0, xmin)
    xmax = torch.where(dead, 1.0, xmax)
    scale = (xmax - xmin) / maxq
    if scale_dtype is not None:
        tiny = torch.finfo(scale_dtype).smallest_normal
        scale = scale.to(scale_dtype).float()
        # A row of denormal-small weights can round to a zero scale: keep it positive.
        scale = torch.where(scale == 0, torch.tensor(tiny, dtype=torch.float32), scale)
    if sym:
        zero = torch.full_like(scale, float(1 << (bits - 1)))
    else:
        zero = torch.clamp(torch.round(-xmin / scale), 0, maxq)
    return scale[:, None], zero[:, None]


def quantize_with(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                  bits: int) -> torch.Tensor:
    """Codes uint8, same shape as `w`: clamp(round(w / scale) + zero, 0, 2^bits - 1).
    `scale`, `zero` broadcast against `w` (e.g. [rows, 1] for a column group)."""
    _check_bits(bits)
    q = torch.round(w.float() / scale) + zero
    return torch.clamp(q, 0, (1 << bits) - 1).to(torch.uint8)


def quantize_rtn(w: torch.Tensor, bits: int, group_size: int = 128, sym: bool = True, *,
                 scale_dtype: torch.dtype | None = None, name: str = "") -> QuantizedWeight:
    """Round-to-nearest quantisation of `w` [out, in] per row and group of `group_size` input
    columns (-1 = whole row) -> QuantizedWeight with static groups (g_idx None)."""
    _check_bits(bits)
    if w.dim() != 2:
        raise QuantError(f"weight {name!r} has shape {tuple(w.shape)}; quantize_rtn takes a 2-D "
                         "[out_features, in_features] weight", "reshape it to [out, in]")
    out, inp = w.shape
    if group_size != -1 and (group_size <= 0 or inp % group_size):
        ok = [g for g in (32, 64, 128, 256) if inp % g == 0]
        raise QuantError(f"group_size={group_size} does not divide in_features={inp} of "
                         f"{name or 'the weight'!r}", f"use -1 or one of {ok or 'its divisors'}")
    size = inp if group_size == -1 else group_size
    groups = w.float().reshape(out, inp // size, size).reshape(-1, size)
    scale, zero = find_params(groups, bits, sym, scale_dtype)
    codes = quantize_with(groups, scale, zero, bits).reshape(out, inp)
    return QuantizedWeight(codes=codes, scales=scale.reshape(out, -1),
                           zeros=zero.reshape(out, -1).to(torch.int32), bits=bits,
                           group_size=group_size, sym=sym, name=name)
