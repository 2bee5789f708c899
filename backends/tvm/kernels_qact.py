"""Decode's 4-bit linears with quantised activations on x86 (the host build's
`--option decode_activations=int16`, the default, or `int8`): llama.cpp's Q4_0 x Q8_0 scheme,
written for TVM, and the same with 16-bit activations.

A decode step multiplies one activation row by every 4-bit weight matrix. Decoding each nibble to
fp32 and using fp32 FMAs costs ~7 AVX2 instructions per 8 weights (kernels_gemv.py: ~3.5 with
the scales outside the sum). Rounded to integers per 32 values, the activations multiply the
codes in integer SIMD instead:

    quantize_activations(x [1, 1, K] f32, bits) -> xq int<bits> [K], xs f32 [K/32],
                                                   xsum int32 [K/32]
        per block b of 32: qmax = 2^(bits-1) - 1 (127 or 32767), xs = max|x| / qmax,
        q = round(x * qmax / max|x|) (0 for an all-zero block), stored as the block's 16 even
        columns then its 16 odd ones (the order in which a packed 16-byte run of codes yields its
        low and high nibbles); xsum = sum of q.
    q4_gemv_qact(...)(xq, xs, xsum, codes u32 [N, K/8], scales [N, K/g], zeros? u8 [N, K/g],
                      bias? [N]) -> y [1, 1, N]
        y[n] = sum_b s[n, b] * xs[b] * (sum_k code[n, k] * q[k] - z[n, b] * xsum[b])  (+ bias)
        with z = 8 for symmetric weights (weights.py's SYM_ZERO). Per block, int8: SSSE3's
        `pmaddubsw` multiplies 16 nibbles by 16 int8 values and adds neighbours, twice, then
        `pmaddwd` -> 4 int32 lanes (~12 128-bit instructions per 32 weights); int16: 8 code
        bytes at a time widened to int16 (`pmovzxbw`), split into nibbles, 4 `pmaddwd` (~15).
        Then an fp32 FMA per block; one TIR expression per row, blocks summed as a tree, rows in
        parallel. No loop-carried buffer: LLVM keeps the sums in registers.

A Q8_0 float matrix (weights.py, `float_weights=q8`: the lm_head) takes the same activations
in their natural order (`interleave=False`): q8_gemv_qact sign-extends 16 int8 codes at a time
to int16 (`vpmovsxbw`) and `vpmaddwd`s them with 16 activations widened to int16, 2 per block
(AVX2; 8 at a time and 4 per block with SSE2's `pmaddwd` on older x86), then an fp32 FMA with
the block's two scales; exact integer sums (|sum| < 32 x 127 x 32767 < 2^31).

The codes are weights.py's layout unchanged (column 8w + i in bits 4i..4i+3 of word w): the 16
bytes of block b hold columns 32b + 2j (low nibble of byte j) and 32b + 2j + 1 (high nibble).
Error: only the activations' rounding, to 1 part in 2 * qmax of their block's largest value
(int16: 1.5e-5, finer than fp16 activations; int8: 3.9e-3, as llama.cpp's CPU path); the sums
are exact integers scaled in fp32. Checked in tests/backends/tvm/test_tvm_qact.py against a
numpy unpack; decode top-1 against the reference: benchmarks/decode_agreement.py.
"""

from __future__ import annotations

from tvm import relax, te
from tvm import tirx as tir
from tvm.target import Target

from .weights import SYM_ZERO

BLOCK = 32  # activation values per scale; one packed 16-byte run of codes
BITS = (16, 8)  # the activation widths; SSSE3 + SSE2 (pmaddubsw, pmaddwd) for both


def supported(target: Target, k: int, group: int) -> bool:
    """True when this path (either width) builds for `target` (x86-64 llvm: SSSE3 and SSE2)
    and a [., K] weight with `group`-column scales (K and the group multiples of 32)."""
    triple = str(target.attrs.get("mtriple", ""))
    x86 = target.kind.name == "llvm" and (not triple or triple.startswith("x86_64"))
    return x86 and k % BLOCK == 0 and group % BLOCK == 0


