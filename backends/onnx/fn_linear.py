"""Quantised linears as `arkinfer`-domain ONNX local functions whose bodies unpack the stored
integers with standard ops (Cast, BitShift, BitwiseAnd, Gather, Reshape, Transpose) and multiply.
TensorRT swaps in a plugin by name; onnxruntime runs the body (or the host runner replaces the node
with com.microsoft.MatMulNBits, see contrib.py).

    MarlinLinear(x [.., K], B int32 [K/16, 2N], s f16 [G, N]) -> [.., N]
        attributes in_features K, out_features N, group_size (-1 = per channel)
        codes: B unpacked 8 nibbles per int32 (value i at bits 4i), each chunk of 1024 values
        gathered through the inverse of Marlin's PERM, 16x16 tiles transposed back; scales rows of
        64 gathered through the inverse SCALE_PERM (grouped) or SCALE_PERM_SINGLE (per channel);
        W[k, n] = s[k // group, n] * (code - 8)                   (quant/formats/marlin.py)

    Int4Linear(x [.., K], qweight, qzeros, scales f16 [G, N], g_idx int32 [K]) -> [.., N]
        attributes layout ("gptq" | "awq"), bits (4), group_size, in_features, out_features
        gptq: qweight int32 [K/8, N] packed along K, qzeros int32 [G, N/8] storing zero - 1
        awq:  qweight int32 [K, N/8] packed along N in nibble order [0,2,4,6,1,3,5,7],
              qzeros int32 [G, N/8] as-is; g_idx is k // group_size (written by the lowering)
        W[k, n] = scales[g_idx[k], n] * (code[k, n] - zero[g_idx[k], n])

Dequantisation is in float32 and exact (f16 scales widen exactly, codes are small integers), so
the product is the `QuantizedWeight.dequantize()` of the same checkpoint bit for bit.
"""

from __future__ import annotations

import numpy as np
from arkinfer.quant.formats.awq import AWQ_ORDER
from arkinfer.quant.formats.marlin import PERM, SCALE_PERM, SCALE_PERM_SINGLE
from onnx import FunctionProto, TensorProto, helper

from .onnx_build import DOMAIN, OPSET, NodeBuilder, attribute

MARLIN = "MarlinLinear"
INT4 = "Int4Linear"
_SHIFTS = np.arange(8, dtype=np.uint32) * 4


def _nibbles(b: NodeBuilder, words: str, axis: int) -> str:
    """int32 words -> uint8-valued int64 nibbles with a new axis of 8 inserted at `axis`
    (nibble i = bits 4i..4i+3)."""
    u = b.op("Cast", words, to=TensorProto.UINT32)
    u = b.op("Unsqueeze", u, b.i64(axis))
    shifts = _SHIFTS.reshape([8 if i == axis else 1 for i in range(3)])
    nib = b.op("BitwiseAnd", b.op("BitShift", u, b.const(shifts), direction="RIGHT"),
               b.const(np.uint32(15)))
    return b.op("Cast", nib, to=TensorProto.FLOAT)


def _marlin_scale_perms() -> np.ndarray:
    """[2, 64]: row 0 inverts SCALE_PERM (grouped), row 1 SCALE_PERM_SINGLE on both halves of 64
    (per channel: rows of 32; n % 64 == 0 so rows of 64 hold two of them)."""
    single = np.concatenate([np.argsort(SCALE_PERM_SINGLE), np.argsort(SCALE_PERM_SINGLE) + 32])
    return np.stack([np.argsort(SCALE_PERM), single]).astype(np.int64)


