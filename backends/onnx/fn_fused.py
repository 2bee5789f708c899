"""RMSNorm, residual-add + RMSNorm and rotary grouped-query attention as `arkinfer`-domain ONNX
local functions whose bodies use standard ops only (what any ONNX runtime executes). Each has the
operands of one onnxruntime contrib op, so the host runner swaps them one for one
(contrib_fused.py), the way onnxruntime-genai's model builder writes its graphs:

    RMSNorm(x [.., H], weight f32 [H]) -> y                          attribute epsilon
        y = weight * (x / sqrt(mean(x^2, -1) + epsilon))
        host: SimplifiedLayerNormalization (onnx domain, axis=-1, stash_type=1)

    SkipRMSNorm(x [.., H], skip [.., H], weight f32 [H]) -> (y, sum)    attribute epsilon
        sum = x + skip; y = RMSNorm(sum)     (the residual add before every norm but the first)
        host: com.microsoft.SkipSimplifiedLayerNormalization, outputs (y, -, -, sum)

    RotaryGQA(query [B,T,Hq*D], key, value [B,T,Hkv*D], past_key, past_value f32 [B,Hkv,P,D],
              positions i64 [T], inv_freq f32 [D/2])
        -> (output [B,T,Hq*D], present_key, present_value [B,Hkv,P+T,D])
        attributes num_heads (Hq), kv_num_heads (Hkv), scale (softmax), rope_scale (cos/sin factor)
        q, k: heads split, RoPE (rotate-half, angles positions x inv_freq in fp32, cos and sin times
        rope_scale); present = past ++ new along S; causal softmax(scale q k^T) v, query head h
        reads KV head h // (Hq/Hkv); heads merged back
        host: com.microsoft.GroupQueryAttention (do_rotary=1, cos/sin caches built at load from
        inv_freq, positions P..P+T-1 taken from seqlens_k: the runner's positions)

The bodies are the IR ops' inline lowering (lower_onnx.py uses the same helpers), so the graph with
these functions computes what the graph without them did.
"""

from __future__ import annotations

from onnx import FunctionProto, TensorProto, helper

from .fn_infllmv2 import causal_mask, grouped_queries, masked_attention
from .onnx_build import DOMAIN, OPSET, NodeBuilder, attribute

RMS_NORM = "RMSNorm"
SKIP_RMS_NORM = "SkipRMSNorm"
ROTARY_GQA = "RotaryGQA"


# ---------------------------------------------------------------- shared with lower_onnx
def rms_norm(b: NodeBuilder, x: str, weight: str, eps: str) -> str:
    """weight * x / sqrt(mean(x^2) + eps) over the last axis (eps: a 0-d f32 value)."""
    ms = b.op("ReduceMean", b.op("Mul", x, x), b.i64(-1), keepdims=1)
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", ms, eps)))
    return b.op("Mul", weight, b.op("Mul", x, inv))


def rope_cos_sin(b: NodeBuilder, positions: str, inv_freq: str, scale: str) -> tuple[str, str]:
    """(cos, sin) f32 [T, D] of angles positions x inv_freq (rotate-half layout), times scale."""
    pos = b.op("Unsqueeze", b.op("Cast", positions, to=TensorProto.FLOAT), b.i64(1))
    ang = b.op("Mul", pos, b.op("Unsqueeze", inv_freq, b.i64(0)))     # [T, D/2]
    emb = b.op("Concat", ang, ang, axis=-1)
    return b.op("Mul", b.op("Cos", emb), scale), b.op("Mul", b.op("Sin", emb), scale)


def rope_apply(b: NodeBuilder, x: str, cos: str, sin: str, half: str) -> str:
    """x [.., T, D] -> x cos + rotate_half(x) sin; half: int64 [1] = D/2."""
    x1 = b.op("Slice", x, b.i64(0), half, b.i64(-1))
    x2 = b.op("Slice", x, half, b.op("Mul", half, b.i64(2)), b.i64(-1))
    rot = b.op("Concat", b.op("Neg", x2), x1, axis=-1)
    return b.op("Add", b.op("Mul", x, cos), b.op("Mul", rot, sin))


