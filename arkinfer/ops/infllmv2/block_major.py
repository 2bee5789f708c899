"""Fast stage 2 for many queries (prefill): band by dense attention, free blocks block-major.

A query's selected blocks split into its *band* — blocks qb - local_blocks .. qb, one contiguous
key range (the forced local window, always selected) — and *free* blocks further back.

  band: per query block, one fused attention (torch's CPU flash kernel, which also returns the
      log-sum-exp) over the contiguous key range with a causal mask; a plain matmul version
      handles a hand-made idx with holes in the band.
  free: each selected block is visited once per chunk of queries, against all queries of the
      chunk that chose it (two matmuls of ~3k rows), softmax weights taken relative to the band's
      maximum so no running rescale is needed; if a free score is so far above the band that
      exp would overflow, the chunk is redone with an online (rescaling) softmax.

Scores are kept in log2 units (queries pre-multiplied by scale * log2 e) because exp2 is about
3x cheaper than exp on the CPU. Memory per chunk is O(chunk * (window + G * D)), never T x S.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from arkinfer.ops.infllmv2.config import SparseConfig

__all__ = ["LOG2E", "attend_block_major", "band_mask", "band_start", "free_blocks"]

LOG2E = 1.0 / math.log(2.0)
_FREE_CHUNK = 2048   # queries per pass over the free blocks
_PIECE_ROWS = 3072   # rows (queries x G) per free-block matmul: much larger M falls out of cache
_BAND_CHUNK = 128    # queries per band matmul in the fallback band path
_flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def band_start(qb: Tensor | int, config: SparseConfig) -> Tensor | int:
    """First block of the band (the forced local window) of a query in block qb."""
    if isinstance(qb, int):
        return max(0, qb - config.local_blocks)
    return (qb - config.local_blocks).clamp(min=0)


def band_mask(rows: Tensor, qb: Tensor, config: SparseConfig) -> Tensor | None:
    """member [C, local_blocks + 1]: is block band_start + j in the query's idx row? None when
    every band block is (always, for idx from select_blocks: the window is forced)."""
    w = config.local_blocks + 1
    first = band_start(qb, config)[:, None]
    rel = rows - first
    in_band = (rows >= 0) & (rel >= 0) & (rel < w)
    member = torch.zeros(rows.shape[0], w + 1, dtype=torch.bool)
    member.scatter_(1, torch.where(in_band, rel, w), True)
    member = member[:, :w]
    exists = first + torch.arange(w)[None, :] <= qb[:, None]
    return None if bool((member == exists).all()) else member


def free_blocks(rows: Tensor, qb: Tensor, config: SparseConfig) -> Tensor:
    """Selected blocks before the band, as a bool mask over the idx rows [C, W]."""
    return (rows >= 0) & (rows < band_start(qb, config)[:, None])


def attend_block_major(q: Tensor, scale: float, kg: Tensor, vg: Tensor, rows: Tensor,
                       pos: Tensor, config: SparseConfig, out: Tensor) -> None:
    """One KV group: q [G, C, D] (any float dtype), kg/vg [S, D] fp32, rows [C, W] idx, pos [C]
    ascending consecutive positions; writes softmax attention into out [G, C, D] (q's dtype).
    Queries are converted chunk by chunk, so memory stays O(chunk), not O(C)."""
    c = q.shape[1]
    # K' = [K, 1]: with q' = [q, -m] one matmul gives the shifted scores q.k - m directly.
    k_aug = torch.cat([kg, torch.ones(kg.shape[0], 1)], 1)
    for lo in range(0, c, _FREE_CHUNK):
        sl = slice(lo, min(c, lo + _FREE_CHUNK))
        # [C', G, D] in log2 units (scale * log2 e), so the softmax can use exp2.
        qg = q[:, sl].float().transpose(0, 1).mul(scale * LOG2E).contiguous()
        m, l, acc = _band(qg, kg, vg, rows[sl], pos[sl], config)
        if not _free_fixed_max(qg, k_aug, vg, rows[sl], pos[sl], config, m, l, acc):
            _free_online(qg, kg, vg, rows[sl], pos[sl], config, m, l, acc)
        out[:, sl] = (acc / l[..., None]).transpose(0, 1)


def _band(qg: Tensor, kg: Tensor, vg: Tensor, rows: Tensor, pos: Tensor, config: SparseConfig
          ) -> tuple[Tensor, Tensor, Tensor]:
    """Softmax state over each query's band: (max m [C, G] in log2 units, sum l [C, G] of
    2^(s - m), acc [C, G, D] = sum of 2^(s - m) v)."""
    member = band_mask(rows, pos // config.block_size, config)
    if member is None and _flash is not None:
        return _band_flash(qg, kg, vg, pos, config)
    return _band_matmul(qg, kg, vg, pos, config, member)


def _band_flash(qg: Tensor, kg: Tensor, vg: Tensor, pos: Tensor, config: SparseConfig
                ) -> tuple[Tensor, Tensor, Tensor]:
    """One fused attention call per query block; returns m = log-sum-exp, l = 1, acc = output."""
    c, group, d = qg.shape
    bs = config.block_size
    m, l, acc = torch.empty(c, group), torch.ones(c, group), torch.empty(c, group, d)
    masks: dict[tuple[int, int, int], Tensor] = {}
    lo = 0
    while lo < c:
        p_lo = int(pos[lo])
        qb = p_lo // bs
        hi = min(c, lo + (qb + 1) * bs - p_lo)          # the queries of this chunk in block qb
        n, k_lo, k_hi = hi - lo, band_start(qb, config) * bs, int(pos[hi - 1]) + 1
        key = (n, k_hi - k_lo, p_lo - k_lo)
        if key not in masks:       # causal, aligned at the last key: identical for full blocks
            visible = torch.arange(k_hi - k_lo)[None, :] <= p_lo - k_lo + torch.arange(n)[:, None]
            mask = torch.zeros(n, k_hi - k_lo).masked_fill_(~visible, float("-inf"))
            masks[key] = mask.repeat(group, 1)                   # rows are (head, query)
        q_rows = qg[lo:hi].transpose(0, 1).reshape(1, 1, group * n, d)
        o, lse = _flash(q_rows, kg[None, None, k_lo:k_hi], vg[None, None, k_lo:k_hi], 0.0,
                        False, attn_mask=masks[key], scale=math.log(2.0))
        acc[lo:hi] = o.view(group, n, d).transpose(0, 1)
        m[lo:hi] = lse.view(group, n).T * LOG2E
        lo = hi
    return m, l, acc


def _band_matmul(qg: Tensor, kg: Tensor, vg: Tensor, pos: Tensor, config: SparseConfig,
                 member: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """The band by matmuls over sub-chunks: each sub-chunk is scored against the one key range
    covering all its bands, and keys outside a query's band, after it, or (member) in a block
    its idx lacks are masked."""
    c, group, d = qg.shape
    bs = config.block_size
    first_key = band_start(pos // bs, config) * bs                           # [C]
    m, l, acc = torch.empty(c, group), torch.empty(c, group), torch.empty(c, group, d)
    for lo in range(0, c, _BAND_CHUNK):
        hi = min(c, lo + _BAND_CHUNK)
        k_lo, k_hi = int(first_key[lo]), int(pos[hi - 1]) + 1
        s = (qg[lo:hi].reshape(-1, d) @ kg[k_lo:k_hi].T).view(hi - lo, group, -1)
        keys = torch.arange(k_lo, k_hi)
        hidden = (keys[None, :] < first_key[lo:hi, None]) | (keys[None, :] > pos[lo:hi, None])
        if member is not None:
            rel = (keys[None, :] // bs - first_key[lo:hi, None] // bs).clamp(0, member.shape[1] - 1)
            hidden |= ~member[lo:hi].gather(1, rel)
        s.masked_fill_(hidden[:, None, :], float("-inf"))
        mx = s.amax(dim=-1)                                                   # [C', G]
        # A query whose band is empty (only with a hand-made idx) keeps m = -inf, l = 0.
        s.sub_(torch.where(torch.isinf(mx), 0.0, mx)[..., None]).exp2_()
        m[lo:hi], l[lo:hi] = mx, s.sum(dim=-1)
        acc[lo:hi] = (s.view(-1, s.shape[-1]) @ vg[k_lo:k_hi]).view(hi - lo, group, d)
    return m, l, acc


def _free_pairs(rows: Tensor, pos: Tensor, config: SparseConfig
                ) -> tuple[Tensor, list[int], list[int]]:
    """(query index of each (query, free block) pair, sorted by block; the distinct blocks; the
    pairs per block). Queries stay ascending within a block (stable sort)."""
    is_free = free_blocks(rows, pos // config.block_size, config)
    pair_q = torch.arange(rows.shape[0])[:, None].expand_as(rows)[is_free]
    pair_blk = rows[is_free]
    order = torch.argsort(pair_blk, stable=True)
    blocks, counts = torch.unique_consecutive(pair_blk[order], return_counts=True)
    return pair_q[order], blocks.tolist(), counts.tolist()


def _free_fixed_max(qg: Tensor, k_aug: Tensor, vg: Tensor, rows: Tensor, pos: Tensor,
                    config: SparseConfig, m: Tensor, l: Tensor, acc: Tensor) -> bool:
    """Add the free blocks to (l, acc) in place with weights 2^(s - m), m the band's maximum.

    Returns False, with (l, acc) untouched, when some query has no band (m = -inf) or a free
    score lies so far above its band that the weights overflow."""
    c, group, d = qg.shape
    bs = config.block_size
    who_all, blocks, counts = _free_pairs(rows, pos, config)
    if not blocks:
        return True
    if not bool(torch.isfinite(m).all()):
        return False
    q_aug = torch.cat([qg, -m[..., None]], dim=-1).view(c, group * (d + 1))
    l_free, acc_free = torch.zeros(c, group), torch.zeros(c, group, d)
    max_piece = max(1, _PIECE_ROWS // group)
    off = 0
    for blk, cnt in zip(blocks, counts):
        kb, vb = k_aug[blk * bs:(blk + 1) * bs].T, vg[blk * bs:(blk + 1) * bs]
        piece = -(-cnt // -(-cnt // max_piece))          # even pieces of at most max_piece
        for a in range(off, off + cnt, piece):
            who = who_all[a:min(a + piece, off + cnt)]
            n = who.numel()
            p = (q_aug.index_select(0, who).view(n * group, d + 1) @ kb).exp2_()  # [n*G, bs]
            l_free.index_add_(0, who, p.sum(-1).view(n, group))
            acc_free.index_add_(0, who, (p @ vb).view(n, group, d))
        off += cnt
    # One reduction catches inf and NaN anywhere (a false alarm needs sums near 3e38, and only
    # costs the slower path).
    if not bool(torch.isfinite(l_free.sum() + acc_free.sum())):
        return False
    l += l_free
    acc += acc_free
    return True


def _free_online(qg: Tensor, kg: Tensor, vg: Tensor, rows: Tensor, pos: Tensor,
                 config: SparseConfig, m: Tensor, l: Tensor, acc: Tensor) -> None:
    """Fold the free blocks into (m, l, acc) in place with an online softmax (running max,
    rescaling): the robust path for scores far above the band's."""
    c, group, d = qg.shape
    bs = config.block_size
    pair_q, blocks, counts = _free_pairs(rows, pos, config)
    q2 = qg.view(c, group * d)
    off = 0
    for blk, cnt in zip(blocks, counts):
        who = pair_q[off:off + cnt]
        off += cnt
        s = q2.index_select(0, who).view(cnt * group, d) @ kg[blk * bs:(blk + 1) * bs].T
        m_old = m.index_select(0, who)                                        # [cnt, G]
        m_new = torch.maximum(m_old, s.amax(dim=-1).view(cnt, group))
        s.sub_(m_new.view(-1, 1)).exp2_()
        alpha = (m_old - m_new).exp2_()                                       # 0 if m_old=-inf
        l.index_copy_(0, who, l.index_select(0, who).mul_(alpha).add_(s.sum(-1).view(cnt, group)))
        a = acc.index_select(0, who).mul_(alpha[..., None]).view(cnt * group, d)
        acc.index_copy_(0, who, torch.addmm(a, s, vg[blk * bs:(blk + 1) * bs]).view(cnt, group, d))
        m.index_copy_(0, who, m_new)
