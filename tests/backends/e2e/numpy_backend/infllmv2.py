"""The `numpy` test backend's own InfLLM v2 operator (docs/infllmv2.md §2-§5), in numpy.

    out, keys, idx = infllmv2_attention(q, k, v, config=cfg, scale=d ** -0.5, cache_len=c)

Layout as everywhere in ArkInfer: q [B, Hq, T, D] holds the T new queries at absolute positions
cache_len .. cache_len + T - 1; k, v [B, Hkv, S, D] the whole cache including the new keys
(S = cache_len + T); query head h belongs to KV group h // (Hq // Hkv). Inputs are float arrays
(fp16 / fp32; a caller holding bf16 widens it to fp32, which is exact); everything is computed
in fp32 and `out` is fp32 — rounding it to the caller's dtype is the caller's step.

It is written from the spec, beside arkinfer/ops/infllmv2/reference.py (which the conformance
suite holds it to), and never builds an S x S or T x S matrix: queries run in chunks, and stage 2
gathers each query's selected blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arkinfer.ops.infllmv2.config import SparseConfig

F32_MAX = np.float32(np.finfo(np.float32).max)
_SCORE_QUERIES = 256      # queries per stage-1 / dense step: [Hq, 256, n1 | S] scores at a time
_GATHER_KEYS = 1 << 16    # gathered key rows per stage-2 step: 16 MiB of fp32 K at D = 64


@dataclass(frozen=True)
class Keys:
    """Compressed keys of the first `length` cached keys (the decode state).

    fine:   fp32 [B, Hkv, n1, D], fine[..., j, :] = mean(K[kernel_stride*j : +kernel_size])
    coarse: fp32 [B, Hkv, n2, D], the same with the 4x coarse kernel and stride
    """

    fine: np.ndarray
    coarse: np.ndarray
    length: int


# -- §2 key compression -----------------------------------------------------------------------
def n_kernels(length: int, kernel: int, stride: int) -> int:
    """Complete kernels in `length` keys: floor((L - kernel) / stride) + 1, 0 if L < kernel."""
    return 0 if length < kernel else (length - kernel) // stride + 1


def kernel_means(k: np.ndarray, kernel: int, stride: int, first: int, count: int) -> np.ndarray:
    """Kernels first .. first + count - 1 of k [B, H, S, D] -> fp32 [B, H, count, D].

    Summed offset by offset, then times 1/kernel: one order whatever `first` is, so a kernel
    computed alone in a decode step has the bits of the same kernel in a full compression."""
    if count <= 0:
        return np.zeros((*k.shape[:2], 0, k.shape[3]), np.float32)
    start, span = stride * first, stride * (count - 1) + 1
    acc = k[:, :, start:start + span:stride].astype(np.float32)
    for off in range(1, kernel):
        acc += k[:, :, start + off:start + off + span:stride]
    return acc * np.float32(1.0 / kernel)


def update_keys(k: np.ndarray, config: SparseConfig, state: Keys | None) -> Keys:
    """The compressed keys of the whole cache k [B, Hkv, S, D]: the state's kernels kept, only
    the kernels the new keys complete computed (a state that does not fit k: recompress all)."""
    b, h, s, d = k.shape
    if state is None or state.length > s or state.fine.shape[:2] != (b, h) or \
            state.fine.shape[3] != d:
        empty = np.zeros((b, h, 0, d), np.float32)
        state = Keys(empty, empty, 0)
    parts = []
    for have, kernel, stride in ((state.fine, config.kernel_size, config.kernel_stride),
                                 (state.coarse, config.coarse_kernel_size,
                                  config.coarse_kernel_stride)):
        n, old = n_kernels(s, kernel, stride), have.shape[2]
        # The state is copied when a kernel completes (every kernel_stride keys): O(cache), but
        # simple; ArkInfer's own op appends into spare room instead (compress.KernelRoom).
        parts.append(np.concatenate([have, kernel_means(k, kernel, stride, old, n - old)], 2)
                     if n > old else have)
    return Keys(parts[0], parts[1], s)


# -- §3 stage 1: block selection -----------------------------------------------------------------
def _logsumexp(x: np.ndarray) -> np.ndarray:
    """log(sum(exp(x))) over the last axis as torch.logsumexp: shift by the max unless it is
    infinite; no element, or all -inf: -inf."""
    if x.shape[-1] == 0:
        return np.full(x.shape[:-1], -np.inf, np.float32)
    top = x.max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, np.float32(0))
    return (np.log(np.exp(x - top).sum(-1, keepdims=True)) + top)[..., 0]


def kernel_scores(q: np.ndarray, keys: Keys, pos: np.ndarray, config: SparseConfig,
                  scale: float) -> np.ndarray:
    """Steps 1-3: q [B, Hq, C, D] at positions pos [C] -> group scores fp32 [B, Hkv, C, n1],
    s = sum over the group's heads of exp(scale q.Kc1 - lse), lse over the visible coarse
    kernels; 0 for invisible kernels and for NaN (per head, before the sum: §9)."""
    b, hq, c, d = q.shape
    hkv, n1, n2 = keys.fine.shape[1], keys.fine.shape[2], keys.coarse.shape[2]
    qg = (np.float32(scale) * q).reshape(b, hkv, hq // hkv * c, d)           # group-major rows
    fine_end = config.kernel_stride * np.arange(n1) + config.kernel_size - 1
    coarse_end = config.coarse_kernel_stride * np.arange(n2) + config.coarse_kernel_size - 1
    # np.einsum's own loops (optimize=False), not BLAS: every score sums its D products in one
    # order, so equal keys give equal scores wherever they sit (a BLAS kernel's edge tiles round
    # differently on some CPUs, AVX2 OpenBLAS among them, which breaks exact ties: §9)
    coarse = np.einsum("bhrd,bhnd->bhrn", qg, keys.coarse, optimize=False
                       ).reshape(b, hkv, -1, c, n2)
    coarse = np.where(coarse_end[None, :] <= pos[:, None], coarse, np.float32(-np.inf))
    lse = _logsumexp(coarse)                                                  # [B,Hkv,G,C]
    fine = np.einsum("bhrd,bhnd->bhrn", qg, keys.fine, optimize=False).reshape(b, hkv, -1, c, n1)
    p = np.exp(fine - lse[..., None])
    p = np.where(fine_end[None, :] <= pos[:, None], p, np.float32(0))
    return np.nan_to_num(p, nan=0.0, posinf=np.inf).sum(2, dtype=np.float32)


def pool_blocks(s: np.ndarray, config: SparseConfig, n_blocks: int) -> np.ndarray:
    """Step 4: s [..., n1] -> [..., n_blocks], block blk = max of s over the kernels
    r*blk - 1 .. r*blk + r - 1 that exist (r = kernels_per_block), 0 if none. Scores are >= 0,
    so zero padding (one in front, the rest behind) never changes a max."""
    r, n1 = config.kernels_per_block, s.shape[-1]
    pad = [(0, 0)] * (s.ndim - 1) + [(1, r * n_blocks - n1)]
    padded = np.pad(s, pad)                                   # padded[j + 1] = s[j]
    head = padded[..., :r * n_blocks].reshape(*s.shape[:-1], n_blocks, r).max(-1)
    return np.maximum(head, padded[..., r::r])


def ranking_scores(scores: np.ndarray, config: SparseConfig, pos: np.ndarray) -> np.ndarray:
    """Step 5: forced blocks (< init_blocks, qb - local_blocks .. qb) +inf, future blocks -inf,
    an overflowed score the largest float, NaN 0. scores [..., C, nb], pos [C]."""
    qb = (pos // config.block_size)[:, None]
    blk = np.arange(scores.shape[-1])[None, :]
    forced = (blk < config.init_blocks) | ((blk >= qb - config.local_blocks) & (blk <= qb))
    ranked = np.nan_to_num(scores, nan=0.0, posinf=F32_MAX)
    ranked = np.where(forced, np.float32(np.inf), ranked)
    return np.where(blk > qb, np.float32(-np.inf), ranked)


def topk_blocks(ranked: np.ndarray, config: SparseConfig, pos: np.ndarray) -> np.ndarray:
    """Step 6: ranked [..., C, nb] -> idx int64 [..., C, budget], the min(budget, nb) best
    blocks <= qb ascending, then -1. A stable sort of -ranked keeps equal scores in block order:
    ties go to the lower block."""
    nb = ranked.shape[-1]
    k = min(config.budget, nb)
    chosen = np.argsort(-ranked, axis=-1, kind="stable")[..., :k]
    chosen = np.sort(np.where(chosen > (pos // config.block_size)[:, None], nb, chosen), -1)
    idx = np.full((*ranked.shape[:-1], config.budget), -1, np.int64)
    idx[..., :k] = np.where(chosen == nb, -1, chosen)
    return idx


def select_blocks(q: np.ndarray, keys: Keys, *, config: SparseConfig, scale: float,
                  cache_len: int) -> np.ndarray:
    """Stage 1: q [B, Hq, T, D] and the compressed cache -> idx int64 [B, Hkv, T, budget]."""
    t = q.shape[2]
    n_blocks = -(-keys.length // config.block_size)
    rows = []
    for lo in range(0, t, _SCORE_QUERIES):
        pos = np.arange(cache_len + lo, cache_len + min(t, lo + _SCORE_QUERIES))
        s = kernel_scores(q[:, :, lo:lo + _SCORE_QUERIES], keys, pos, config, scale)
        rows.append(topk_blocks(ranking_scores(pool_blocks(s, config, n_blocks), config, pos),
                                config, pos))
    return np.concatenate(rows, 2)


# -- §4 stage 2 and the dense path ----------------------------------------------------------
def _softmax_rows(logits: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of the visible entries (fp32, shifted by the row max)."""
    logits = np.where(visible, logits, np.float32(-np.inf))
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def block_sparse_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, idx: np.ndarray, *,
                           config: SparseConfig, scale: float, cache_len: int) -> np.ndarray:
    """Query i of group g attends to key t iff t <= cache_len + i and t // block_size is in
    idx[g, i]. q [B, Hq, T, D], k/v [B, Hkv, S, D], idx [B, Hkv, T, W] (-1 unused)
    -> fp32 [B, Hq, T, D]. Each query's W blocks are gathered ([W * block_size, D] keys)."""
    b, hq, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    group, bs, w = hq // hkv, config.block_size, idx.shape[-1]
    q, k, v = (np.asarray(x, np.float32) for x in (q, k, v))
    out = np.empty((b, hq, t, d), np.float32)
    step = max(1, _GATHER_KEYS // (w * bs))
    for lo in range(0, t, step):
        hi = min(t, lo + step)
        pos = np.arange(cache_len + lo, cache_len + hi)
        for bi in range(b):
            for g in range(hkv):
                rows = idx[bi, g, lo:hi]                                      # [C, W]
                key_pos = (rows[..., None] * bs + np.arange(bs)).reshape(hi - lo, w * bs)
                visible = np.repeat(rows >= 0, bs, -1) & (key_pos <= pos[:, None])
                # unused slots (-1) and a last block's rows past S are gathered but never seen
                at = np.clip(key_pos, 0, s - 1)
                kg, vg = k[bi, g][at], v[bi, g][at]                           # [C, W*bs, D]
                qg = np.float32(scale) * q[bi, g * group:(g + 1) * group, lo:hi]   # [G, C, D]
                probs = _softmax_rows(np.einsum("gcd,cnd->gcn", qg, kg), visible[None])
                out[bi, g * group:(g + 1) * group, lo:hi] = np.einsum("gcn,cnd->gcd", probs, vg)
    return out


def dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                    cache_len: int) -> np.ndarray:
    """Causal GQA attention, fp32: query i sees keys 0 .. cache_len + i.
    q [B, Hq, T, D], k/v [B, Hkv, S, D] -> fp32 [B, Hq, T, D], in chunks of queries."""
    b, hq, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    group = hq // hkv
    kf = k.astype(np.float32)[:, :, None]                                     # [B,Hkv,1,S,D]
    vf = v.astype(np.float32)[:, :, None]
    out = np.empty((b, hq, t, d), np.float32)
    for lo in range(0, t, _SCORE_QUERIES):
        hi = min(t, lo + _SCORE_QUERIES)
        qg = (np.float32(scale) * q[:, :, lo:hi]).reshape(b, hkv, group, hi - lo, d)
        visible = np.arange(s)[None, :] <= np.arange(cache_len + lo, cache_len + hi)[:, None]
        probs = _softmax_rows(qg @ kf.swapaxes(-1, -2), visible)
        out[:, :, lo:hi] = (probs @ vf).reshape(b, hq, hi - lo, d)
    return out