def dense_attention(b: NodeBuilder, q: str, k: str, v: str, scale: str) -> str:
    """Causal GQA softmax: q [B,Hq,T,D] (the last T of S positions), k, v [B,Hkv,S,D] -> like q."""
    s, t = b.dim(k, 2), b.dim(q, 2)
    pos = b.range1(b.op("Sub", s, t), s)
    mask = b.op("Unsqueeze", causal_mask(b, pos, s), b.i64(0, 1, 2))
    out5 = masked_attention(b, grouped_queries(b, q, k), k, v, mask, scale)
    return b.op("Reshape", out5, b.op("Shape", q))


# ---------------------------------------------------------------- functions
def _function(name: str, inputs: list[str], outputs: list[str], b: NodeBuilder,
              attrs: list, doc: str) -> FunctionProto:
    return helper.make_function(DOMAIN, name, inputs, outputs, b.nodes,
                                [helper.make_opsetid("", OPSET)], attribute_protos=attrs,
                                doc_string=doc)


def rms_norm_function() -> FunctionProto:
    b = NodeBuilder("rn")
    y = rms_norm(b, "x", "weight", b.attr_float("epsilon"))
    b.op("Identity", y, out_names=["y"])
    return _function(RMS_NORM, ["x", "weight"], ["y"], b, [attribute("epsilon", "float", 1e-6)],
                     "RMSNorm over the last axis (backends/onnx/fn_fused.py)")


def skip_rms_norm_function() -> FunctionProto:
    b = NodeBuilder("srn")
    total = b.op("Add", "x", "skip", out_names=["sum"])
    y = rms_norm(b, total, "weight", b.attr_float("epsilon"))
    b.op("Identity", y, out_names=["y"])
    return _function(SKIP_RMS_NORM, ["x", "skip", "weight"], ["y", "sum"], b,
                     [attribute("epsilon", "float", 1e-6)],
                     "residual add then RMSNorm (backends/onnx/fn_fused.py)")


def _heads(b: NodeBuilder, x: str, heads: str) -> str:
    """[B, T, H*D] -> [B, H, T, D]."""
    shape = b.op("Concat", b.op("Shape", x, end=2), heads, b.i64(-1), axis=0)
    return b.op("Transpose", b.op("Reshape", x, shape), perm=[0, 2, 1, 3])


def rotary_gqa_function() -> FunctionProto:
    b = NodeBuilder("gqa")
    hq, hkv = b.attr_int("num_heads"), b.attr_int("kv_num_heads")
    q, k, v = _heads(b, "query", hq), _heads(b, "key", hkv), _heads(b, "value", hkv)
    cos, sin = rope_cos_sin(b, "positions", "inv_freq", b.attr_float("rope_scale"))
    half = b.op("Div", b.dim(q, -1), b.i64(2))
    q, k = rope_apply(b, q, cos, sin, half), rope_apply(b, k, cos, sin, half)
    k_all = b.op("Concat", "past_key", k, axis=2, out_names=["present_key"])
    v_all = b.op("Concat", "past_value", v, axis=2, out_names=["present_value"])
    out = dense_attention(b, q, k_all, v_all, b.attr_float("scale"))   # [B, Hq, T, D]
    b.op("Reshape", b.op("Transpose", out, perm=[0, 2, 1, 3]), b.op("Shape", "query"),
         out_names=["output"])
    attrs = [attribute("num_heads", "int", 1), attribute("kv_num_heads", "int", 1),
             attribute("scale", "float", 1.0), attribute("rope_scale", "float", 1.0)]
    return _function(ROTARY_GQA, ["query", "key", "value", "past_key", "past_value", "positions",
                                  "inv_freq"], ["output", "present_key", "present_value"], b,
                     attrs, "RoPE + causal grouped-query attention over a KV cache "
                            "(backends/onnx/fn_fused.py)")


FUNCTIONS = {RMS_NORM: rms_norm_function, SKIP_RMS_NORM: skip_rms_norm_function,
             ROTARY_GQA: rotary_gqa_function}
