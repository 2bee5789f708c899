"""RoPE and dense attention as TE computations, with the IR interpreter's meaning
(`arkinfer/ir/interpret.py`, `arkinfer/ops/rope.py`, `arkinfer/ops/attention.py`).

    rope_table(x [B,H,T,D], pos i64 [T], table [Pmax, D], table_long?, use_long) -> like x
        table[p] = cat(cos(p * inv_freq), sin(p * inv_freq)) * scale; dim i pairs with i + D/2
    rope(x, pos, inv_freq [D/2], inv_freq_long?, use_long, scale)            -> like x
    attention_scores(q [B,Hq,T,D], k [B,Hkv,S,D], scale) -> [B,Hkv,G,T,S] scaled logits
    masked_softmax(scores)                                -> [B,Hkv,G,T,S] causal probabilities
    attention_mix(p [B,Hkv,G,T,S], v [B,Hkv,S,D])         -> [B,Hkv,G,T,D]
        GQA: query head h = kv*G + g. Each step is a plain batched matmul / softmax, the shapes
        dlight's rules expect: indexing k by h // G inside the reduction makes 0.27's GPU
        reduction rules emit an invalid cross-thread schedule, and reshaping q to [B,Hkv,G*T,D]
        first makes the Matmul rule allocate an S-sized local buffer on Mali (both seen here).

`use_long` is a boolean PrimExpr (LongRoPE: the call's total length > long_after), evaluated
inside the kernel, so one compiled module switches tables at run time like the interpreter does.
Query row i sits at position S - T + i and sees keys j <= S - T + i (the cache holds S - T older
keys).
"""

from __future__ import annotations

from tvm import te
from tvm import tirx as tir

NEG_INF = -3.0e38  # finite: a fully masked row cannot occur (key 0 is always visible; with
#                   InfLLM v2 the query's own block is always selected)


def _rotate(x: te.Tensor, cos, sin, b, h, t, d, half):
    """x * cos + rotate_half(x) * sin at [b, h, t, d]; rotate_half = cat(-x2, x1)."""
    partner = tir.if_then_else(d < half, -x[b, h, t, d + half], x[b, h, t, d - half])
    return x[b, h, t, d] * cos + partner * sin


def rope_table(x: te.Tensor, positions: te.Tensor, table: te.Tensor,
               table_long: te.Tensor | None, use_long) -> te.Tensor:
    half = int(x.shape[-1]) // 2

    def row(p, col):
        if table_long is None:
            return table[p, col]
        return tir.if_then_else(use_long, table_long[p, col], table[p, col])

    def f(b, h, t, d):
        j = d % half
        p = positions[t]
        return _rotate(x, row(p, j), row(p, half + j), b, h, t, d, half)

    return te.compute(x.shape, f, name="rope_table")


def rope(x: te.Tensor, positions: te.Tensor, inv_freq: te.Tensor,
         inv_freq_long: te.Tensor | None, use_long, scale: float) -> te.Tensor:
    half = int(x.shape[-1]) // 2

    def f(b, h, t, d):
        j = d % half
        inv = inv_freq[j] if inv_freq_long is None else \
            tir.if_then_else(use_long, inv_freq_long[j], inv_freq[j])
        angle = positions[t].astype("float32") * inv
        return _rotate(x, tir.cos(angle) * scale, tir.sin(angle) * scale, b, h, t, d, half)

    return te.compute(x.shape, f, name="rope")


def attention_scores(q: te.Tensor, k: te.Tensor, scale: float) -> te.Tensor:
    """q [B,Hq,T,D], k [B,Hkv,S,D] -> [B,Hkv,G,T,S] = scale * q.k, query head h = kv*G + g
    (unmasked: masked_softmax applies the causal mask)."""
    batch, hq, t_new, dim = q.shape
    hkv = k.shape[1]
    group = int(hq) // int(hkv)
    d = te.reduce_axis((0, dim), "d")
    return te.compute((batch, hkv, group, t_new, k.shape[2]),
                      lambda b, h, g, i, j: te.sum(q[b, h * group + g, i, d] * k[b, h, j, d]
                                                   * tir.const(scale, "float32"), axis=d),
                      name="attn_qk")


def masked_softmax(scores: te.Tensor, visible=None) -> te.Tensor:
    """Causal softmax over the last axis of [B,Hkv,G,T,S]: query i (position S - T + i) sees
    keys j <= S - T + i (and, with `visible(b, h, g, i, j)`, a boolean PrimExpr, only where it
    holds: InfLLM v2's selected blocks, kernels_infllmv2.sparse_visible). The mask is read
    inside the max / sum reductions (no masked copy of the scores), so dlight schedules it like
    a plain softmax."""
    batch, hkv, group, t_new, s_total = scores.shape

    def masked(b, h, g, i, j):
        cond = j <= s_total - t_new + i
        if visible is not None:
            cond = tir.all(cond, visible(b, h, g, i, j))
        return tir.if_then_else(cond, scores[b, h, g, i, j], tir.const(NEG_INF, "float32"))

    rows = (batch, hkv, group, t_new)
    j1 = te.reduce_axis((0, s_total), "j")
    peak = te.compute(rows, lambda *r: te.max(masked(*r, j1), axis=j1), name="softmax_max")
    j2 = te.reduce_axis((0, s_total), "j")
    total = te.compute(rows, lambda *r: te.sum(tir.exp(masked(*r, j2) - peak[r]), axis=j2),
                       name="softmax_sum")
    return te.compute(scores.shape, lambda *r: tir.exp(masked(*r) - peak[r[:-1]])
                      / total[r[:-1]], name="softmax_norm")


def attention_mix(p: te.Tensor, v: te.Tensor) -> te.Tensor:
    """p [B,Hkv,G,T,S], v [B,Hkv,S,D] -> [B,Hkv,G,T,D] (a free reshape gives [B,Hq,T,D])."""
    batch, hkv, group, t_new, s_total = p.shape
    j = te.reduce_axis((0, s_total), "j")
    return te.compute((batch, hkv, group, t_new, v.shape[3]),
                      lambda b, h, g, i, d: te.sum(p[b, h, g, i, j] * v[b, h, j, d], axis=j),
                      name="attn_pv")
