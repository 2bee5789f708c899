"""Decode's 4-bit linears with 8-bit activations on x86 (the host build's
`--option decode_activations=int8`): llama.cpp's Q4_0 x Q8_0 scheme, written for TVM.

A decode step multiplies one activation row by every 4-bit weight matrix. Decoding each nibble to
fp32 and using fp32 FMAs costs ~7 AVX2 instructions per 8 weights; with the activation quantised
to int8 per 32 values, SSSE3's `pmaddubsw` multiplies 16 unsigned nibbles by 16 signed bytes and
adds neighbours in one instruction, so a 32-weight block is ~12 128-bit instructions:

    quantize_activations(x [1, 1, K] f32) -> xq int8 [K], xs f32 [K/32], xsum int32 [K/32]
        per block b of 32: xs = max|x| / 127, q = round(x * 127 / max|x|) (0 for an all-zero
        block), stored as the block's 16 even columns then its 16 odd ones (the order in which
        a packed 16-byte run of codes yields its low and high nibbles); xsum = sum of q.
    q4_gemv_int8(...)(xq, xs, xsum, codes u32 [N, K/8], scales [N, K/g], zeros? u8 [N, K/g],
                      bias? [N]) -> y [1, 1, N]
        y[n] = sum_b s[n, b] * xs[b] * (sum_k code[n, k] * q[k] - z[n, b] * xsum[b])  (+ bias)
        with z = 8 for symmetric weights (weights.py's SYM_ZERO); one TIR expression per row
        (pmaddubsw -> pmaddwd -> 4 int32 lanes -> fp32 FMA per block, summed as a tree), rows in
        parallel. No loop-carried buffer: LLVM keeps the sums in registers.

The codes are weights.py's layout unchanged (column 8w + i in bits 4i..4i+3 of word w): the 16
bytes of block b hold columns 32b + 2j (low nibble of byte j) and 32b + 2j + 1 (high nibble).
Error: the activations are rounded to 8 bits per 32 values (as llama.cpp's CPU path does); the
result is exact for those rounded activations (integer dot products, fp32 scaling), checked in
tests/backends/tvm/test_tvm_int8.py against a numpy unpack.
"""

from __future__ import annotations

from tvm import relax, te
from tvm import tirx as tir
from tvm.target import Target

from .weights import SYM_ZERO

BLOCK = 32  # activation values per int8 scale; one packed 16-byte run of codes


def supported(target: Target, k: int, group: int) -> bool:
    """True when this int8 path can build for `target` (x86-64 llvm: SSSE3 and SSE2) and a
    [., K] weight with `group`-column scales (K and the group multiples of 32)."""
    triple = str(target.attrs.get("mtriple", ""))
    x86 = target.kind.name == "llvm" and (not triple or triple.startswith("x86_64"))
    return x86 and k % BLOCK == 0 and group % BLOCK == 0


