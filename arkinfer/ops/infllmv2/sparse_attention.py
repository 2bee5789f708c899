"""Fast stage 2 (docs/infllmv2.md §4): block-sparse attention that reads only selected blocks.

Same result as `reference.block_sparse_attention` (masked dense), organised for the CPU:
  * queries whose idx holds every block up to their own see the whole causal prefix, so they run
    plain dense attention (that is every position below budget * block_size = 6144);
  * decode (a few queries): the band (forced local window, blocks qb - local_blocks .. qb) is a
    view of the cache, the other selected blocks are gathered with index_select, one softmax;
  * prefill (many queries): `block_major.attend_block_major`.
Nothing of size T x S is allocated.
"""

from __future__ import annotations

import torch
from torch import Tensor

from arkinfer.ops.infllmv2.block_major import attend_block_major, band_mask, band_start
from arkinfer.ops.infllmv2.common import dense_attention
from arkinfer.ops.infllmv2.config import SparseConfig

__all__ = ["block_sparse_attention"]

_GATHER_MAX_QUERIES = 8   # up to this many sparse queries: per-query gather (decode) path


def block_sparse_attention(q: Tensor, k: Tensor, v: Tensor, idx: Tensor, *,
                           config: SparseConfig, scale: float, cache_len: int) -> Tensor:
    """q [B, Hq, T, D] at positions cache_len.., k/v [B, Hkv, S, D], idx int64 [B, Hkv, T, W]
    (distinct blocks <= the query's own block, -1 = unused) -> [B, Hq, T, D] in q.dtype.
    Query i of group g sees key t iff t <= cache_len + i and t // block_size is in idx[g, i]."""
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    bs = config.block_size
    pos = torch.arange(cache_len, cache_len + t)
    qb = pos // bs
    # A row holding qb + 1 distinct blocks <= qb holds all of them: dense causal attention.
    full = ((idx >= 0).sum(-1) == qb + 1).flatten(0, 1).all(0)               # [T]
    t0 = t if bool(full.all()) else int((~full).nonzero()[0])
    if t0 == t:
        return dense_attention(q, k, v, scale, cache_len)
    out = torch.empty(b, hq, t, d, dtype=q.dtype)
    if t0:
        s0 = cache_len + t0
        out[:, :, :t0] = dense_attention(q[:, :, :t0], k[:, :, :s0], v[:, :, :s0], scale,
                                         cache_len)
    group = hq // hkv
    for bi in range(b):
        for g in range(hkv):
            heads = slice(g * group, (g + 1) * group)
            rows = idx[bi, g, t0:]
            if t - t0 <= _GATHER_MAX_QUERIES:
                # Decode: touch only the band and the selected blocks (no whole-cache upcast).
                qg = q[bi, heads, t0:].float().mul(scale).transpose(0, 1)           # [T', G, D]
                res = torch.stack([_attend_gather(qg[j], k[bi, g], v[bi, g], rows[j],
                                                  int(pos[t0 + j]), config)
                                   for j in range(t - t0)])
                out[bi, heads, t0:] = res.transpose(0, 1).to(q.dtype)
            else:
                attend_block_major(q[bi, heads, t0:], scale, k[bi, g].float(), v[bi, g].float(),
                                   rows, pos[t0:], config, out[bi, heads, t0:])
    return out


def _attend_gather(qg: Tensor, kg: Tensor, vg: Tensor, row: Tensor, p: int,
                   config: SparseConfig) -> Tensor:
    """One query at position p: qg [G, D] (scaled fp32), kg/vg [S, D] (cache dtype), row [W]
    -> fp32 [G, D]. Scores are kept as [keys, G]: the keys as the tall left operand of the
    matmul run ~1.3x faster than q @ K^T with only G rows."""
    bs, d = config.block_size, kg.shape[1]
    qb = p // bs
    first = band_start(qb, config)
    band_k = kg[first * bs:p + 1].float()                  # views when the cache is fp32
    band_v = vg[first * bs:p + 1].float()
    qt = qg.T                                                                # [D, G]
    scores = [band_k @ qt]                                                   # [n_band, G]
    valid = row[row >= 0]
    free = valid[valid < first]
    if valid.numel() - free.numel() != qb - first + 1:     # a hand-made idx with band holes
        member = band_mask(row[None], torch.tensor([qb]), config)[0]
        key_block = torch.arange(first * bs, p + 1) // bs - first
        scores[0] = scores[0].masked_fill(~member[key_block, None], float("-inf"))
    if free.numel():
        n_full = kg.shape[0] // bs
        free_k = kg[:n_full * bs].view(n_full, bs * d).index_select(0, free).view(-1, d).float()
        free_v = vg[:n_full * bs].view(n_full, bs * d).index_select(0, free).view(-1, d).float()
        scores.append(free_k @ qt)
    probs = torch.softmax(torch.cat(scores), dim=0)                          # [N, G]
    out = probs[:band_k.shape[0]].T @ band_v
    if free.numel():
        out += probs[band_k.shape[0]:].T @ free_v
    return out
