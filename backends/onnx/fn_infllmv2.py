"""`arkinfer.InfLLMv2Attention`: InfLLM v2 (docs/infllmv2.md) as an ONNX local function whose
body uses standard ops only, so onnxruntime (or any ONNX runtime) executes it and TensorRT can
swap in a plugin registered under the same name.

    InfLLMv2Attention(q, k, v, fine_in, coarse_in) -> (out, fine_out, coarse_out, idx)

    q        [B, Hq, T, D]    the T new queries (after RoPE), at positions S - T .. S - 1
    k, v     [B, Hkv, S, D]   the whole KV cache including the new keys
    fine_in  f32 [B, Hkv, n1_in, D]   compressed-key cache (kernel mean-pools) of earlier calls;
    coarse_in f32 [B, Hkv, n2_in, D]  n1_in = 0 (empty) recompresses from the start
    out      like q; fine_out / coarse_out: every complete kernel of the S keys (only the new ones
             are computed: kernels n1_in .. n1(S) - 1 are appended); idx int64 [B, Hkv, T, budget]
             (sorted selected blocks, -1 padding) on a sparse call, [B, Hkv, T, 0] on a dense one.

Attributes: the `sparse_config` keys (kernel_size, kernel_stride, block_size, init_blocks,
window_size, topk, use_nope, dense_len) and `scale` (softmax scale). Dense when dense_len >= 0 and
S < dense_len, else sparse. The compressed caches are kept current on dense calls too (cheap: only
completed kernels are pooled), so crossing dense_len needs no special step.

The sparse branch is the masked-dense formulation (O(T x S) like the reference); the fast kernel is
the TensorRT plugin's job. `use_nope=1` (selection on pre-RoPE q/k) is not supported.
"""

from __future__ import annotations

import numpy as np
from onnx import FunctionProto, TensorProto, helper

from .onnx_build import DOMAIN, OPSET, NodeBuilder, attribute

NAME = "InfLLMv2Attention"
COARSE_FACTOR = 4  # arkinfer.ops.infllmv2.config.COARSE_FACTOR (coarse kernel = 4x fine)
SPARSE_KEYS = ("kernel_size", "kernel_stride", "block_size", "init_blocks", "window_size", "topk",
               "use_nope", "dense_len")
_DEFAULTS = {"kernel_size": 32, "kernel_stride": 16, "block_size": 64, "init_blocks": 1,
             "window_size": 2048, "topk": 64, "use_nope": 0, "dense_len": 8192}
_NEG_INF, _FLT_MAX = float("-inf"), float(np.finfo(np.float32).max)


def node_attrs(sparse_config: dict, scale: float) -> dict:
    """Node attributes for a config.json `sparse_config` dict and a softmax scale."""
    attrs = {k: int(sparse_config.get(k, _DEFAULTS[k])) for k in SPARSE_KEYS}
    attrs["scale"] = float(scale)
    return attrs


def _compress(b: NodeBuilder, kf: str, state: str, s: str, kernel: str, stride: str) -> str:
    """Append the kernels completed since `state` (f32 [B,H,have,D]) -> f32 [B,H,n(S),D]."""
    have = b.dim(state, 2)
    n = b.op("Max", b.i64(0), b.op("Div", b.op("Add", b.op("Sub", s, kernel), stride), stride))
    j = b.range1(have, n)                                             # new kernel ids [count]
    offsets = b.range1(b.i64(0), kernel)                              # [kernel]
    idx = b.op("Add", b.op("Unsqueeze", b.op("Mul", j, stride), b.i64(1)),
               b.op("Unsqueeze", offsets, b.i64(0)))                  # [count, kernel]
    taken = b.op("Gather", kf, idx, axis=2)                           # [B,H,count,kernel,D]
    new = b.op("ReduceMean", taken, b.i64(3), keepdims=0)              # [B,H,count,D]
    return b.op("Concat", state, new, axis=2)


