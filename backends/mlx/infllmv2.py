"""InfLLM v2 in MLX ops: the semantics of `arkinfer/ops/infllmv2/reference.py` (docs/infllmv2.md),
run by ArkInfer's MLX runtime and checked by the shared conformance suite
(tests/conformance/impls/mlx.py).

    out, state, idx = infllmv2_attention(q, k, v, config=cfg, scale=d ** -0.5,
                                         cache_len=c, state=state)

Layout as everywhere in ArkInfer: q [B, Hq, T, D] are the T new queries at absolute positions
c .. c + T - 1; k, v [B, Hkv, S, D] the whole cache including the new keys (S = c + T);
query head h belongs to KV group h // (Hq / Hkv). Returns (out [B, Hq, T, D] in q's dtype,
the compressed keys `CompressedKeys` (fp32 mx arrays) or the incoming state on a dense call,
idx int32 [B, Hkv, T, budget] or None on a dense call).

Stages, each the reference's rule in MLX:
- compression (§2): `kernel_means` sums offset by offset in one fixed order, like
  `arkinfer.ops.infllmv2.compress`, so incremental compression (the state carried in the KV cache)
  is bit-identical to recompressing the cache;
- selection (§3, §9): fp32 throughout; NaN zeroed per head *before* the group sum; top-k on an
  int64 key `(fp32 bits << 24) | (2^24 - 1 - block)`, so equal scores go to the lower block;
- attention (§4): a decode step gathers the keys of its selected blocks (or runs the Metal kernel,
  metal_kernel.py, where Metal exists); a prefill gathers, per query block, the union of the
  blocks its queries selected and masks per query. Neither builds an L x L matrix.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from arkinfer.ops.infllmv2 import compress as shared_compress
from arkinfer.ops.infllmv2.common import CompressedKeys
from arkinfer.ops.infllmv2.config import SparseConfig

__all__ = ["block_scores", "block_sparse_attention", "compress_keys", "dense_attention",
           "infllmv2_attention", "kernel_means", "select_blocks", "topk_blocks",
           "update_compressed"]

_SCORE_CHUNK = 1024      # queries per stage-1 step: bounds the [chunk, n1] score matrices
_FLT_MAX = float(np.finfo(np.float32).max)
_TIE_BITS = 24           # block ids below 2^24 (1G tokens at block size 64)


# -- §2 compression ---------------------------------------------------------------------------
def kernel_means(k: mx.array, kernel: int, stride: int, first: int, count: int) -> mx.array:
    """fp32 means of kernels first .. first + count - 1 of k [B, H, S, D] -> [B, H, count, D];
    out[..., j, :] = mean(k[..., stride*(first+j) : +kernel, :]), summed offset by offset."""
    b, h, _, d = k.shape
    if count <= 0:
        return mx.zeros((b, h, 0, d), dtype=mx.float32)
    start = stride * first
    span = stride * (count - 1) + 1
    acc = k[:, :, start:start + span:stride].astype(mx.float32)
    for off in range(1, kernel):
        acc = acc + k[:, :, start + off:start + off + span:stride].astype(mx.float32)
    return acc * (1.0 / kernel)


def compress_keys(k: mx.array, config: SparseConfig) -> CompressedKeys:
    """Fine and coarse compressed keys of the whole cache k [B, Hkv, S, D] (mx arrays)."""
    return shared_compress.compress_keys(k, config, means=kernel_means)


def update_compressed(k: mx.array, config: SparseConfig,
                      state: CompressedKeys | None = None) -> CompressedKeys:
    """`state` brought up to the cache k: only the kernels completed since state.length are
    computed (from the cache itself, which holds the tail); None, or a state longer than the
    cache (the cache was reset), compresses the whole cache."""
    if state is not None and state.length > k.shape[2]:
        state = None
    return shared_compress.update_compressed(
        k, config, state, means=kernel_means,
        cat=lambda old, new: mx.concatenate([old, new], axis=2))


# -- §3 selection ---------------------------------------------------------------------------
def _positions(t: int, cache_len: int) -> mx.array:
    return mx.arange(cache_len, cache_len + t)


def _kernel_scores(q: mx.array, keys: CompressedKeys, config: SparseConfig, scale: float,
                   cache_len: int) -> mx.array:
    """Steps 1-3: group-summed fine-kernel probabilities, fp32 [B, Hkv, T, n1]."""
    b, hq, t, d = q.shape
    hkv = keys.fine.shape[1]
    n1, n2 = keys.fine.shape[2], keys.coarse.shape[2]
    pos = _positions(t, cache_len)[:, None]
    fine_vis = (config.kernel_stride * mx.arange(n1) + config.kernel_size - 1)[None, :] <= pos
    coarse_vis = (config.coarse_kernel_stride * mx.arange(n2)
                  + config.coarse_kernel_size - 1)[None, :] <= pos
    qf = (scale * q.astype(mx.float32)).reshape(b, hkv, hq // hkv, t, d)
    fine = keys.fine[:, :, None]                                    # [B, Hkv, 1, n1, D]
    coarse = keys.coarse[:, :, None]
    coarse_logits = qf @ coarse.swapaxes(-1, -2)                    # [B, Hkv, G, T, n2]
    lse = mx.logsumexp(mx.where(coarse_vis, coarse_logits, -mx.inf), axis=-1, keepdims=True)
    p = mx.exp(qf @ fine.swapaxes(-1, -2) - lse)                    # [B, Hkv, G, T, n1]
    p = mx.where(fine_vis, p, 0.0)
    # §9: NaN (inf - inf) counts as 0 for its own head only, before the group sum.
    p = mx.where(mx.isnan(p), 0.0, p)
    return p.sum(axis=2)


def _pool_blocks(s: mx.array, config: SparseConfig, n_blocks: int) -> mx.array:
    """Step 4: b[blk] = max of s[j], j in [r*blk - 1, r*blk + r - 1] ∩ [0, n1), 0 if empty.
    s [..., n1] (all >= 0, so zero padding equals leaving entries out) -> [..., n_blocks]."""
    r, n1 = config.kernels_per_block, s.shape[-1]
    lead = s.shape[:-1]
    padded = mx.concatenate([mx.zeros((*lead, 1), s.dtype), s,
                             mx.zeros((*lead, r * n_blocks - n1), s.dtype)], axis=-1)
    body = padded[..., :r * n_blocks].reshape(*lead, n_blocks, r).max(axis=-1)
    return mx.maximum(body, padded[..., r::r])                      # the 5th kernel, r*blk + r - 1


def block_scores(q: mx.array, keys: CompressedKeys, *, config: SparseConfig, scale: float,
                 cache_len: int) -> mx.array:
    """Steps 1-4: per-group block scores, fp32 [B, Hkv, T, ceil(S / block_size)]."""
    n_blocks = -(-keys.length // config.block_size)
    t = q.shape[2]
    parts = []
    for lo in range(0, t, _SCORE_CHUNK):
        hi = min(lo + _SCORE_CHUNK, t)
        s = _kernel_scores(q[:, :, lo:hi], keys, config, scale, cache_len + lo)
        parts.append(_pool_blocks(s, config, n_blocks))
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)


def topk_blocks(scores: mx.array, config: SparseConfig, cache_len: int) -> mx.array:
    """Steps 5-6: scores [B, Hkv, T, n_blocks] -> idx int32 [B, Hkv, T, budget], the selected
    blocks <= qb ascending, then -1. Ranking exactly as `reference.ranking_scores` (forced +inf,
    future -inf, overflow -> largest float, NaN -> 0); ties to the lower block."""
    *lead, t, n_blocks = scores.shape
    qb = (_positions(t, cache_len) // config.block_size)[:, None]  # [T, 1]
    blk = mx.arange(n_blocks)[None, :]
    forced = (blk < config.init_blocks) | ((blk >= qb - config.local_blocks) & (blk <= qb))
    ranked = mx.where(mx.isnan(scores), 0.0, scores)
    ranked = mx.where(ranked == mx.inf, _FLT_MAX, ranked)
    ranked = mx.where(forced, mx.inf, ranked)
    ranked = mx.where(blk > qb, -mx.inf, ranked)
    # One integer orders by score, then by lower block: the bits of a float >= 0 order like
    # its value, -inf's are negative, and the low bits hold 2^24 - 1 - block.
    bits = mx.view(ranked.astype(mx.float32), mx.int32).astype(mx.int64)
    key = mx.left_shift(bits, _TIE_BITS) | ((1 << _TIE_BITS) - 1 - blk).astype(mx.int64)
    k = min(config.budget, n_blocks)
    chosen = mx.argpartition(-key, kth=k - 1, axis=-1)[..., :k].astype(mx.int32)
    chosen = mx.sort(mx.where(chosen > qb, n_blocks, chosen), axis=-1)
    chosen = mx.where(chosen == n_blocks, -1, chosen)
    if k < config.budget:
        chosen = mx.concatenate([chosen, mx.full((*lead, t, config.budget - k), -1, mx.int32)],
                                axis=-1)
    return chosen


def select_blocks(q: mx.array, keys: CompressedKeys, *, config: SparseConfig, scale: float,
                  cache_len: int) -> mx.array:
    """Stage 1 (§3): q [B, Hq, T, D] and the compressed cache -> idx int32 [B, Hkv, T, budget]."""
    if keys.length != cache_len + q.shape[2]:
        raise ValueError(f"compressed keys cover {keys.length} keys, but the queries attend to a "
                         f"cache of {cache_len + q.shape[2]}; update the state first")
    return topk_blocks(block_scores(q, keys, config=config, scale=scale, cache_len=cache_len),
                       config, cache_len)


# -- §4 attention -----------------------------------------------------------------------------
def dense_attention(q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array:
    """Causal GQA attention in fp32 (queries are the last T positions) -> q's dtype."""
    mask = "causal" if q.shape[2] > 1 else None
    out = mx.fast.scaled_dot_product_attention(q.astype(mx.float32), k.astype(mx.float32),
                                               v.astype(mx.float32), scale=scale, mask=mask)
    return out.astype(q.dtype)


