"""Prefill's linears on the host build (llvm CPUs) as a tiled GEMM: the weight decoded once per
call, panel by panel, then a register-tiled FMA micro-kernel over all T rows.

The TE reduction of kernels_linear.py, scheduled by cpu_schedule.LinearRows, is one GEMV per
token: every 4-bit weight is decoded again for every row of x (SmolLM2-135M pp512: 61 tok/s,
0.15x of llama.cpp). Here, for a weight W [N, K] and x [1, T, K]:

    panel[N/NR, K, NR] f32      W transposed in panels of NR = 16 output columns (two AVX2
                                vectors): panel[p, k, j] = dequant(W)[NR*p + j, k]; decoded once
                                per call, under the panel's parallel loop (36 KB for K = 576, in
                                L2), so a panel is written and read back by the same core
    acc[MR, NR] (registers)     per tile of MR = 6 rows x NR outputs: 12 AVX2 accumulators; per
                                k, two vector loads of panel[p, k, :], six broadcasts of
                                x[t, k], 12 FMAs (the classic 6x16 AVX2 kernel, 15 of 16 ymm)
    y[0, t, n] = acc (+ bias[n])

Loops: panels in parallel (`num-cores` threads), per panel: decode it, then for each row tile:
zero the accumulators, run k (the MR x NR tile unrolled and vectorised), store. Accumulation
is fp32, one serial sum over k per output (results differ from LinearRows' 32 interleaved
partial sums by fp32 rounding only).

Tails: T is symbolic. The accumulator tile covers ceil(T / MR) * MR rows and reads row
min(t, T - 1) (a row past the end recomputes the last one), so the k loop has no predicate;
only the store of the last tile checks t < T. N that is not a multiple of NR is handled the same
way (panel columns clamped to N - 1, stores of n < N).

    gemm_q4(n, k, group, scale_dtype, zeros, bias_dtype)
        -> PrimFunc(x f32 [1, T, K], codes u32 [N, K/8], scales f16|f32 [N, K/g],
                    zeros? u8 [N, K/g], bias? [N], y f32 [1, T, N])
        weights.py's layout: column 8w + i of row n in bits 4i..4i+3 of codes[n, w];
        W[n, k] = scales[n, k // g] * (code - zero), zero 8 for symmetric weights. The panel is
        built per packed word (8 columns: one broadcast shift per lane, vectorised across the
        panel's 16 rows).
    gemm_float(n, k, weight_dtype, bias_dtype)
        -> PrimFunc(x f32 [1, T, K], w f16|f32 [N, K], bias? [N], y f32 [1, T, N])
        (the lm_head, tied or not, and any float linear).
    gemm_q8(n, k, bias_dtype)
        -> PrimFunc(x f32 [1, T, K], codes i8 [N, K], scales f16 [N, K/32], bias? [N],
                    y f32 [1, T, N])
        a float matrix stored as Q8_0 (`float_weights=q8`, the default: the lm_head);
        W[n, k] = codes[n, k] * scales[n, k // 32].

Cost of the panels: N * K values decoded per call, ~0.25 ms for 1536 x 576 on this 2-core Zen 3,
1.5-2x what LinearRows takes for T = 1; from T ~ 4 on the GEMM is faster (a one-token call
goes to the decode entry anyway). T = 512 on one core of this Zen 3, process CPU time (the
machine was shared; relative numbers), best of 3 interleaved runs: q4 1536 x 576 89 GFLOP/s,
576 x 1536 82, the f16 lm_head 49152 x 576 73; LinearRows 16, 16 and 10; torch.matmul (one
thread) on the dequantised fp32 weight 71, 73 and 67. Values are checked against numpy in
tests/backends/tvm/test_tvm_gemm.py (no timings there).
"""

from __future__ import annotations

import functools

from tvm import relax, s_tir, te
from tvm import tirx as tir

from .kernels_linear import dequant_q4_word, dequant_q8
from .weights import Q8_BLOCK

MR = 6    # rows of x per register tile
NR = 16   # output columns per register tile and per panel: two AVX2 vectors of fp32
WORD = 8  # 4-bit codes per packed uint32 word


def _rows_and_out(x: te.Tensor, n: int, panel_value, bias: te.Tensor | None) -> te.Tensor:
    """The accumulator (padded to whole MR x NR tiles, rows clamped to T - 1) and the output
    y [1, T, N] (+ bias); `panel_value(n, k)` is the fp32 panel entry of output n, column k."""
    t_len, k_len = x.shape[1], int(x.shape[2])
    t_pad = (t_len + MR - 1) // MR * MR
    n_pad = (n + NR - 1) // NR * NR
    k = te.reduce_axis((0, k_len), "k")
    acc = te.compute((t_pad, n_pad), lambda t, j: te.sum(
        x[0, tir.min(t, t_len - 1), k] * panel_value(j, k), axis=k), name="gemm_acc")
    if bias is None:
        return te.compute((1, t_len, n), lambda b, t, j: acc[t, j], name="gemm")
    return te.compute((1, t_len, n), lambda b, t, j: acc[t, j] + bias[j].astype("float32"),
                      name="gemm")