def marlin_function() -> FunctionProto:
    b = NodeBuilder("ml")
    k16, n2 = b.dim("B", 0), b.dim("B", 1)
    n = b.op("Div", n2, b.i64(2))
    nib = _nibbles(b, "B", 2)                                         # [K/16, 2N, 8]
    tiles = b.op("Reshape", nib, b.i64(-1, PERM.size))
    tiles = b.op("Gather", tiles, b.const(np.argsort(PERM).astype(np.int64)), axis=1)
    n16 = b.op("Div", n, b.i64(16))
    tiles = b.op("Reshape", tiles, b.op("Concat", k16, n16, b.i64(16, 16), axis=0))
    tiles = b.op("Transpose", tiles, perm=[0, 2, 1, 3])
    codes = b.op("Reshape", tiles, b.op("Concat", b.i64(-1), n, axis=0))     # [K, N]
    groups = b.dim("s", 0)
    single = b.op("Cast", b.op("Equal", groups, b.i64(1)), to=TensorProto.INT64)
    perm = b.op("Gather", b.const(_marlin_scale_perms()), b.scalar0(single), axis=0)
    s = b.op("Reshape", b.op("Cast", "s", to=TensorProto.FLOAT), b.i64(-1, 64))
    s = b.op("Reshape", b.op("Gather", s, perm, axis=1), b.op("Shape", "s"))  # [G, N]
    w = b.op("Reshape", b.op("Sub", codes, b.f32(8.0)),
             b.op("Concat", groups, b.i64(-1), n, axis=0))
    w = b.op("Mul", w, b.op("Unsqueeze", s, b.i64(1)))
    w = b.op("Reshape", w, b.op("Concat", b.i64(-1), n, axis=0))      # [K, N]
    b.op("MatMul", "x", b.op("CastLike", w, "x"), out_names=["y"])
    attrs = [attribute("in_features", "int", 0), attribute("out_features", "int", 0),
             attribute("group_size", "int", 128)]
    return helper.make_function(DOMAIN, MARLIN, ["x", "B", "s"], ["y"], b.nodes,
                                [helper.make_opsetid("", OPSET)], attribute_protos=attrs,
                                doc_string="Marlin 4-bit linear (see backends/onnx/fn_linear.py)")


def _branch(name: str, b: NodeBuilder, codes: str, zeros: str) -> helper.GraphProto:
    outs = [helper.make_tensor_value_info(codes, TensorProto.FLOAT, None),
            helper.make_tensor_value_info(zeros, TensorProto.FLOAT, None)]
    return helper.make_graph(b.nodes, name, [], outs)


def _gptq_branch() -> helper.GraphProto:
    b = NodeBuilder("i4/gptq")
    n = b.dim("qweight", 1)
    codes = b.op("Reshape", _nibbles(b, "qweight", 1), b.op("Concat", b.i64(-1), n, axis=0))
    zeros = b.op("Reshape", _nibbles(b, "qzeros", 2), b.op("Concat", b.dim("qzeros", 0),
                                                           b.i64(-1), axis=0))
    zeros = b.op("Add", zeros, b.f32(1.0), out_names=["i4/gptq/zeros"])
    codes = b.op("Identity", codes, out_names=["i4/gptq/codes"])
    return _branch("gptq", b, codes, zeros)


def _awq_branch() -> helper.GraphProto:
    b = NodeBuilder("i4/awq")
    inv = b.const(np.argsort(AWQ_ORDER).astype(np.int64))

    def unpack(words: str, out: str) -> str:
        slots = b.op("Gather", _nibbles(b, words, 2), inv, axis=2)    # [rows, N/8, 8]
        return b.op("Reshape", slots, b.op("Concat", b.dim(words, 0), b.i64(-1), axis=0),
                    out_names=[out])

    return _branch("awq", b, unpack("qweight", "i4/awq/codes"), unpack("qzeros", "i4/awq/zeros"))


def int4_function() -> FunctionProto:
    b = NodeBuilder("i4")
    ref = helper.make_attribute_ref("value_string", helper.AttributeProto.STRING)
    ref.ref_attr_name = "layout"
    layout = helper.make_node("Constant", [], ["i4/layout"], name="i4/layout_node")
    layout.attribute.append(ref)
    b.node(layout)
    is_awq = b.op("Equal", "i4/layout", b.const(np.array("awq", dtype=object)))
    codes, zeros = b.op("If", is_awq, outputs=2, then_branch=_awq_branch(),
                        else_branch=_gptq_branch())                   # [K, N], [G, N]
    scales = b.op("Cast", "scales", to=TensorProto.FLOAT)
    g = b.op("Cast", "g_idx", to=TensorProto.INT64)
    w = b.op("Mul", b.op("Sub", codes, b.op("Gather", zeros, g, axis=0)),
             b.op("Gather", scales, g, axis=0))
    b.op("MatMul", "x", b.op("CastLike", w, "x"), out_names=["y"])
    attrs = [attribute("layout", "string", "gptq"), attribute("bits", "int", 4),
             attribute("group_size", "int", 128), attribute("in_features", "int", 0),
             attribute("out_features", "int", 0)]
    return helper.make_function(DOMAIN, INT4, ["x", "qweight", "qzeros", "scales", "g_idx"], ["y"],
                                b.nodes, [helper.make_opsetid("", OPSET)], attribute_protos=attrs,
                                doc_string="GPTQ / AWQ 4-bit linear (backends/onnx/fn_linear.py)")