# -- §5 the dense / sparse switch --------------------------------------------------------------
def infllmv2_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, config: SparseConfig,
                       scale: float, cache_len: int, state: Keys | None = None,
                       q_sel: np.ndarray | None = None, k_sel: np.ndarray | None = None
                       ) -> tuple[np.ndarray, Keys | None, np.ndarray | None]:
    """One layer's InfLLM v2 attention, functional (state in, state out).

    Returns (out fp32 [B, Hq, T, D], keys, idx). cache_len + T < dense_len: dense causal
    attention, the incoming state returned untouched, idx None. Otherwise keys are the Keys of
    the whole cache (incrementally from `state`) and idx int64 [B, Hkv, T, budget] the selected
    blocks, ascending, then -1. q_sel / k_sel: the pre-RoPE queries / keys selection uses when
    config.use_nope (required then)."""
    _, hq, t, d = q.shape
    if k.shape != v.shape or k.shape[2] != cache_len + t or hq % k.shape[1] or k.shape[3] != d:
        raise ValueError(f"k {k.shape} / v {v.shape} must be [B, Hkv, cache_len + T = "
                         f"{cache_len + t}, D] with Hkv dividing Hq={hq}, for q {q.shape}")
    if config.use_nope and not config.is_dense(k.shape[2]) and (q_sel is None or k_sel is None):
        raise ValueError("sparse_config has use_nope=true: pass q_sel and k_sel, the queries "
                         "and keys before RoPE that select the blocks")
    q, k, v = (np.asarray(x, np.float32) for x in (q, k, v))
    # exp overflows to inf and inf - inf gives NaN in stage 1 by definition (§9): no warnings.
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        if config.is_dense(k.shape[2]):
            return dense_attention(q, k, v, scale, cache_len), state, None
        sel_q, sel_k = (q_sel, k_sel) if config.use_nope else (q, k)
        keys = update_keys(sel_k, config, state)
        idx = select_blocks(np.asarray(sel_q, np.float32), keys, config=config, scale=scale,
                            cache_len=cache_len)
        out = block_sparse_attention(q, k, v, idx, config=config, scale=scale,
                                     cache_len=cache_len)
    return out, keys, idx
