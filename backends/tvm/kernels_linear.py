"""Linear layers as TE reductions (emitted with `BlockBuilder.emit_te`).

Why TE and not `relax.op.matmul` after a dequantise op: TVM's stock pipeline does not fuse a
dequantise into the matmul that follows it (MLC-LLM does, with its own passes). One reduction
whose body decodes the 4-bit code and scales it *inside the sum* is a single PrimFunc, so the
default pipeline (dlight's GEMV / reduction rules on GPUs) schedules it as one kernel that reads
the packed weight once and never writes a float copy.

    linear_f32(x [.., K], w [N, K])                        -> [.., N]
    linear_q4(x [.., K], codes u32 [N, K/8], scales f16|f32 [N, K/g], zeros? u8 [N, K/g])
                                                           -> [.., N]
Weight layout and formula: weights.py.
"""

from __future__ import annotations

from tvm import te
from tvm import tirx as tir

from .weights import SYM_ZERO


def _leading(x: te.Tensor) -> list:
    return list(x.shape[:-1])


def linear_f32(x: te.Tensor, w: te.Tensor, bias: te.Tensor | None = None) -> te.Tensor:
    """y[.., n] = sum_k x[.., k] * w[n, k] (+ bias[n]), fp32 accumulation."""
    k = te.reduce_axis((0, x.shape[-1]), "k")
    y = te.compute((*_leading(x), w.shape[0]),
                   lambda *i: te.sum(x[(*i[:-1], k)] * w[i[-1], k], axis=k), name="linear")
    if bias is None:
        return y
    return te.compute(y.shape, lambda *i: y[i] + bias[i[-1]], name="linear_bias")


def dequant_q4(codes: te.Tensor, scales: te.Tensor, zeros: te.Tensor | None, n, k,
               group: int):
    """fp32 value of W[n, k] read straight from the packed words (weights.py layout)."""
    word = codes[n, k // 8]
    code = (word >> (((k % 8) * 4).astype("uint32"))) & tir.const(15, "uint32")
    zero = zeros[n, k // group].astype("float32") if zeros is not None else \
        tir.const(float(SYM_ZERO), "float32")
    return (code.astype("float32") - zero) * scales[n, k // group].astype("float32")


def linear_q4(x: te.Tensor, codes: te.Tensor, scales: te.Tensor, zeros: te.Tensor | None = None,
              bias: te.Tensor | None = None) -> te.Tensor:
    """y[.., n] = sum_k x[.., k] * dequant(W)[n, k] (+ bias[n]) as ONE reduction."""
    k_total = x.shape[-1]
    group = int(k_total) // int(scales.shape[1])
    k = te.reduce_axis((0, k_total), "k")
    y = te.compute((*_leading(x), codes.shape[0]),
                   lambda *i: te.sum(x[(*i[:-1], k)] * dequant_q4(codes, scales, zeros, i[-1], k,
                                                                  group), axis=k),
                   name="q4_linear")
    if bias is None:
        return y
    return te.compute(y.shape, lambda *i: y[i] + bias[i[-1]], name="q4_linear_bias")