def _clamp(n: int, j):
    """Panel column j as a weight row: clamped to N - 1 when N is not whole panels."""
    return j if n % NR == 0 else tir.min(j, n - 1)


def gemm_q4_te(x: te.Tensor, codes: te.Tensor, scales: te.Tensor, zeros: te.Tensor | None,
               bias: te.Tensor | None) -> te.Tensor:
    """y [1, T, N] = x @ dequant(W).T (+ bias) through the decoded panel (module doc)."""
    n, k_len = int(codes.shape[0]), int(x.shape[2])
    group = k_len // int(scales.shape[1])
    panel = te.compute(((n + NR - 1) // NR, k_len // WORD, WORD, NR),
                       lambda p, w, lane, j: dequant_q4_word(codes, scales, zeros,
                                                             _clamp(n, p * NR + j), w, lane,
                                                             group), name="gemm_panel")
    return _rows_and_out(x, n, lambda j, k: panel[j // NR, k // WORD, k % WORD, j % NR], bias)


def gemm_float_te(x: te.Tensor, w: te.Tensor, bias: te.Tensor | None) -> te.Tensor:
    """y [1, T, N] = x @ w.T (+ bias), w float16 or float32, through a fp32 panel."""
    n, k_len = int(w.shape[0]), int(x.shape[2])
    panel = te.compute(((n + NR - 1) // NR, k_len, NR),
                       lambda p, k, j: w[_clamp(n, p * NR + j), k].astype("float32"),
                       name="gemm_panel")
    return _rows_and_out(x, n, lambda j, k: panel[j // NR, k, j % NR], bias)


def gemm_q8_te(x: te.Tensor, codes: te.Tensor, scales: te.Tensor,
               bias: te.Tensor | None) -> te.Tensor:
    """y [1, T, N] = x @ (codes * scales).T (+ bias) through a fp32 panel (module doc)."""
    n, k_len = int(codes.shape[0]), int(x.shape[2])
    panel = te.compute(((n + NR - 1) // NR, k_len, NR),
                       lambda p, k, j: dequant_q8(codes, scales, _clamp(n, p * NR + j), k),
                       name="gemm_panel")
    return _rows_and_out(x, n, lambda j, k: panel[j // NR, k, j % NR], bias)


def schedule_gemm(func: tir.PrimFunc) -> tir.PrimFunc:
    """The loop nest of the module doc on a PrimFunc of gemm_q4_te / gemm_float_te."""
    sch = s_tir.Schedule(func)
    panel, acc, out = (sch.get_sblock(name) for name in ("gemm_panel", "gemm_acc", "gemm"))
    batch, t, j = sch.get_loops(out)
    p, j_in = sch.split(j, factors=[None, NR])
    t_out, t_in = sch.split(t, factors=[None, MR])
    sch.reorder(batch, p, t_out, t_in, j_in)
    sch.vectorize(j_in)
    sch.set_scope(acc, 0, "local")   # MR x NR accumulators: registers once unrolled
    sch.compute_at(acc, t_out)
    sch.compute_at(panel, p)         # one panel per parallel iteration, decoded by its thread
    sch.parallel(sch.fuse(batch, p))
    a_t, a_j, a_k = sch.get_loops(acc)[-3:]
    sch.reorder(a_k, a_t, a_j)
    sch.unroll(a_t)
    sch.vectorize(a_j)
    init = sch.decompose_reduction(acc, a_k)   # after vectorize: the update has no init then
    i_t, i_j = sch.get_loops(init)[-2:]
    sch.unroll(i_t)
    sch.vectorize(i_j)
    sch.vectorize(sch.get_loops(panel)[-1])   # the panel's 16 columns
    # op_pattern 8 = kOpaque: relax FuseOps leaves the call alone (no epilogue fused into it);
    # no global symbol: bb.add_func names it (create_prim_func calls every function "main")
    return sch.mod["main"].without_attr("global_symbol").with_attr(
        {"tirx.is_scheduled": True, "op_pattern": 8})


def _var_t():
    return tir.Var("T", "int64")


def gemm_q4(n: int, k: int, group: int, scale_dtype: str, zeros: bool,
            bias_dtype: str | None) -> tir.PrimFunc:
    """The scheduled PrimFunc of the module doc for a 4-bit weight [n, k] (symbolic T)."""
    x = te.placeholder((1, _var_t(), k), "float32", "x")
    codes = te.placeholder((n, k // WORD), "uint32", "codes")
    scales = te.placeholder((n, k // group), scale_dtype, "scales")
    zp = te.placeholder((n, k // group), "uint8", "zeros") if zeros else None
    bias = te.placeholder((n,), bias_dtype, "bias") if bias_dtype else None
    y = gemm_q4_te(x, codes, scales, zp, bias)
    args = [x, codes, scales] + [a for a in (zp, bias) if a is not None] + [y]
    return schedule_gemm(te.create_prim_func(args))


def gemm_float(n: int, k: int, weight_dtype: str, bias_dtype: str | None) -> tir.PrimFunc:
    """The scheduled PrimFunc of the module doc for a float weight [n, k] (symbolic T)."""
    x = te.placeholder((1, _var_t(), k), "float32", "x")
    w = te.placeholder((n, k), weight_dtype, "w")
    bias = te.placeholder((n,), bias_dtype, "bias") if bias_dtype else None
    y = gemm_float_te(x, w, bias)
    return schedule_gemm(te.create_prim_func([x, w] + ([bias] if bias is not None else []) + [y]))


def gemm_q8(n: int, k: int, bias_dtype: str | None) -> tir.PrimFunc:
    """The scheduled PrimFunc of the module doc for a Q8_0 matrix [n, k] (symbolic T)."""
    x = te.placeholder((1, _var_t(), k), "float32", "x")
    codes = te.placeholder((n, k), "int8", "codes")
    scales = te.placeholder((n, k // Q8_BLOCK), "float16", "scales")
    bias = te.placeholder((n,), bias_dtype, "bias") if bias_dtype else None
    y = gemm_q8_te(x, codes, scales, bias)
    return schedule_gemm(te.create_prim_func([x, codes, scales]
                                             + ([bias] if bias is not None else []) + [y]))


def supported(x_shape) -> bool:
    """True for x [1, T, K] with T anything but a static 1 (decode's rows keep their GEMVs; the
    4-bit format already makes K whole packed words)."""
    if len(x_shape) != 3 or not isinstance(x_shape[0], tir.IntImm) or int(x_shape[0]) != 1:
        return False
    return not (isinstance(x_shape[1], tir.IntImm) and int(x_shape[1]) == 1)


def _call(bb: relax.BlockBuilder, funcs: dict | None, key: tuple, make, x, args: list, n: int):
    """call_tir of the PrimFunc make() (added once per `key`, kept in `funcs`) on x and args;
    [1, T, n] float32."""
    funcs = {} if funcs is None else funcs
    if key not in funcs:
        funcs[key] = bb.add_func(make(), key[0])
    return relax.call_tir(funcs[key], [x, *[a for a in args if a is not None]],
                          relax.TensorType([x.ty.shape[0], x.ty.shape[1], n], "float32"))


def emit_q4_gemm(bb: relax.BlockBuilder, x, codes, scales, zeros=None, bias=None,
                 funcs: dict | None = None):
    """The call of gemm_q4 for x [1, T, K] (zeros None: symmetric; one PrimFunc per weight shape
    and dtypes, kept in `funcs`); returns the call, [1, T, N] float32."""
    n, k = int(codes.ty.shape[0]), int(x.ty.shape[-1])
    key = ("q4_gemm", n, k, k // int(scales.ty.shape[1]), str(scales.ty.dtype),
           zeros is not None, None if bias is None else str(bias.ty.dtype))
    return _call(bb, funcs, key, functools.partial(gemm_q4, *key[1:]), x,
                 [codes, scales, zeros, bias], n)


def emit_float_gemm(bb: relax.BlockBuilder, x, w, bias=None, funcs: dict | None = None):
    """The call of gemm_float for x [1, T, K] and a float weight w [N, K]; [1, T, N] float32."""
    n, k = int(w.ty.shape[0]), int(x.ty.shape[-1])
    key = ("gemm", n, k, str(w.ty.dtype), None if bias is None else str(bias.ty.dtype))
    return _call(bb, funcs, key, functools.partial(gemm_float, *key[1:]), x, [w, bias], n)


def emit_q8_gemm(bb: relax.BlockBuilder, x, codes, scales, bias=None, funcs: dict | None = None):
    """The call of gemm_q8 for x [1, T, K] and a Q8_0 matrix; [1, T, N] float32."""
    n, k = int(codes.ty.shape[0]), int(x.ty.shape[-1])
    key = ("q8_gemm", n, k, None if bias is None else str(bias.ty.dtype))
    return _call(bb, funcs, key, functools.partial(gemm_q8, *key[1:]), x, [codes, scales, bias], n)
