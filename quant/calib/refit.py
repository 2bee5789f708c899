"""Scales refitted to GPTQ's codes: the least-squares scales of GPTQ's own objective.

GPTQ picks each group's scale before its columns are rounded (static groups: from the original
weights; otherwise from the error-compensated weights when the group starts), then rounds the
columns one by one against that scale while the error feedback moves the weights the later
columns see. Once every code is fixed, the scales are no longer the best ones for them: the
objective GPTQ minimises, the layer's output error on the calibration inputs
`(w - ŵ) H (w - ŵ)ᵀ` per row (H = the damped Hessian, [in, in]), is quadratic in the row's
scales when the codes are held, since every value is `scale[g] * base[k]`:

    ŵ[k] = s[g(k)] * base[k],   base = codes - zeros (uniform) or levels[codes] (codebook)
    min_s (w - B s)ᵀ H (w - B s)  ->  (Bᵀ H B) s = Bᵀ H w,   B [in, G]: base[k] in column g(k)

one G x G solve per row (G = in / group_size). `refit_scales` solves it, rounds the scales to
the storage dtype (fp16 for every GGUF block format), and keeps a row's new scales only when its
objective is lower with them (so no row gets worse on the calibration data). Formats whose scales
are themselves quantised (K-quant super-blocks) or that carry float minimums are left as they
are; so are ternary weights.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..weight import Kind, QuantizedWeight

#: Float32 elements of the per-chunk intermediate H·B (rows x in x groups): 64 MiB, so a
#: 5632-wide layer in groups of 128 takes 16 rows at a time and a 576-wide one in groups of 32
#: 1,600 (streaming calibration keeps its peak memory to one block).
CHUNK_ELEMENTS = 16 * 1024 * 1024


def refittable(qw: QuantizedWeight, fmt=None) -> bool:
    """True when every value is `scale * base(code)` with free float scales (module docstring)."""
    if qw.kind == Kind.TERNARY or qw.mins is not None or qw.group_size == -1:
        return False
    return fmt is None or not fmt.constraints.super_block


def _base(qw: QuantizedWeight) -> Tensor:
    """[out, in] float32: the value each code stands for at scale 1 (`codes - zeros` by group,
    or `levels[codes]`), in the original column order."""
    if qw.levels is not None:
        return qw.levels[qw.codes.long()]
    groups = qw.g_idx.long() if qw.g_idx is not None else \
        torch.arange(qw.codes.shape[1], device=qw.codes.device) // qw.group_size
    return qw.codes.float() - qw.zeros.float()[:, groups]


def refit_scales(qw: QuantizedWeight, w: Tensor, h: Tensor,
                 scale_dtype: torch.dtype | None = None,
                 damp: float = 0.0) -> tuple[QuantizedWeight, float]:
    """`qw` with each row's scales replaced by the least-squares ones of `(w - ŵ) H (w - ŵ)ᵀ`
    (w [out, in] the float weight, H = h + damp · mean(diag h) · I with h [in, in] the Hessian, as
    GPTQ damps it) where that lowers the row's objective after rounding to `scale_dtype`;
    returns (weight, fraction of rows changed)."""
    out, cols = w.shape
    size = qw.group_size
    n_groups = cols // size
    order = torch.argsort(qw.g_idx.long(), stable=True) if qw.g_idx is not None else None
    base, w, h = _base(qw), w.float(), h.float()
    if damp:
        h = h + damp * h.diagonal().mean() * torch.eye(cols, device=h.device)
    if order is not None:  # act-order groups: their columns made consecutive
        base, w, h = base[:, order], w[:, order], h[order][:, order]
    h_groups = h.reshape(cols, n_groups, size)
    scales = qw.scales.clone()
    changed = 0
    chunk = max(1, CHUNK_ELEMENTS // (cols * n_groups))
    for r0 in range(0, out, chunk):
        b = base[r0:r0 + chunk].reshape(-1, n_groups, size)
        hb = torch.einsum("rgs,igs->rig", b, h_groups)  # [R, in, G]: H B per row
        m = torch.einsum("rgs,rgsh->rgh", b, hb.reshape(-1, n_groups, size, n_groups)).double()
        del hb
        v = (b * (w[r0:r0 + chunk] @ h).reshape(-1, n_groups, size)).sum(-1).double()  # [R, G]
        eye = torch.eye(n_groups, dtype=m.dtype, device=m.device) * 1e-9 * m.diagonal(dim1=1, dim2=2).mean()
        new = torch.linalg.solve(m + eye, v[..., None])[..., 0]
        if scale_dtype is not None:
            new = new.to(scale_dtype).double()
        old = scales[r0:r0 + chunk].double()

        better = (_objective(new, m, v) < _objective(old, m, v)) & (new >= 0).all(-1) & new.isfinite().all(-1)
        scales[r0:r0 + chunk][better] = new[better].float()
        changed += int(better.sum())
    refitted = QuantizedWeight(codes=qw.codes, scales=scales, zeros=qw.zeros, bits=qw.bits,
                               group_size=qw.group_size, sym=qw.sym, g_idx=qw.g_idx, name=qw.name,
                               mins=qw.mins, levels=qw.levels, kind=qw.kind)
    return refitted, changed / max(out, 1)


def _objective(s: Tensor, m: Tensor, v: Tensor) -> Tensor:
    """[R]: each row's `(w - B s)ᵀ H (w - B s)` up to its constant `w H wᵀ` (m = Bᵀ H B [R, G, G],
    v = Bᵀ H w [R, G], s [R, G])."""
    return torch.einsum("rg,rgh,rh->r", s, m, s) - 2 * (s * v).sum(-1)
