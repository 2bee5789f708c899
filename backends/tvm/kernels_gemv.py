"""Decode's 4-bit linears in fp32 on the host build (llvm CPUs): one hand-built TIR expression per
output row, the way kernels_qact.py builds its integer ones, but with the activations kept in fp32.

A decode step multiplies one activation row by every 4-bit weight matrix. The TE reduction of
kernels_linear.py decodes each weight to `(code - zero) * scale` before its FMA (~7 AVX2
instructions per 8 weights). Here the scale and zero point leave the inner sum:

    y[n] = sum_g s[n, g] * (sum_{k in g} code[n, k] * x[k]  -  z[n, g] * xsum[g])   (+ bias)

so the inner loop is only "widen 8 code bytes, split their nibbles, convert, 2 FMAs" per 16
weights. Two functions:

    prepare_activations(x [1, 1, K] f32, group) -> xr f32 [K], xsum f32 [K/group]
        xr: per run of 16 columns, its 8 even columns then its 8 odd ones (the order in which 8
        packed code bytes yield their low and high nibbles); xsum[g] = sum of x over group g.
    q4_gemv_f32(...)(xr, xsum, codes u32 [N, K/8], scales [N, K/g], zeros? u8 [N, K/g],
                     bias? [N]) -> y [1, 1, N]
        per row: for each 16-column run, 8 code bytes widened to int32x8 (vpmovzxbd), low
        nibbles (& 15) and high nibbles (>> 4) converted to float32x8, multiplied with xr's
        two halves in one FMA chain per group, scaled by s[n, g]; the groups summed as a tree
        into one float32x8; 8 lanes added at the end, minus the zero-point terms. Rows in
        parallel (kernels_qact.row_parallel_gemv, the skeleton both GEMVs share). No
        loop-carried buffer: LLVM keeps the sums in registers.

Codes are weights.py's layout unchanged (column 8w + i in bits 4i..4i+3 of word w: byte j of a
row holds columns 2j (low nibble) and 2j + 1 (high nibble)). z = 8 for symmetric weights.
Results differ from the TE reduction by fp32 summation order only (tests compare both with a
numpy unpack: tests/backends/tvm/test_tvm_gemv.py).
"""

from __future__ import annotations

from tvm import relax, te
from tvm import tirx as tir

from .kernels_qact import call_gemv, row_parallel_gemv, tree_sum, zero_point

RUN = 16  # columns of one run: 8 code bytes, widened into one int32x8
HALF = RUN // 2


def supported(k: int, group: int) -> bool:
    """True when a [., K] weight with `group`-column scales splits into whole 16-column runs."""
    return k % RUN == 0 and group % RUN == 0


def prepare_activations(x: te.Tensor, group: int):
    """x [1, 1, K] f32 -> (xr f32 [K] in even/odd run order, xsum f32 [K/group])."""
    k_total = int(x.shape[-1])

    def column(p):   # the source column of stored position p: evens of the run, then odds
        r, i = p // RUN, p % RUN
        return r * RUN + tir.if_then_else(i < HALF, 2 * i, 2 * (i - HALF) + 1)

    xr = te.compute((k_total,), lambda p: x[0, 0, column(p)], name="act_runs")
    j = te.reduce_axis((0, group), "j")
    xsum = te.compute((k_total // group,), lambda g: te.sum(x[0, 0, g * group + j], axis=j),
                      name="act_group_sum")
    return xr, xsum


def q4_gemv_f32(n_rows: int, k: int, group: int, scale_dtype: str, zeros: bool,
                bias_dtype: str | None) -> tir.PrimFunc:
    """The PrimFunc described in the module doc, for a weight [n_rows, k] with `group`-column
    scales of `scale_dtype`, u8 zero points when `zeros` (else symmetric), an optional bias."""
    groups, runs_per_group = k // group, group // RUN
    xr = tir.decl_buffer((k,), "float32", "xr")
    xsum = tir.decl_buffer((groups,), "float32", "xsum")
    low4 = tir.Broadcast(tir.const(15, "int32"), HALF)
    four = tir.Broadcast(tir.const(4, "int32"), HALF)

    def row(n, code_bytes, scales, zp):
        scaled, corrections = [], []
        for g in range(groups):
            dot = None   # the group's FMA chain: one float32x8, runs in column order
            for r in range(g * runs_per_group, (g + 1) * runs_per_group):
                packed = tir.Cast("int32x8", tir.BufferLoad(
                    code_bytes, [n, tir.Ramp(tir.const(HALF * r, "int32"), 1, HALF)]))
                lo = tir.Cast("float32x8", tir.bitwise_and(packed, low4))
                hi = tir.Cast("float32x8", tir.shift_right(packed, four))
                x_even = tir.BufferLoad(xr, [tir.Ramp(tir.const(RUN * r, "int32"), 1, HALF)])
                x_odd = tir.BufferLoad(xr, [tir.Ramp(tir.const(RUN * r + HALF, "int32"), 1,
                                                     HALF)])
                dot = lo * x_even if dot is None else dot + lo * x_even
                dot = dot + hi * x_odd
            s = tir.Cast("float32", tir.BufferLoad(scales, [n, g]))
            scaled.append(dot * tir.Broadcast(s, HALF))
            corrections.append(s * zero_point(zp, n, g) * tir.BufferLoad(xsum, [g]))
        acc = tree_sum(scaled)
        lanes = [tir.Shuffle([acc], [tir.const(i, "int32")]) for i in range(HALF)]
        return tree_sum(lanes) - tree_sum(corrections)

    return row_parallel_gemv([xr, xsum], n_rows, k, group, scale_dtype, zeros, bias_dtype, row)


def emit_linear_q4_f32(bb: relax.BlockBuilder, x, codes, scales, zeros=None, bias=None,
                       funcs: dict | None = None, prepared: dict | None = None):
    """Emit prepare_activations on x [1, 1, K] and a call of q4_gemv_f32 (kernels_qact.call_gemv:
    one PrimFunc per weight shape, one prepared x per input); returns the call, [1, 1, N] f32."""
    n_rows, k = int(codes.ty.shape[0]), int(x.ty.shape[-1])
    group = k // int(scales.ty.shape[1])
    key = ("f32", n_rows, k, group, str(scales.ty.dtype), zeros is not None,
           None if bias is None else str(bias.ty.dtype))
    return call_gemv(bb, funcs, prepared, key, lambda: q4_gemv_f32(*key[1:]), "q4_gemv_f32",
                     (x, group), lambda: bb.emit_te(prepare_activations, x, group,
                                                    primfunc_name_hint="prepare_activations"),
                     [a for a in (codes, scales, zeros, bias) if a is not None], n_rows)
