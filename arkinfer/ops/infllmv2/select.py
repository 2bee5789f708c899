"""Fast stage 1 (docs/infllmv2.md §3): block selection in query chunks.

Same arithmetic as `reference.select_blocks`, organised for speed and bounded memory:
  * queries below budget * block_size see every past block, so their idx is written directly;
  * the rest are scored in chunks whose [Hq, C, n1] score tensor stays under `_CHUNK_ELEMENTS`
    (scores against compressed keys are T x S/16 in total, never materialised at once);
  * the tie-break (lower block index first) is made exact with one int64 top-k: the float bits of
    a non-negative score are monotone, so (bits << 24) | (2^24 - 1 - block) orders by score, then
    by lower block, with no ties left to chance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from arkinfer.ops.infllmv2.common import CompressedKeys, check_keys_cover, n_kernels
from arkinfer.ops.infllmv2.config import SparseConfig
from arkinfer.ops.infllmv2.decode import decode_idx, decode_select

__all__ = ["select_blocks"]

_CHUNK_ELEMENTS = 1 << 23   # fp32 elements of the per-chunk fine-score tensor (32 MiB)
_BLOCK_BITS = 24            # block ids below 2^24 (1G tokens at block_size 64)
_BLOCK_MASK = (1 << _BLOCK_BITS) - 1
_FLT_MAX = torch.finfo(torch.float32).max
_FORCED_KEY = 0x7F800000 << _BLOCK_BITS  # the bits of +inf: above every clamped finite score
_LOG2E = 1.4426950408889634


def select_blocks(q: Tensor, keys: CompressedKeys, *, config: SparseConfig, scale: float,
                  cache_len: int) -> Tensor:
    """q [B, Hq, T, D] at positions cache_len .. cache_len + T - 1 and the compressed keys of the
    whole cache (keys.length == cache_len + T) -> idx int64 [B, Hkv, T, budget]: the selected
    blocks in ascending order, then -1 padding."""
    b, hq, t, _ = q.shape
    check_keys_cover(keys, cache_len + t)
    hkv = keys.fine.shape[1]
    budget, bs = config.budget, config.block_size
    pos = torch.arange(cache_len, cache_len + t)
    qb = pos // bs
    idx = torch.empty(b, hkv, t, budget, dtype=torch.int64)
    # Positions below budget * block_size have at most `budget` blocks: all of them are selected.
    t_full = max(0, min(t, config.full_visibility_len - cache_len))
    if t_full:
        slots = torch.arange(budget)
        idx[:, :, :t_full] = torch.where(slots <= qb[:t_full, None], slots, -1)
    if t_full == t:
        return idx
    if t - t_full == 1:      # decode: the last query sees every cached key
        p = cache_len + t_full
        far = decode_select(q[:, :, t_full:], keys, config=config, scale=scale, cache_len=p)
        idx[:, :, t_full:] = decode_idx(far, config, p, b)
        return idx
    # Many queries: pad the kernel axis to a multiple of 16 (sgemm runs ~30% slower on odd
    # widths) and append a ones column to the fine keys, so that with q' = [q, -lse] one matmul
    # yields the shifted logits q.k - lse.
    fine = _pad_rows(torch.cat([keys.fine, torch.ones(*keys.fine.shape[:-1], 1)], dim=-1))
    coarse = _pad_rows(keys.coarse)
    chunk = max(1, min(t - t_full, _CHUNK_ELEMENTS // max(1, b * hq * fine.shape[2])))
    for lo in range(t_full, t, chunk):
        hi = min(t, lo + chunk)
        s = _kernel_scores_chunk(q[:, :, lo:hi], fine, coarse, config, scale, cache_len + lo)
        idx[:, :, lo:hi] = _pool_topk(s, config, pos[lo:hi])
    return idx


def _pad_rows(x: Tensor) -> Tensor:
    """Zero-pad dim 2 (kernels) of [B, H, n, D] to a multiple of 16."""
    return F.pad(x, (0, 0, 0, -x.shape[2] % 16))


def _kernel_scores_chunk(q: Tensor, fine: Tensor, coarse: Tensor, config: SparseConfig,
                         scale: float, first_pos: int) -> Tensor:
    """Queries at positions first_pos .. first_pos + C - 1 -> s [B, Hkv, C, n1] (kernels after
    the last query's visibility dropped). fine [B, Hkv, >= n1, D + 1] (ones column appended),
    coarse [B, Hkv, >= n2, D], both zero-padded to a multiple of 16 kernels."""
    b, hq, c, d = q.shape
    hkv = fine.shape[1]
    group = hq // hkv
    pos = torch.arange(first_pos, first_pos + c)
    last = first_pos + c - 1
    # Only kernels complete by the chunk's last position can be visible to any of its queries;
    # columns past each query's own count (padding included) are masked below.
    n1 = n_kernels(last + 1, config.kernel_size, config.kernel_stride)
    n2 = n_kernels(last + 1, config.coarse_kernel_size, config.coarse_kernel_stride)
    n1p, n2p = min(-(-n1 // 16) * 16, fine.shape[2]), min(-(-n2 // 16) * 16, coarse.shape[2])
    # [B, Hkv, G*C, D] so each KV head's compressed keys are one (transposed, uncopied) operand.
    qf = (q.float() * scale).reshape(b, hkv, group * c, d)

    # Coarse normaliser over the coarse kernels visible to each query (complete at its position).
    coarse_logits = (qf @ coarse[:, :, :n2p].transpose(-1, -2)).view(b, hkv, group, c, n2p)
    _mask_tail(coarse_logits, pos, config.coarse_kernel_size, config.coarse_kernel_stride,
               float("-inf"))
    lse = torch.logsumexp(coarse_logits, dim=-1, keepdim=True)
    del coarse_logits
    # exp(x - lse) as exp2((x - lse) * log2 e): the same value, ~3x cheaper on the CPU.
    shift = (lse * -_LOG2E).view(b, hkv, group * c, 1)
    p = torch.cat([qf * _LOG2E, shift], dim=-1) @ fine[:, :, :n1p].transpose(-1, -2)
    p = p.view(b, hkv, group, c, n1p).exp2_()
    _mask_tail(p, pos, config.kernel_size, config.kernel_stride, 0.0)
    # NaN (inf - inf) counts as 0 per head, before the group sum, as in the reference.
    torch.nan_to_num_(p, nan=0.0, posinf=float("inf"))
    s = p.sum(dim=2)                                          # [B, Hkv, C, n1p]: sum over the group
    del p
    return s[..., :n1]


def _pool_topk(s: Tensor, config: SparseConfig, pos: Tensor) -> Tensor:
    """Kernel scores s [B, Hkv, C, n] (n <= n1; missing kernels count as 0) of the queries at
    positions pos [C] -> idx [B, Hkv, C, budget]."""
    b, hkv, c, n1 = s.shape
    # Kernel -> block max-pool: block blk takes kernels [r*blk - 1, r*blk + r - 1]. Zero-pad to
    # r * n_blocks - 1 kernels (scores are >= 0, so a zero equals an absent kernel).
    r = config.kernels_per_block
    n_blocks = int(pos[-1]) // config.block_size + 1
    width = max(n1, r * n_blocks - 1)
    s = F.pad(s, (0, width - n1))
    pooled = F.max_pool1d(s.reshape(-1, 1, width), r + 1, r, padding=1)[..., :n_blocks]
    return _topk_blocks(pooled.reshape(b, hkv, c, n_blocks), config, pos)


def _mask_tail(x: Tensor, pos: Tensor, kernel: int, stride: int, fill: float) -> None:
    """In place: x[..., i, j] = fill where kernel j is not complete at position pos[i]
    (x [..., C, n]); only columns past the first query's visible count are touched."""
    n = x.shape[-1]
    first = n_kernels(int(pos[0]) + 1, kernel, stride)
    if first >= n:
        return
    visible = ((pos + 1 - kernel) // stride + 1).clamp_(min=0)                     # [C]
    cols = torch.arange(first, n)
    hidden = cols[None, :] >= visible[:, None]                                     # [C, n-first]
    x[..., first:].masked_fill_(hidden, fill)


def _topk_blocks(scores: Tensor, config: SparseConfig, pos: Tensor) -> Tensor:
    """scores fp32 [B, Hkv, C, n_blocks] >= 0 -> idx [B, Hkv, C, budget] (forced blocks first,
    then highest score, ties to the lower block; blocks after the query's own become -1)."""
    n_blocks = scores.shape[-1]
    budget = config.budget
    qb = (pos // config.block_size)[:, None]                 # [C, 1]
    blk = torch.arange(n_blocks)[None, :]                    # [1, n_blocks]
    forced = (blk < config.init_blocks) | ((blk >= qb - config.local_blocks) & (blk <= qb))
    tie = _BLOCK_MASK - blk                                  # lower block -> larger key
    # +inf (an overflowed exp) ranks as the largest finite score; an empty pool window (-inf) as 0.
    bits = scores.clamp_(0.0, _FLT_MAX).view(torch.int32).to(torch.int64)
    key = (bits << _BLOCK_BITS) | tie
    key = torch.where(forced, _FORCED_KEY | tie, key)
    key = key.masked_fill_(blk > qb, -1)
    k = min(budget, n_blocks)
    top = key.topk(k, dim=-1, sorted=False).values
    # Unused slots (-1 keys) sort last via a sentinel, then read back as -1.
    chosen = torch.where(top >= 0, _BLOCK_MASK - (top & _BLOCK_MASK), _BLOCK_MASK + 1)
    chosen = chosen.sort(dim=-1).values
    chosen.masked_fill_(chosen > _BLOCK_MASK, -1)
    if k == budget:
        return chosen
    return F.pad(chosen, (0, budget - k), value=-1)
