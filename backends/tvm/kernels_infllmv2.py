"""InfLLM v2 (docs/infllmv2.md §2-§5) as TE computations, with exactly the semantics of
`arkinfer/ops/infllmv2/reference.py`: key compression, block selection, and the selection mask
that turns `kernels_attention`'s masked softmax into block-sparse attention.

Layout (as everywhere in ArkInfer): q [B, Hq, T, D] are the T new queries at absolute positions
L - T .. L - 1; k [B, Hkv, L, D] is the whole cache including the new keys; query head
h = kv * G + g. Everything is fp32 (stage 1 is fp32 in every backend, §9).

    compress(k, kernel, stride)                  -> [B, Hkv, L // stride + 1, D]  mean-pooled keys
    kernel_dots(q, keys, G)                      -> [B, Hkv, G, T, N]  q_h . key (fine or coarse)
    coarse_lse(coarse dots, L, sizes, scale)     -> [B, Hkv, G, T]  stage 1 step 1
    group_scores(fine dots, lse, L, ...)         -> [B, Hkv, T, N1]  steps 2-3
    block_scores(s, L, sizes)                    -> [B, Hkv, T, ceil(L / block)]  step 4
    ranking_scores(b, L, sizes)                  -> [B, Hkv, T, nb]  step 5 (forced / future)
    block_rank(ranked, ranked)                   -> int32 [B, Hkv, T, nb]  step 6: the place of
                                                    each block in the top-k order; block c is
                                                    selected iff rank < budget and c <= qb
    selected_blocks(rank, L, sizes)              -> int64 [B, Hkv, T, budget]  `idx` (ascending,
                                                    -1 padding), for the conformance suite
    sparse_visible(rank, sizes, sparse)          -> the key mask of stage 2 for masked_softmax

Compressed keys are allocated with `L // stride + 1` rows (>= n_kernels(L) and never empty, so
one compiled function serves every L, including L < kernel_size): rows past n_kernels(L) read
zeros beyond the cache and are never visible to any query (a kernel is visible to position i only
once it is complete at i), so they add nothing to any score. The coarse normaliser, visibility,
NaN and overflow rules are the reference's, step for step:

    lse      = logsumexp over visible coarse kernels (torch's: a +-inf max is replaced by 0, so no
               visible kernel gives -inf, an overflowed logit +inf)
    p_h[j]   = exp(scale * q_h.Kc1[j] - lse_h) if fine kernel j is visible else 0; NaN -> 0 per
               head, BEFORE the group sum (§9); +inf stays
    s[j]     = sum of p_h over the group's heads
    b[blk]   = max of s over fine kernels r*blk - 1 .. r*blk + r - 1 (0 if none)
    ranked   = -inf after qb; +inf for init blocks and qb - local .. qb; else b with +inf -> FLT_MAX
    rank[c]  = #{c': ranked[c'] > ranked[c]} + #{c' < c: ranked[c'] == ranked[c]}  (a stable
               descending sort: ties go to the lower block)

Stage 2 is `kernels_attention.attention_scores` / `masked_softmax` / `attention_mix` with key j
visible to query i iff j <= position(i) and (dense call or rank[j // block] < budget): masked
dense attention over the whole cache (O(T * L), like the reference; not a gathering kernel).
`sparse` is a boolean PrimExpr (the dense <-> sparse switch of §5, `L >= dense_len`), evaluated
inside the kernels, so one module runs both sides of dense_len; stage 1 skips its reductions
when it is false.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import te
from tvm import tirx as tir

from arkinfer.ops.infllmv2.config import SparseConfig

F32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class Sizes:
    """The integers of a SparseConfig the kernels bake in."""

    kernel: int
    stride: int
    coarse_kernel: int
    coarse_stride: int
    block: int
    per_block: int
    init_blocks: int
    local_blocks: int
    budget: int

    @classmethod
    def of(cls, cfg: SparseConfig) -> Sizes:
        return cls(cfg.kernel_size, cfg.kernel_stride, cfg.coarse_kernel_size,
                   cfg.coarse_kernel_stride, cfg.block_size, cfg.kernels_per_block,
                   cfg.init_blocks, cfg.local_blocks, cfg.budget)


def _f32(x: float):
    return tir.const(x, "float32")


def _position(i, t_new, length):
    """Absolute position of query row i: L - T + i."""
    return length - t_new + i


def compress(k: te.Tensor, kernel: int, stride: int) -> te.Tensor:
    """out[b, h, j] = mean(k[b, h, stride*j : stride*j + kernel]) summed offset by offset from
    0 (the order of `compress.kernel_means`), times 1/kernel; keys past L read as 0."""
    batch, heads, length, dim = k.shape
    rows = length // stride + 1
    o = te.reduce_axis((0, kernel), "o")
    total = te.compute((batch, heads, rows, dim),
                       lambda b, h, j, d: te.sum(tir.if_then_else(
                           j * stride + o < length, k[b, h, j * stride + o, d], _f32(0.0)),
                           axis=o), name="kernel_sum")
    return te.compute(total.shape, lambda *i: total[i] * _f32(1.0 / kernel), name="kernel_mean")


def kernel_dots(q: te.Tensor, keys: te.Tensor, group: int, sparse) -> te.Tensor:
    """[B, Hkv, G, T, N] raw q_h . keys[j] (unscaled: the reference scales the product); skipped
    (zeros) on a dense call."""
    batch, _, t_new, dim = q.shape
    d = te.reduce_axis((0, dim), "d")
    return te.compute((batch, keys.shape[1], group, t_new, keys.shape[2]),
                      lambda b, h, g, i, j: te.sum(q[b, h * group + g, i, d] * keys[b, h, j, d],
                                                   axis=d, where=sparse), name="kernel_dots")


def coarse_lse(dots: te.Tensor, length, sz: Sizes, scale: float, sparse) -> te.Tensor:
    """dots [B, Hkv, G, T, N2] (kernel_dots with the coarse keys) -> [B, Hkv, G, T]: logsumexp of
    scale * dots over the coarse kernels visible to each query (torch.logsumexp: an infinite
    max is replaced by 0 before exp; no visible kernel gives -inf). `length`: L."""
    rows, t_new = dots.shape[:4], dots.shape[3]

    def logit(b, h, g, i, c):
        visible = sz.coarse_stride * c + (sz.coarse_kernel - 1) <= _position(i, t_new, length)
        return tir.if_then_else(visible, _f32(scale) * dots[b, h, g, i, c], _f32(-float("inf")))

    c1 = te.reduce_axis((0, dots.shape[4]), "c")
    peak = te.compute(rows, lambda *r: te.max(logit(*r, c1), axis=c1, where=sparse),
                      name="coarse_max")

    def shift(r):
        return tir.if_then_else(tir.isinf(peak[r]), _f32(0.0), peak[r])

    c2 = te.reduce_axis((0, dots.shape[4]), "c")
    total = te.compute(rows, lambda *r: te.sum(tir.exp(logit(*r, c2) - shift(r)), axis=c2,
                                               where=sparse), name="coarse_sum")
    return te.compute(rows, lambda *r: tir.log(total[r]) + shift(r), name="coarse_lse")


def group_scores(dots: te.Tensor, lse: te.Tensor, length, sz: Sizes, scale: float,
                 sparse) -> te.Tensor:
    """dots [B, Hkv, G, T, N1] (kernel_dots with the fine keys), lse [B, Hkv, G, T] ->
    [B, Hkv, T, N1]: s[j] = sum over the group's heads of p_h[j] (invisible -> 0, NaN -> 0 per
    head before the sum, +inf kept)."""
    batch, hkv, group, t_new, n1 = dots.shape

    def p(b, h, g, i, j):
        visible = sz.stride * j + (sz.kernel - 1) <= _position(i, t_new, length)
        e = tir.exp(_f32(scale) * dots[b, h, g, i, j] - lse[b, h, g, i])
        return tir.if_then_else(tir.all(visible, tir.Not(tir.isnan(e))), e, _f32(0.0))

    g = te.reduce_axis((0, group), "g")
    return te.compute((batch, hkv, t_new, n1),
                      lambda b, h, i, j: te.sum(p(b, h, g, i, j), axis=g, where=sparse),
                      name="group_scores")


def n_blocks(length, sz: Sizes):
    """ceil(L / block_size)."""
    return (length + (sz.block - 1)) // sz.block


def block_scores(s: te.Tensor, length, sz: Sizes) -> te.Tensor:
    """[B, Hkv, T, ceil(L / block)]: b[blk] = max of s[j], j in [r*blk - 1, r*blk + r - 1] and
    inside s (0 when empty; every s is >= 0, so 0 is also the max's floor)."""
    r = sz.per_block
    n1 = s.shape[3]
    o = te.reduce_axis((0, r + 1), "o")

    def f(b, h, i, blk):
        j = blk * r - 1 + o
        inside = tir.all(j >= 0, j < n1)
        return te.max(tir.if_then_else(inside, s[b, h, i, tir.max(tir.min(j, n1 - 1), 0)],
                                       _f32(0.0)), axis=o)

    return te.compute((*s.shape[:3], n_blocks(length, sz)), f, name="block_scores")


def ranking_scores(scores: te.Tensor, length, sz: Sizes) -> te.Tensor:
    """What top-k ranks (reference.ranking_scores): -inf after qb, +inf for forced blocks,
    else the score with +inf -> FLT_MAX."""
    t_new = scores.shape[2]

    def f(b, h, i, c):
        qb = _position(i, t_new, length) // sz.block
        forced = tir.any(c < sz.init_blocks, tir.all(c >= qb - sz.local_blocks, c <= qb))
        x = scores[b, h, i, c]
        finite = tir.if_then_else(tir.isinf(x), _f32(F32_MAX), x)
        return tir.if_then_else(c > qb, _f32(-float("inf")),
                                tir.if_then_else(forced, _f32(float("inf")), finite))

    return te.compute(scores.shape, f, name="ranked")


def block_rank(ranked: te.Tensor, ranked_again: te.Tensor, sparse) -> te.Tensor:
    """int32 [B, Hkv, T, nb]: the place of block c in a stable descending sort of the ranking
    scores (ties: the lower block first). Block c is selected iff rank < budget and c <= qb.
    `ranked_again` is the same tensor passed twice, so each buffer is read at one point per
    block iteration (dlight's GPU reduction analysis requires it)."""
    other = te.reduce_axis((0, ranked.shape[3]), "other")

    def f(b, h, i, c):
        x, y = ranked[b, h, i, c], ranked_again[b, h, i, other]
        before = tir.any(y > x, tir.all(y == x, other < c))
        return te.sum(before.astype("int32"), axis=other, where=sparse)

    return te.compute(ranked.shape, f, name="block_rank")


def selected_blocks(rank: te.Tensor, length, sz: Sizes) -> te.Tensor:
    """int64 [B, Hkv, T, budget]: the selected blocks in ascending order, then -1 (the `idx` of
    reference.topk_blocks)."""
    t_new, nb = rank.shape[2], rank.shape[3]

    def chosen(b, h, i, c):
        qb = _position(i, t_new, length) // sz.block
        return tir.all(rank[b, h, i, c] < sz.budget, c <= qb)

    earlier = te.reduce_axis((0, nb), "earlier")
    before = te.compute(rank.shape, lambda b, h, i, c: te.sum(
        tir.all(chosen(b, h, i, earlier), earlier < c).astype("int32"), axis=earlier),
        name="chosen_before")
    c = te.reduce_axis((0, nb), "c")
    return te.compute((*rank.shape[:3], sz.budget), lambda b, h, i, slot: te.max(
        tir.if_then_else(tir.all(chosen(b, h, i, c), before[b, h, i, c] == slot),
                         c.astype("int64"), tir.const(-1, "int64")), axis=c), name="idx")


def sparse_visible(rank: te.Tensor, sz: Sizes, sparse):
    """Stage 2's extra key condition for kernels_attention.masked_softmax: key j of query i of
    group h is visible iff the call is dense or block j // block_size ranks within the budget
    (causality, j <= position(i), is the softmax's own mask, and it implies j // block <= qb)."""
    def visible(b, h, g, i, j):
        return tir.any(tir.Not(sparse), rank[b, h, i, j // sz.block] < sz.budget)

    return visible
