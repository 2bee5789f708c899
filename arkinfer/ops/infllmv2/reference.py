"""InfLLM v2 reference: the literal, slow definition of docs/infllmv2.md §2-§5.

Every step is written the way the spec states it (masked dense matrices, loops over blocks, a
stable sort for the tie-break) so it can be checked by eye; the fast CPU path (`fast.py`) and every
backend are judged against it by the conformance suite. Memory is O(T * S) (queries are processed
in chunks only to keep that bounded), so use it for tests, not for long contexts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from arkinfer.ops.infllmv2.common import (
    AttentionResult,
    CompressedKeys,
    check_keys_cover,
    n_kernels,
    run_infllmv2,
)
from arkinfer.ops.infllmv2.compress import compress_keys
from arkinfer.ops.infllmv2.config import SparseConfig

__all__ = ["block_scores", "block_sparse_attention", "compress_keys", "group_kernel_scores",
           "head_kernel_scores", "infllmv2_attention", "pool_blocks", "ranking_scores",
           "select_blocks", "topk_blocks"]

_QUERY_CHUNK = 1024  # queries per masked-dense step: bounds memory at 1024 * S scores per head


def _positions(t: int, cache_len: int, device: torch.device) -> Tensor:
    return torch.arange(cache_len, cache_len + t, device=device)


def head_kernel_scores(q: Tensor, keys: CompressedKeys, *, config: SparseConfig, scale: float,
                       cache_len: int) -> Tensor:
    """Stage 1, steps 1-2: p_h[j] = exp(scale * q_h . Kc1[j] - lse_h), lse_h over visible coarse
    kernels; 0 for invisible fine kernels and for NaN.  q [B, Hq, T, D] -> fp32 [B, Hq, T, n1].

    Fine kernel j is visible to position i iff stride*j + kernel - 1 <= i (coarse likewise).
    """
    hq, t = q.shape[1], q.shape[2]
    group = hq // keys.fine.shape[1]
    pos = _positions(t, cache_len, q.device)
    qf = q.float()
    fine = keys.fine.repeat_interleave(group, dim=1)      # [B, Hq, n1, D]
    coarse = keys.coarse.repeat_interleave(group, dim=1)  # [B, Hq, n2, D]
    n1, n2 = fine.shape[2], coarse.shape[2]
    fine_end = config.kernel_stride * torch.arange(n1) + config.kernel_size - 1
    coarse_end = config.coarse_kernel_stride * torch.arange(n2) + config.coarse_kernel_size - 1
    fine_vis = fine_end[None, :] <= pos[:, None]          # [T, n1]
    coarse_vis = coarse_end[None, :] <= pos[:, None]      # [T, n2]
    coarse_logits = scale * qf @ coarse.transpose(-1, -2)  # [B, Hq, T, n2]
    lse = torch.logsumexp(coarse_logits.masked_fill(~coarse_vis, float("-inf")), dim=-1)
    fine_logits = scale * qf @ fine.transpose(-1, -2)      # [B, Hq, T, n1]
    p = torch.exp(fine_logits - lse[..., None])
    p = torch.where(fine_vis, p, torch.zeros(()))
    return torch.nan_to_num(p, nan=0.0, posinf=float("inf"))


def group_kernel_scores(p: Tensor, hkv: int) -> Tensor:
    """Stage 1, step 3: s[g] = sum of p_h over the query heads h of group g.
    p [B, Hq, T, n1] -> [B, Hkv, T, n1]."""
    b, hq, t, n1 = p.shape
    return p.view(b, hkv, hq // hkv, t, n1).sum(dim=2)


def pool_blocks(s: Tensor, config: SparseConfig, n_blocks: int) -> Tensor:
    """Stage 1, step 4: b[blk] = max of s[j] over j in [r*blk - 1, r*blk + r - 1] ∩ [0, n1)
    (r = block_size / kernel_stride; the 5 fine kernels overlapping block blk), 0 if empty.
    s [..., n1] -> [..., n_blocks]."""
    r, n1 = config.kernels_per_block, s.shape[-1]
    out = torch.zeros(*s.shape[:-1], n_blocks, dtype=s.dtype)
    for blk in range(n_blocks):
        lo, hi = max(r * blk - 1, 0), min(r * blk + r, n1)
        if lo < hi:
            out[..., blk] = s[..., lo:hi].amax(dim=-1)
    return out


def block_scores(q: Tensor, keys: CompressedKeys, *, config: SparseConfig, scale: float,
                 cache_len: int) -> Tensor:
    """Stage 1, steps 1-4: per-group block scores, fp32 [B, Hkv, T, ceil(S / block_size)]."""
    n_blocks = -(-keys.length // config.block_size)
    p = head_kernel_scores(q, keys, config=config, scale=scale, cache_len=cache_len)
    return pool_blocks(group_kernel_scores(p, keys.fine.shape[1]), config, n_blocks)


def ranking_scores(scores: Tensor, config: SparseConfig, cache_len: int) -> Tensor:
    """Stage 1, step 5: what top-k ranks. scores [B, Hkv, T, n_blocks] -> same shape, fp32:
    forced blocks (< init_blocks, and qb - local_blocks .. qb with qb = position // block_size)
    +inf; blocks after qb -inf; a score that overflowed to +inf becomes the largest finite float
    (below the forced blocks), NaN becomes 0."""
    t, n_blocks = scores.shape[-2:]
    qb = _positions(t, cache_len, scores.device) // config.block_size          # [T]
    blk = torch.arange(n_blocks, device=scores.device)
    forced = (blk[None, :] < config.init_blocks) | (
        (blk[None, :] >= qb[:, None] - config.local_blocks) & (blk[None, :] <= qb[:, None]))
    future = blk[None, :] > qb[:, None]
    ranked = torch.nan_to_num(scores.float(), nan=0.0, posinf=torch.finfo(torch.float32).max)
    ranked = torch.where(forced, float("inf"), ranked)
    return torch.where(future, float("-inf"), ranked)


def topk_blocks(scores: Tensor, config: SparseConfig, cache_len: int) -> Tensor:
    """Stage 1, steps 5-6: force init and local blocks, pick the top `budget` blocks.

    scores [B, Hkv, T, n_blocks] -> idx int64 [B, Hkv, T, budget]: the selected blocks <= qb in
    ascending order, then -1 padding. Ranking as `ranking_scores`; ties go to the lower block.
    """
    *lead, t, n_blocks = scores.shape
    qb = _positions(t, cache_len, scores.device) // config.block_size          # [T]
    ranked = ranking_scores(scores, config, cache_len)
    order = torch.sort(ranked, dim=-1, descending=True, stable=True).indices  # lower index first
    k = min(config.budget, n_blocks)
    chosen = order[..., :k]
    chosen = torch.where(chosen > qb[:, None], torch.full_like(chosen, n_blocks), chosen)
    chosen = torch.sort(chosen, dim=-1).values
    idx = torch.full((*lead, t, config.budget), -1, dtype=torch.int64, device=scores.device)
    idx[..., :k] = torch.where(chosen == n_blocks, -1, chosen)
    return idx


def select_blocks(q: Tensor, keys: CompressedKeys, *, config: SparseConfig, scale: float,
                  cache_len: int) -> Tensor:
    """Stage 1 (§3): q [B, Hq, T, D] and the compressed cache -> idx int64 [B, Hkv, T, budget]."""
    check_keys_cover(keys, cache_len + q.shape[2])
    return topk_blocks(block_scores(q, keys, config=config, scale=scale, cache_len=cache_len),
                       config, cache_len)


def block_sparse_attention(q: Tensor, k: Tensor, v: Tensor, idx: Tensor, *,
                           config: SparseConfig, scale: float, cache_len: int) -> Tensor:
    """Stage 2 (§4) as masked dense attention: query i of group g sees key t iff t <= i and
    t // block_size is in idx[g, i].  q [B, Hq, T, D], k/v [B, Hkv, S, D], idx [B, Hkv, T, W]
    (-1 = unused) -> [B, Hq, T, D] in q.dtype, fp32 softmax."""
    b, hq, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    group = hq // hkv
    n_blocks = -(-s // config.block_size)
    key_block = torch.arange(s, device=q.device) // config.block_size
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    out = torch.empty(b, hq, t, d, dtype=torch.float32)
    for lo in range(0, t, _QUERY_CHUNK):
        hi = min(lo + _QUERY_CHUNK, t)
        # chosen[b, g, i, blk]: block blk is in idx[b, g, i]
        sel = idx[:, :, lo:hi]
        chosen = torch.zeros(b, hkv, hi - lo, n_blocks + 1, dtype=torch.bool)
        chosen.scatter_(-1, torch.where(sel < 0, n_blocks, sel), True)
        visible = chosen[..., key_block]                                        # [B, Hkv, C, S]
        causal = torch.arange(s)[None, :] <= _positions(hi - lo, cache_len + lo, q.device)[:, None]
        visible = (visible & causal).repeat_interleave(group, dim=1)           # [B, Hq, C, S]
        logits = scale * q[:, :, lo:hi].float() @ kf.transpose(-1, -2)
        probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
        out[:, :, lo:hi] = probs @ vf
    return out.to(q.dtype)


def _compress(k: Tensor, config: SparseConfig, state: CompressedKeys | None) -> CompressedKeys:
    # The reference always recompresses the whole cache: that *is* the definition the
    # incremental state of faster implementations must reproduce.
    return compress_keys(k, config)


def infllmv2_attention(q: Tensor, k: Tensor, v: Tensor, *, config: SparseConfig, scale: float,
                       cache_len: int, state: CompressedKeys | None = None,
                       q_sel: Tensor | None = None, k_sel: Tensor | None = None
                       ) -> AttentionResult:
    """InfLLM v2 attention, reference semantics (see `arkinfer.ops.infllmv2.fast` for the API
    documentation; both take and return the same things)."""
    return run_infllmv2(q, k, v, config=config, scale=scale, cache_len=cache_len, state=state,
                        q_sel=q_sel, k_sel=k_sel, compress=_compress, select=select_blocks,
                        attend=block_sparse_attention)


def expected_kernel_count(length: int, config: SparseConfig) -> tuple[int, int]:
    """(n1, n2) for `length` keys, the §2 formulas."""
    return (n_kernels(length, config.kernel_size, config.kernel_stride),
            n_kernels(length, config.coarse_kernel_size, config.coarse_kernel_stride))