def _sparse_branch(outer: NodeBuilder, v: dict) -> helper.GraphProto:
    """Stage 1 (§3): block selection -> (visible mask bool [B,Hkv,T,S], idx [B,Hkv,T,budget])."""
    b = NodeBuilder(f"{outer.prefix}/sparse")
    pos, qg, scale = v["pos"], v["qg"], v["scale"]
    fine5 = b.op("Unsqueeze", v["fine"], b.i64(2))                    # [B,Hkv,1,n1,D]
    coarse5 = b.op("Unsqueeze", v["coarse"], b.i64(2))
    qs = b.op("Mul", qg, scale)

    def visible(kernel: str, stride: str, count_of: str) -> str:      # [T, n] bool
        ends = b.op("Add", b.op("Mul", b.range1(b.i64(0), b.dim(count_of, 2)), stride),
                    b.op("Sub", kernel, b.i64(1)))
        return b.op("LessOrEqual", b.op("Unsqueeze", ends, b.i64(0)),
                    b.op("Unsqueeze", pos, b.i64(1)))

    fine_vis = visible(v["ks"], v["kst"], v["fine"])
    coarse_vis = visible(v["cks"], v["ckst"], v["coarse"])
    neg_inf = b.f32(_NEG_INF)
    cl = b.op("MatMul", qs, b.op("Transpose", coarse5, perm=[0, 1, 2, 4, 3]))  # [B,Hkv,G,T,n2]
    cl = b.op("Where", coarse_vis, cl, neg_inf)
    # one -inf column so the reductions are defined when no coarse kernel exists yet
    pad_shape = b.op("Concat", b.op("Shape", cl, end=-1), b.i64(1), axis=0)
    cl = b.op("Concat", cl, b.op("Expand", neg_inf, pad_shape), axis=-1)
    m = b.op("ReduceMax", cl, b.i64(-1), keepdims=1)
    m = b.op("Where", b.op("IsInf", m), b.f32(0.0), m)
    lse = b.op("Add", b.op("Log", b.op("ReduceSum", b.op("Exp", b.op("Sub", cl, m)), b.i64(-1),
                                       keepdims=1)), m)              # -inf when nothing visible
    fl = b.op("MatMul", qs, b.op("Transpose", fine5, perm=[0, 1, 2, 4, 3]))    # [B,Hkv,G,T,n1]
    p = b.op("Exp", b.op("Sub", fl, lse))
    zero = b.f32(0.0)
    p = b.op("Where", fine_vis, p, zero)
    p = b.op("Where", b.op("IsNaN", p), zero, p)
    s = b.op("ReduceSum", p, b.i64(2), keepdims=0)                    # group sum [B,Hkv,T,n1]
    # max-pool the fine kernels j in [r*blk - 1, r*blk + r - 1] into blocks (r = block/stride):
    # one zero on the left (j = -1), zeros on the right up to r*nb + 1 values (scores are >= 0)
    r = b.op("Div", v["bs"], v["kst"])
    nb = v["nb"]
    rnb = b.op("Mul", r, nb)
    right = b.op("Sub", rnb, b.dim(p, 4))
    pads = b.op("Concat", b.i64(0, 0, 0, 1, 0, 0, 0), right, axis=0)
    sp = b.op("Pad", s, pads, zero)                                   # [B,Hkv,T,r*nb+1]
    lead = b.op("Slice", sp, b.i64(0), rnb, b.i64(3))
    lead = b.op("Reshape", lead, b.op("Concat", b.op("Shape", s, end=3), nb, r, axis=0))
    lead = b.op("ReduceMax", lead, b.i64(-1), keepdims=0)
    tail = b.op("Slice", sp, r, b.op("Add", rnb, b.i64(1)), b.i64(3), r)
    blk_score = b.op("Max", lead, tail)                               # [B,Hkv,T,nb]
    # forced blocks +inf, future -inf, overflowed scores -> largest finite float
    qb = b.op("Unsqueeze", b.op("Div", pos, v["bs"]), b.i64(1))       # [T,1]
    blk = b.op("Unsqueeze", b.range1(b.i64(0), nb), b.i64(0))         # [1,nb]
    local = b.op("Div", v["win"], v["bs"])
    forced = b.op("Or", b.op("Less", blk, v["init"]),
                  b.op("And", b.op("GreaterOrEqual", blk, b.op("Sub", qb, local)),
                       b.op("LessOrEqual", blk, qb)))
    future = b.op("Greater", blk, qb)
    ranked = b.op("Where", b.op("IsInf", blk_score, detect_negative=0), b.f32(_FLT_MAX), blk_score)
    ranked = b.op("Where", forced, b.f32(float("inf")), ranked)
    ranked = b.op("Where", future, neg_inf, ranked)
    budget = b.op("Add", v["topk"], local)
    k_sel = b.op("Min", budget, nb)
    _, order = b.op("TopK", ranked, k_sel, outputs=2, axis=-1, largest=1, sorted=1)  # ties: lower
    chosen = b.op("Where", b.op("Greater", order, qb), nb, order)
    chosen, _ = b.op("TopK", chosen, k_sel, outputs=2, axis=-1, largest=0, sorted=1)  # ascending
    idx = b.op("Where", b.op("Equal", chosen, nb), b.i64(-1), chosen)
    idx = b.op("Pad", idx, b.op("Concat", b.i64(0, 0, 0, 0, 0, 0, 0),
                                b.op("Sub", budget, k_sel), axis=0), b.const(np.int64(-1)))
    # stage 2 mask: key t visible iff its block is chosen and t <= position
    marks = b.op("ConstantOfShape", b.op("Concat", b.op("Shape", s, end=3),
                                         b.op("Add", nb, b.i64(1)), axis=0),
                 value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0]))
    ones = b.op("Expand", b.f32(1.0), b.op("Shape", chosen))
    marks = b.op("ScatterElements", marks, chosen, ones, axis=3)       # [B,Hkv,T,nb+1]
    key_block = b.op("Div", b.range1(b.i64(0), v["s"]), v["bs"])
    seen = b.op("Greater", b.op("Gather", marks, key_block, axis=3), b.f32(0.5))
    mask = b.op("And", seen, v["causal"], out_names=[f"{b.prefix}/mask"])
    idx = b.op("Identity", idx, out_names=[f"{b.prefix}/idx"])
    outs = [helper.make_tensor_value_info(mask, TensorProto.BOOL, None),
            helper.make_tensor_value_info(idx, TensorProto.INT64, None)]
    return helper.make_graph(b.nodes, "sparse", [], outs)