def _gather_decode(q: mx.array, k: mx.array, v: mx.array, idx: mx.array, config: SparseConfig,
                   scale: float, cache_len: int) -> mx.array:
    """One query per row (T small): gather the keys of each (batch, group, query)'s own blocks.
    -> fp32 [B, Hq, T, D]."""
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    bs = config.block_size
    keys = (idx[..., None] * bs + mx.arange(bs)).reshape(b, hkv, t, -1)   # [B, Hkv, T, W*bs]
    pos = _positions(t, cache_len)[:, None]
    visible = (keys >= 0) & (keys <= pos)                                # idx -1 -> keys < 0
    flat = mx.where(visible, keys, 0).reshape(b, hkv, -1, 1)
    kg = mx.take_along_axis(k, flat, axis=2).reshape(b, hkv, t, -1, d).astype(mx.float32)
    vg = mx.take_along_axis(v, flat, axis=2).reshape(b, hkv, t, -1, d).astype(mx.float32)
    qg = (scale * q.astype(mx.float32)).reshape(b, hkv, hq // hkv, t, d).swapaxes(2, 3)
    logits = qg @ kg.swapaxes(-1, -2)                                    # [B, Hkv, T, G, N]
    logits = mx.where(visible[:, :, :, None], logits, -mx.inf)
    out = mx.softmax(logits, axis=-1, precise=True) @ vg                 # [B, Hkv, T, G, D]
    return out.swapaxes(2, 3).reshape(b, hq, t, d)


def _union_chunk(q: mx.array, k: mx.array, v: mx.array, idx: mx.array, config: SparseConfig,
                 scale: float, cache_len: int) -> mx.array:
    """A chunk of queries: gather the union of the blocks any of its rows selected, mask each
    query to its own blocks and the causal limit. -> fp32 [B, Hq, C, D]."""
    b, hq, c, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    bs = config.block_size
    idx_np = np.asarray(idx)
    union = np.unique(idx_np[idx_np >= 0]).astype(np.int32)             # host: the chunk's blocks
    chosen = (idx[..., None] == mx.array(union)).any(axis=-2)           # [B, Hkv, C, U]
    keys = (union[:, None] * bs + np.arange(bs)).reshape(-1)
    keys = keys[keys < s]                                               # a partial last block
    keys_mx = mx.array(keys.astype(np.int32))
    local = mx.array((np.searchsorted(union, keys // bs)).astype(np.int32))
    pos = _positions(c, cache_len)[:, None]
    visible = mx.take(chosen, local, axis=-1) & (keys_mx[None, :] <= pos)  # [B, Hkv, C, N]
    kg = mx.take(k, keys_mx, axis=2).astype(mx.float32)                 # [B, Hkv, N, D]
    vg = mx.take(v, keys_mx, axis=2).astype(mx.float32)
    qg = (scale * q.astype(mx.float32)).reshape(b, hkv, hq // hkv, c, d)
    logits = qg @ kg[:, :, None].swapaxes(-1, -2)                       # [B, Hkv, G, C, N]
    logits = mx.where(visible[:, :, None], logits, -mx.inf)
    probs = mx.softmax(logits, axis=-1, precise=True)
    return (probs @ vg[:, :, None]).reshape(b, hq, c, d)


def block_sparse_attention(q: mx.array, k: mx.array, v: mx.array, idx: mx.array, *,
                           config: SparseConfig, scale: float, cache_len: int) -> mx.array:
    """Stage 2 (§4): query i of group g sees key t iff t <= i and t // block_size is in
    idx[g, i]. q [B, Hq, T, D], k/v [B, Hkv, S, D], idx int [B, Hkv, T, W] (-1 unused)
    -> [B, Hq, T, D] in q's dtype, fp32 softmax."""
    t = q.shape[2]
    idx = idx.astype(mx.int32)
    if t == 1:
        from .metal_kernel import block_sparse_decode, metal_available

        if metal_available():
            return block_sparse_decode(q, k, v, idx, scale=scale, block_size=config.block_size,
                                       cache_len=cache_len).astype(q.dtype)
        return _gather_decode(q, k, v, idx, config, scale, cache_len).astype(q.dtype)
    # Chunks aligned to query blocks: the queries of one block share their forced window, so
    # the union of their selections stays close to one query's.
    bs = config.block_size
    outs, lo = [], 0
    while lo < t:
        hi = min(t, lo + bs - (cache_len + lo) % bs)
        outs.append(_union_chunk(q[:, :, lo:hi], k, v, idx[:, :, lo:hi], config, scale,
                                 cache_len + lo))
        lo = hi
    return mx.concatenate(outs, axis=2).astype(q.dtype)


# -- the InfLLM v2 forward ------------------------------------------------------------------
def _check(q: mx.array, k: mx.array, v: mx.array, cache_len: int, config: SparseConfig,
           q_sel: mx.array | None, k_sel: mx.array | None) -> None:
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
        raise ValueError(f"q, k, v must be [B, H, T, D] with k and v alike; got {q.shape}, "
                         f"{k.shape}, {v.shape}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] or q.shape[3] != k.shape[3]:
        raise ValueError(f"query heads {q.shape[1]} must be a multiple of KV heads {k.shape[1]} "
                         "with the same head_dim")
    if cache_len < 0 or k.shape[2] != cache_len + q.shape[2]:
        raise ValueError(f"k/v hold {k.shape[2]} positions but cache_len={cache_len} + "
                         f"T={q.shape[2]}; pass the whole cache including the new keys")
    if (q_sel is None) != (k_sel is None):
        raise ValueError("pass q_sel and k_sel together (the pre-RoPE queries and keys)")
    if config.use_nope and q_sel is None and not config.is_dense(k.shape[2]):
        raise ValueError("sparse_config has use_nope=True: pass q_sel and k_sel, the queries "
                         "and keys before RoPE, which InfLLM v2 uses to select blocks")


def infllmv2_attention(q: mx.array, k: mx.array, v: mx.array, *, config: SparseConfig,
                       scale: float, cache_len: int, state: CompressedKeys | None = None,
                       q_sel: mx.array | None = None, k_sel: mx.array | None = None
                       ) -> tuple[mx.array, CompressedKeys | None, mx.array | None]:
    """InfLLM v2 attention (module docstring). A dense call (total < dense_len) returns the
    incoming state untouched; the first sparse call compresses the whole cache once."""
    _check(q, k, v, cache_len, config, q_sel, k_sel)
    if config.is_dense(k.shape[2]):
        return dense_attention(q, k, v, scale), state, None
    sel_q, sel_k = (q_sel, k_sel) if q_sel is not None else (q, k)
    keys = update_compressed(sel_k, config, state)
    idx = select_blocks(sel_q, keys, config=config, scale=scale, cache_len=cache_len)
    out = block_sparse_attention(q, k, v, idx, config=config, scale=scale, cache_len=cache_len)
    return out, keys, idx