def quantize_activations(x: te.Tensor):
    """x [1, 1, K] f32 -> (xq int8 [K] in even/odd block order, xs f32 [K/32], xsum int32 [K/32])."""
    k_total = int(x.shape[-1])
    blocks = k_total // BLOCK

    def val(p):
        return x[0, 0, p]

    j = te.reduce_axis((0, BLOCK), "j")
    amax = te.compute((blocks,), lambda b: te.max(tir.abs(val(b * BLOCK + j)), axis=j),
                      name="act_amax")
    xs = te.compute((blocks,), lambda b: amax[b] / tir.const(127.0, "float32"), name="act_scale")
    inv = te.compute((blocks,), lambda b: tir.if_then_else(
        amax[b] > tir.const(0.0, "float32"), tir.const(127.0, "float32") / amax[b],
        tir.const(0.0, "float32")), name="act_inv")

    def column(p):   # the source column of stored position p: evens of the block, then odds
        b, i = p // BLOCK, p % BLOCK
        return b * BLOCK + tir.if_then_else(i < BLOCK // 2, 2 * i, 2 * (i - BLOCK // 2) + 1)

    xq = te.compute((k_total,), lambda p: tir.round(val(column(p)) * inv[p // BLOCK])
                    .astype("int32").astype("int8"), name="act_q")
    jj = te.reduce_axis((0, BLOCK), "jj")
    xsum = te.compute((blocks,), lambda b: te.sum(xq[b * BLOCK + jj].astype("int32"), axis=jj),
                      name="act_qsum")
    return xq, xs, xsum


def _tree_sum(terms: list):
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def q4_gemv_int8(n_rows: int, k: int, group: int, scale_dtype: str, zeros: bool,
                 bias_dtype: str | None) -> tir.PrimFunc:
    """The PrimFunc described in the module doc, for a weight [n_rows, k] with `group`-column
    scales of `scale_dtype`, u8 zero points when `zeros` (else symmetric), an optional bias."""
    blocks, per_group = k // BLOCK, group // BLOCK
    xq = tir.decl_buffer((k,), "int8", "xq")
    xs = tir.decl_buffer((blocks,), "float32", "xs")
    xsum = tir.decl_buffer((blocks,), "int32", "xsum")
    codes = tir.decl_buffer((n_rows, k // 8), "uint32", "codes")
    code_bytes = tir.decl_buffer((n_rows, k // 2), "uint8", "code_bytes", data=codes.data)
    scales = tir.decl_buffer((n_rows, k // group), scale_dtype, "scales")
    zp = tir.decl_buffer((n_rows, k // group), "uint8", "zeros") if zeros else None
    bias = tir.decl_buffer((n_rows,), bias_dtype, "bias") if bias_dtype else None
    y = tir.decl_buffer((1, 1, n_rows), "float32", "y")
    n = tir.Var("n", "int32")
    low4 = tir.Broadcast(tir.const(15, "uint8"), 16)
    ones = tir.Broadcast(tir.const(1, "int16"), 8)
    sums, corrections = [], []
    for b in range(blocks):
        packed = tir.BufferLoad(code_bytes, [n, tir.Ramp(tir.const(16 * b, "int32"), 1, 16)])
        lo = tir.bitwise_and(packed, low4)
        hi = tir.bitwise_and(tir.shift_right(packed, tir.Broadcast(tir.const(4, "uint8"), 16)), low4)
        x_even = tir.BufferLoad(xq, [tir.Ramp(tir.const(BLOCK * b, "int32"), 1, 16)])
        x_odd = tir.BufferLoad(xq, [tir.Ramp(tir.const(BLOCK * b + 16, "int32"), 1, 16)])
        pairs = (tir.call_llvm_pure_intrin("int16x8", "llvm.x86.ssse3.pmadd.ub.sw.128", lo, x_even)
                 + tir.call_llvm_pure_intrin("int16x8", "llvm.x86.ssse3.pmadd.ub.sw.128", hi, x_odd))
        dot = tir.call_llvm_pure_intrin("int32x4", "llvm.x86.sse2.pmadd.wd", pairs, ones)
        g = b // per_group
        s = tir.Cast("float32", tir.BufferLoad(scales, [n, g])) * tir.BufferLoad(xs, [b])
        sums.append(tir.Cast("float32x4", dot) * tir.Broadcast(s, 4))
        zero = tir.Cast("float32", tir.BufferLoad(zp, [n, g])) if zp is not None else \
            tir.const(float(SYM_ZERO), "float32")
        corrections.append(s * zero * tir.Cast("float32", tir.BufferLoad(xsum, [b])))
    acc = _tree_sum(sums)
    lanes = [tir.Shuffle([acc], [tir.const(i, "int32")]) for i in range(4)]
    total = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]) - _tree_sum(corrections)
    if bias is not None:
        total = total + tir.Cast("float32", tir.BufferLoad(bias, [n]))
    loop = tir.For(n, 0, n_rows, tir.ForKind.PARALLEL,
                   tir.BufferStore(y, total, [tir.const(0, "int32"), tir.const(0, "int32"), n]))
    body = tir.SeqStmt([tir.DeclBuffer(code_bytes, data=codes.data), loop])
    buffers = [xq, xs, xsum, codes, scales] + ([zp] if zp is not None else []) + \
        ([bias] if bias is not None else []) + [y]
    # op_pattern 8 = kOpaque: relax FuseOps leaves it alone (it has no block to fuse into)
    return tir.PrimFunc(buffers, body).with_attr({"tirx.noalias": True, "tirx.is_scheduled": True,
                                                  "op_pattern": 8})


def emit_linear_q4_int8(bb: relax.BlockBuilder, x, codes, scales, zeros=None, bias=None,
                        funcs: dict | None = None):
    """Emit quantize_activations on x [1, 1, K] and a call of q4_gemv_int8 (one PrimFunc per
    weight shape, shared through `funcs`); returns the call, [1, 1, N] float32."""
    funcs = {} if funcs is None else funcs
    n_rows, k = int(codes.ty.shape[0]), int(x.ty.shape[-1])
    key = (n_rows, k, k // int(scales.ty.shape[1]), str(scales.ty.dtype), zeros is not None,
           None if bias is None else str(bias.ty.dtype))
    if key not in funcs:
        funcs[key] = bb.add_func(q4_gemv_int8(*key), "q4_gemv_int8")
    q = bb.emit_te(quantize_activations, x, primfunc_name_hint="quantize_activations")
    args = [bb.emit(relax.TupleGetItem(q, i)) for i in range(3)]
    args += [codes, scales] + [a for a in (zeros, bias) if a is not None]
    return relax.call_tir(funcs[key], args, relax.TensorType((1, 1, n_rows), "float32"))