def _dense_branch(outer: NodeBuilder, v: dict) -> helper.GraphProto:
    b = NodeBuilder(f"{outer.prefix}/dense")
    mask = b.op("Unsqueeze", v["causal"], b.i64(0, 1), out_names=[f"{b.prefix}/mask"])
    shape = b.op("Concat", b.op("Shape", v["q"], end=1), b.op("Shape", v["k"], start=1, end=2),
                 b.op("Shape", v["q"], start=2, end=3), b.i64(0), axis=0)
    idx = b.op("ConstantOfShape", shape, value=helper.make_tensor("m1", TensorProto.INT64, [1], [-1]),
               out_names=[f"{b.prefix}/idx"])
    outs = [helper.make_tensor_value_info(mask, TensorProto.BOOL, None),
            helper.make_tensor_value_info(idx, TensorProto.INT64, None)]
    return helper.make_graph(b.nodes, "dense", [], outs)


def masked_attention(b: NodeBuilder, qg: str, kf: str, vf: str, mask5: str, scale: str) -> str:
    """softmax(scale * q k^T, masked) v in fp32 with GQA by broadcasting.
    qg [B,Hkv,G,T,D], kf/vf [B,Hkv,S,D], mask5 bool broadcastable to [B,Hkv,G,T,S]
    -> [B,Hkv,G,T,D]."""
    k5 = b.op("Unsqueeze", kf, b.i64(2))
    v5 = b.op("Unsqueeze", vf, b.i64(2))
    logits = b.op("Mul", b.op("MatMul", qg, b.op("Transpose", k5, perm=[0, 1, 2, 4, 3])), scale)
    logits = b.op("Where", mask5, logits, b.f32(_NEG_INF))
    return b.op("MatMul", b.op("Softmax", logits, axis=-1), v5)