def quantize_activations(x: te.Tensor, bits: int = 8, interleave: bool = True):
    """x [1, 1, K] f32 -> (xq int<bits> [K] in even/odd block order, or the natural order with
    interleave=False (the Q8_0 GEMV's), xs f32 [K/32], xsum int32 [K/32]); bits 8 or 16
    (qmax 127 or 32767)."""
    k_total = int(x.shape[-1])
    qmax, qtype = tir.const(float(2 ** (bits - 1) - 1), "float32"), f"int{bits}"
    blocks = k_total // BLOCK

    def val(p):
        return x[0, 0, p]

    j = te.reduce_axis((0, BLOCK), "j")
    amax = te.compute((blocks,), lambda b: te.max(tir.abs(val(b * BLOCK + j)), axis=j),
                      name="act_amax")
    xs = te.compute((blocks,), lambda b: amax[b] / qmax, name="act_scale")
    inv = te.compute((blocks,), lambda b: tir.if_then_else(
        amax[b] > tir.const(0.0, "float32"), qmax / amax[b],
        tir.const(0.0, "float32")), name="act_inv")

    def column(p):   # the source column of stored position p: evens of the block, then odds
        if not interleave:
            return p
        b, i = p // BLOCK, p % BLOCK
        return b * BLOCK + tir.if_then_else(i < BLOCK // 2, 2 * i, 2 * (i - BLOCK // 2) + 1)

    xq = te.compute((k_total,), lambda p: tir.round(val(column(p)) * inv[p // BLOCK])
                    .astype("int32").astype(qtype), name="act_q")
    jj = te.reduce_axis((0, BLOCK), "jj")
    xsum = te.compute((blocks,), lambda b: te.sum(xq[b * BLOCK + jj].astype("int32"), axis=jj),
                      name="act_qsum")
    return xq, xs, xsum


def tree_sum(terms: list):
    """Sum of `terms` as a balanced tree (independent adds: no serial dependency chain)."""
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def _dot_int8(code_bytes, xq, n, b):
    """int32x4 partial sums of block b: pmaddubsw (16 nibbles x 16 int8) twice, pmaddwd."""
    low4 = tir.Broadcast(tir.const(15, "uint8"), 16)
    packed = tir.BufferLoad(code_bytes, [n, tir.Ramp(tir.const(16 * b, "int32"), 1, 16)])
    lo = tir.bitwise_and(packed, low4)
    hi = tir.bitwise_and(tir.shift_right(packed, tir.Broadcast(tir.const(4, "uint8"), 16)), low4)
    x_even = tir.BufferLoad(xq, [tir.Ramp(tir.const(BLOCK * b, "int32"), 1, 16)])
    x_odd = tir.BufferLoad(xq, [tir.Ramp(tir.const(BLOCK * b + 16, "int32"), 1, 16)])
    pairs = (tir.call_llvm_pure_intrin("int16x8", "llvm.x86.ssse3.pmadd.ub.sw.128", lo, x_even)
             + tir.call_llvm_pure_intrin("int16x8", "llvm.x86.ssse3.pmadd.ub.sw.128", hi, x_odd))
    return tir.call_llvm_pure_intrin("int32x4", "llvm.x86.sse2.pmadd.wd", pairs,
                                     tir.Broadcast(tir.const(1, "int16"), 8))


def _dot_int16(code_bytes, xq, n, b):
    """int32x4 partial sums of block b: 8 code bytes at a time widened to int16x8, split into
    low and high nibbles, each pmaddwd'ed with 8 int16 activations."""
    low4, four = tir.Broadcast(tir.const(15, "int16"), 8), tir.Broadcast(tir.const(4, "int16"), 8)
    terms = []
    for half in range(2):
        codes = tir.Cast("int16x8", tir.BufferLoad(
            code_bytes, [n, tir.Ramp(tir.const(16 * b + 8 * half, "int32"), 1, 8)]))
        for nibble, x_at in ((tir.bitwise_and(codes, low4), 0),
                             (tir.shift_right(codes, four), 16)):
            xv = tir.BufferLoad(xq, [tir.Ramp(tir.const(BLOCK * b + x_at + 8 * half, "int32"),
                                              1, 8)])
            terms.append(tir.call_llvm_pure_intrin("int32x4", "llvm.x86.sse2.pmadd.wd",
                                                   nibble, xv))
    return tree_sum(terms)


def row_parallel_gemv(activations: list, n_rows: int, k: int, group: int, scale_dtype: str,
                      zeros: bool, bias_dtype: str | None, row) -> tir.PrimFunc:
    """The PrimFunc skeleton both hand-built GEMVs share: parameters (*activations, codes u32
    [N, K/8], scales [N, K/g], zeros? u8 [N, K/g], bias? [N], y f32 [1, 1, N]), the codes also
    viewed as bytes (code_bytes u8 [N, K/2], a DeclBuffer on the same data), and one parallel
    loop over rows storing y[0, 0, n] = row(n, code_bytes, scales, zeros | None) (+ bias[n])."""
    codes = tir.decl_buffer((n_rows, k // 8), "uint32", "codes")
    code_bytes = tir.decl_buffer((n_rows, k // 2), "uint8", "code_bytes", data=codes.data)
    scales = tir.decl_buffer((n_rows, k // group), scale_dtype, "scales")
    zp = tir.decl_buffer((n_rows, k // group), "uint8", "zeros") if zeros else None
    bias = tir.decl_buffer((n_rows,), bias_dtype, "bias") if bias_dtype else None
    y = tir.decl_buffer((1, 1, n_rows), "float32", "y")
    n = tir.Var("n", "int32")
    total = row(n, code_bytes, scales, zp)
    if bias is not None:
        total = total + tir.Cast("float32", tir.BufferLoad(bias, [n]))
    loop = tir.For(n, 0, n_rows, tir.ForKind.PARALLEL,
                   tir.BufferStore(y, total, [tir.const(0, "int32"), tir.const(0, "int32"), n]))
    body = tir.SeqStmt([tir.DeclBuffer(code_bytes, data=codes.data), loop])
    buffers = [*activations, codes, scales] + [b for b in (zp, bias) if b is not None] + [y]
    # op_pattern 8 = kOpaque: relax FuseOps leaves it alone (it has no block to fuse into)
    return tir.PrimFunc(buffers, body).with_attr({"tirx.noalias": True, "tirx.is_scheduled": True,
                                                  "op_pattern": 8})


def zero_point(zp, n, g):
    """fp32 zero point of row n, group g: the stored u8, or SYM_ZERO for symmetric weights."""
    return tir.Cast("float32", tir.BufferLoad(zp, [n, g])) if zp is not None else \
        tir.const(float(SYM_ZERO), "float32")


def q4_gemv_qact(n_rows: int, k: int, group: int, scale_dtype: str, zeros: bool,
                 bias_dtype: str | None, bits: int = 8) -> tir.PrimFunc:
    """The PrimFunc described in the module doc, for a weight [n_rows, k] with `group`-column
    scales of `scale_dtype`, u8 zero points when `zeros` (else symmetric), an optional bias.
    (A 256-bit AVX2 form of the int16 dot, 2 vpmaddwd per block, timed slower on Zen 3 in a
    one-off comparison and not kept.)"""
    blocks, per_group = k // BLOCK, group // BLOCK
    xq = tir.decl_buffer((k,), f"int{bits}", "xq")
    xs = tir.decl_buffer((blocks,), "float32", "xs")
    xsum = tir.decl_buffer((blocks,), "int32", "xsum")
    block_dot = _dot_int8 if bits == 8 else _dot_int16

    def row(n, code_bytes, scales, zp):
        sums, corrections = [], []
        for b in range(blocks):
            dot = block_dot(code_bytes, xq, n, b)
            g = b // per_group
            s = tir.Cast("float32", tir.BufferLoad(scales, [n, g])) * tir.BufferLoad(xs, [b])
            sums.append(tir.Cast("float32x4", dot) * tir.Broadcast(s, 4))
            corrections.append(s * zero_point(zp, n, g)
                               * tir.Cast("float32", tir.BufferLoad(xsum, [b])))
        acc = tree_sum(sums)
        lanes = [tir.Shuffle([acc], [tir.const(i, "int32")]) for i in range(4)]
        return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]) - tree_sum(corrections)

    return row_parallel_gemv([xq, xs, xsum], n_rows, k, group, scale_dtype, zeros, bias_dtype,
                             row)


def q8_gemv_qact(n_rows: int, k: int, bias_dtype: str | None, bits: int = 16,
                 wide: bool = False) -> tir.PrimFunc:
    """y [1, 1, N] = x @ W.T (+ bias) for a Q8_0 matrix W (codes i8 [N, K], scales f16
    [N, K/32]) and x quantised by quantize_activations(x, bits, interleave=False): per row,
    sum_b scales[n, b] * xs[b] * (sum_k codes[n, k] * xq[k]), the integer sums as 2 vpmaddwd of
    int16x16 per block with `wide` (AVX2), else 4 pmaddwd of int16x8, blocks as a tree, rows in
    parallel. 49152 x 576 on Zen 3 (benchmarks/tvm_decode_parts.py): one thread 2.25 ms wide
    against 2.67; two threads 1.2-1.6 ms either way (the 28 MB of codes bound it)."""
    blocks = k // BLOCK
    xq = tir.decl_buffer((k,), f"int{bits}", "xq")
    xs = tir.decl_buffer((blocks,), "float32", "xs")
    xsum = tir.decl_buffer((blocks,), "int32", "xsum")   # unused: Q8_0 has no zero point
    codes = tir.decl_buffer((n_rows, k), "int8", "codes")
    scales = tir.decl_buffer((n_rows, blocks), "float16", "scales")
    bias = tir.decl_buffer((n_rows,), bias_dtype, "bias") if bias_dtype else None
    y = tir.decl_buffer((1, 1, n_rows), "float32", "y")
    n = tir.Var("n", "int32")
    width = 16 if wide else 8            # int16 lanes per pmaddwd: ymm (AVX2) or xmm (SSE2)
    madd = "llvm.x86.avx2.pmadd.wd" if wide else "llvm.x86.sse2.pmadd.wd"
    out = width // 2
    sums = []
    for b in range(blocks):
        terms = []
        for h in range(BLOCK // width):
            at = tir.Ramp(tir.const(BLOCK * b + width * h, "int32"), 1, width)
            c = tir.Cast(f"int16x{width}", tir.BufferLoad(codes, [n, at]))
            xv = tir.BufferLoad(xq, [at])
            if bits != 16:
                xv = tir.Cast(f"int16x{width}", xv)
            terms.append(tir.call_llvm_pure_intrin(f"int32x{out}", madd, c, xv))
        s = tir.Cast("float32", tir.BufferLoad(scales, [n, b])) * tir.BufferLoad(xs, [b])
        sums.append(tir.Cast(f"float32x{out}", tree_sum(terms)) * tir.Broadcast(s, out))
    acc = tree_sum(sums)
    lanes = [tir.Shuffle([acc], [tir.const(i, "int32")]) for i in range(out)]
    total = tree_sum(lanes)
    if bias is not None:
        total = total + tir.Cast("float32", tir.BufferLoad(bias, [n]))
    loop = tir.For(n, 0, n_rows, tir.ForKind.PARALLEL,
                   tir.BufferStore(y, total, [tir.const(0, "int32"), tir.const(0, "int32"), n]))
    buffers = [xq, xs, xsum, codes, scales] + ([bias] if bias is not None else []) + [y]
    return tir.PrimFunc(buffers, loop).with_attr({"tirx.noalias": True, "tirx.is_scheduled": True,
                                                  "op_pattern": 8})


def call_gemv(bb: relax.BlockBuilder, funcs: dict | None, prepared: dict | None, func_key: tuple,
              make_func, func_name: str, prepare_key: tuple, prepare, weights: list,
              n_rows: int):
    """The call of a hand-built decode GEMV: its PrimFunc added once per `func_key` (make_func()
    named `func_name`, kept in `funcs`), x's prepared activations emitted once per
    `prepare_key` (prepare(): a TE tuple, kept in `prepared`, shared by the linears that read
    the same x), then call_tir(prepared..., *weights) -> [1, 1, n_rows] float32."""
    funcs = {} if funcs is None else funcs
    prepared = {} if prepared is None else prepared
    if func_key not in funcs:
        funcs[func_key] = bb.add_func(make_func(), func_name)
    if prepare_key not in prepared:
        both = prepare()
        prepared[prepare_key] = [bb.emit(relax.TupleGetItem(both, i))
                                 for i in range(len(both.ty.fields))]
    return relax.call_tir(funcs[func_key], [*prepared[prepare_key], *weights],
                          relax.TensorType((1, 1, n_rows), "float32"))


def emit_linear_q4_qact(bb: relax.BlockBuilder, x, codes, scales, zeros=None, bias=None,
                        funcs: dict | None = None, prepared: dict | None = None, bits: int = 8):
    """Emit quantize_activations on x [1, 1, K] and a call of q4_gemv_qact (call_gemv: one
    PrimFunc per weight shape, one quantised x per input); returns the call, [1, 1, N] f32."""
    n_rows, k = int(codes.ty.shape[0]), int(x.ty.shape[-1])
    key = (n_rows, k, k // int(scales.ty.shape[1]), str(scales.ty.dtype), zeros is not None,
           None if bias is None else str(bias.ty.dtype), bits)
    return call_gemv(bb, funcs, prepared, key, lambda: q4_gemv_qact(*key), f"q4_gemv_int{bits}",
                     (x, bits), lambda: bb.emit_te(quantize_activations, x, bits,
                                                   primfunc_name_hint="quantize_activations"),
                     [a for a in (codes, scales, zeros, bias) if a is not None], n_rows)


def has_avx2(target: Target) -> bool:
    """True when `target` (x86 llvm) has AVX2: q8_gemv_qact's 256-bit pmaddwd."""
    from tvm.target import codegen

    return bool(codegen.target_has_features("avx2", target))


def emit_linear_q8_qact(bb: relax.BlockBuilder, x, codes, scales, bias=None,
                        funcs: dict | None = None, prepared: dict | None = None, bits: int = 16,
                        wide: bool = False):
    """Emit quantize_activations(x, bits, interleave=False) and a call of q8_gemv_qact (one
    PrimFunc per shape, one quantised x per input; wide: AVX2's 256-bit pmaddwd, else SSE2's);
    returns the call, [1, 1, N] f32."""
    n_rows, k = int(codes.ty.shape[0]), int(x.ty.shape[-1])
    key = ("q8", n_rows, k, None if bias is None else str(bias.ty.dtype), bits, wide)
    return call_gemv(bb, funcs, prepared, key, lambda: q8_gemv_qact(*key[1:]),
                     f"q8_gemv_int{bits}", (x, bits, "natural"),
                     lambda: bb.emit_te(quantize_activations, x, bits, False,
                                        primfunc_name_hint="quantize_activations"),
                     [a for a in (codes, scales, bias) if a is not None], n_rows)
