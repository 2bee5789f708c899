"""Linear layers as TE reductions (emitted with `BlockBuilder.emit_te`).

Why TE and not `relax.op.matmul` after a dequantise op: TVM's stock pipeline does not fuse a
dequantise into the matmul that follows it (MLC-LLM does, with its own passes). One reduction
whose body decodes the 4-bit code and scales it *inside the sum* is a single PrimFunc, so the
default pipeline (dlight's GEMV / reduction rules on GPUs) schedules it as one kernel that reads
the packed weight once and never writes a float copy.

    linear_f32(x [.., K], w f32|f16 [N, K])                -> [.., N]
    linear_q4(x [.., K], codes u32 [N, K/8], scales f16|f32 [N, K/g], zeros? u8 [N, K/g])
                                                           -> [.., N]
    linear_q8(x [.., K], codes i8 [N, K], scales f16 [N, K/32]) -> [.., N]
    embed_q8(codes i8 [N, K], scales f16 [N, K/32], ids i64 [..]) -> f32 [.., K]
Weight layout and formula: weights.py.
"""

from __future__ import annotations

from tvm import te
from tvm import tirx as tir

from .weights import Q8_BLOCK, SYM_ZERO


def _leading(x: te.Tensor) -> list:
    return list(x.shape[:-1])


def linear_f32(x: te.Tensor, w: te.Tensor, bias: te.Tensor | None = None) -> te.Tensor:
    """y[.., n] = sum_k x[.., k] * w[n, k] (+ bias[n]), fp32 accumulation (w float32 or float16,
    widened in registers)."""
    k = te.reduce_axis((0, x.shape[-1]), "k")
    y = te.compute((*_leading(x), w.shape[0]),
                   lambda *i: te.sum(x[(*i[:-1], k)] * w[i[-1], k].astype("float32"), axis=k),
                   name="linear")
    if bias is None:
        return y
    return te.compute(y.shape, lambda *i: y[i] + bias[i[-1]], name="linear_bias")


def dequant_q4_word(codes: te.Tensor, scales: te.Tensor, zeros: te.Tensor | None, n, word,
                    lane, group: int):
    """fp32 value of W[n, 8*word + lane] read straight from the packed words (weights.py layout).

    Indexed by (word, lane) rather than by column, so no index needs a division by 8 and the
    group's scale is one scalar per word: LLVM turns the 8 lanes into one vector of variable
    shifts. The code is converted through int32 (AVX2 has no unsigned-int-to-float)."""
    per_group = group // 8
    code = (codes[n, word] >> (lane * 4).astype("uint32")) & tir.const(15, "uint32")
    zero = zeros[n, word // per_group].astype("float32") if zeros is not None else \
        tir.const(float(SYM_ZERO), "float32")
    return (code.astype("int32").astype("float32") - zero) * \
        scales[n, word // per_group].astype("float32")


def linear_q4(x: te.Tensor, codes: te.Tensor, scales: te.Tensor, zeros: te.Tensor | None = None,
              bias: te.Tensor | None = None) -> te.Tensor:
    """y[.., n] = sum_{word, lane} x[.., 8*word + lane] * dequant(W)[n, 8*word + lane] (+ bias[n])
    as ONE reduction over two axes (word, lane): the lane axis is what cpu_schedule.LinearRows
    keeps as 8 vector partial sums."""
    k_total = x.shape[-1]
    group = int(k_total) // int(scales.shape[1])
    word = te.reduce_axis((0, codes.shape[1]), "kw")
    lane = te.reduce_axis((0, 8), "kl")
    y = te.compute((*_leading(x), codes.shape[0]),
                   lambda *i: te.sum(x[(*i[:-1], word * 8 + lane)]
                                     * dequant_q4_word(codes, scales, zeros, i[-1], word, lane,
                                                       group), axis=[word, lane]),
                   name="q4_linear")
    if bias is None:
        return y
    return te.compute(y.shape, lambda *i: y[i] + bias[i[-1]], name="q4_linear_bias")


def dequant_q8(codes: te.Tensor, scales: te.Tensor, n, k):
    """fp32 value of a Q8_0 matrix's W[n, k] = codes[n, k] * scales[n, k // 32] (weights.py)."""
    return codes[n, k].astype("float32") * scales[n, k // Q8_BLOCK].astype("float32")


def linear_q8(x: te.Tensor, codes: te.Tensor, scales: te.Tensor,
              bias: te.Tensor | None = None) -> te.Tensor:
    """y[.., n] = sum_k x[.., k] * codes[n, k] * scales[n, k // 32] (+ bias[n]): the Q8_0 float
    matrices' linear (a tied lm_head) as one reduction over k, fp32 accumulation."""
    k = te.reduce_axis((0, x.shape[-1]), "k")
    y = te.compute((*_leading(x), codes.shape[0]),
                   lambda *i: te.sum(x[(*i[:-1], k)] * dequant_q8(codes, scales, i[-1], k),
                                     axis=k), name="q8_linear")
    if bias is None:
        return y
    return te.compute(y.shape, lambda *i: y[i] + bias[i[-1]], name="q8_linear_bias")


def embed_q8(codes: te.Tensor, scales: te.Tensor, ids: te.Tensor) -> te.Tensor:
    """Rows `ids` of a Q8_0 embedding, dequantised to fp32 [*ids.shape, K]; ids are clipped to
    [0, N - 1] as relax's take(mode="clip") does for a float table."""
    n_rows = codes.shape[0]

    def row(*i):
        return tir.max(tir.min(ids[i[:-1]], n_rows - 1), 0)

    return te.compute((*ids.shape, codes.shape[1]),
                      lambda *i: dequant_q8(codes, scales, row(*i), i[-1]), name="embed_q8")