def causal_mask(b: NodeBuilder, pos: str, s: str) -> str:
    """bool [T, S]: key t visible to the query at absolute position pos[i] iff t <= pos[i]."""
    keys = b.op("Unsqueeze", b.range1(b.i64(0), s), b.i64(0))
    return b.op("LessOrEqual", keys, b.op("Unsqueeze", pos, b.i64(1)))


def grouped_queries(b: NodeBuilder, qf: str, k: str) -> str:
    """q [B,Hq,T,D] -> [B,Hkv,G,T,D] (query head h in KV group h // G)."""
    shape = b.op("Concat", b.op("Shape", qf, end=1), b.op("Shape", k, start=1, end=2), b.i64(-1),
                 b.op("Shape", qf, start=2), axis=0)
    return b.op("Reshape", qf, shape)


def function() -> FunctionProto:
    """The FunctionProto of arkinfer.InfLLMv2Attention."""
    b = NodeBuilder("ia")
    q, k, v, fine_in, coarse_in = "q", "k", "v", "fine_in", "coarse_in"
    qf = b.op("Cast", q, to=TensorProto.FLOAT)
    kf = b.op("Cast", k, to=TensorProto.FLOAT)
    vf = b.op("Cast", v, to=TensorProto.FLOAT)
    ks, kst = b.attr_int("kernel_size"), b.attr_int("kernel_stride")
    cks = b.op("Mul", ks, b.i64(COARSE_FACTOR))
    ckst = b.op("Mul", kst, b.i64(COARSE_FACTOR))
    bs, dense_len = b.attr_int("block_size"), b.attr_int("dense_len")
    scale = b.attr_float("scale")
    s, t = b.dim(k, 2), b.dim(q, 2)
    fine = _compress(b, kf, fine_in, s, ks, kst)
    coarse = _compress(b, kf, coarse_in, s, cks, ckst)
    pos = b.range1(b.op("Sub", s, t), s)                               # absolute positions [T]
    causal = causal_mask(b, pos, s)
    qg = grouped_queries(b, qf, k)
    values = {"pos": pos, "qg": qg, "scale": scale, "fine": fine, "coarse": coarse, "ks": ks,
              "kst": kst, "cks": cks, "ckst": ckst, "bs": bs, "s": s, "causal": causal,
              "nb": b.op("Div", b.op("Sub", b.op("Add", s, bs), b.i64(1)), bs),
              "init": b.attr_int("init_blocks"), "win": b.attr_int("window_size"),
              "topk": b.attr_int("topk"), "q": q, "k": k}
    dense = b.op("And", b.op("GreaterOrEqual", dense_len, b.i64(0)), b.op("Less", s, dense_len))
    mask, idx = b.op("If", b.scalar0(dense), outputs=2,
                     then_branch=_dense_branch(b, values), else_branch=_sparse_branch(b, values))
    out5 = masked_attention(b, qg, kf, vf, b.op("Unsqueeze", mask, b.i64(2)), scale)
    out = b.op("CastLike", b.op("Reshape", out5, b.op("Shape", q)), q, out_names=["out"])
    b.op("Identity", fine, out_names=["fine_out"])
    b.op("Identity", coarse, out_names=["coarse_out"])
    b.op("Identity", idx, out_names=["idx"])
    del out
    attrs = [attribute(k_, "int", _DEFAULTS[k_]) for k_ in SPARSE_KEYS]
    attrs.append(attribute("scale", "float", 1.0))
    return helper.make_function(DOMAIN, NAME, [q, k, v, fine_in, coarse_in],
                                ["out", "fine_out", "coarse_out", "idx"], b.nodes,
                                [helper.make_opsetid("", OPSET)], attribute_protos=attrs,
                                doc_string=__doc__)
