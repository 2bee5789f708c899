"""Prefill's tiled GEMM on the host build (backends/tvm/kernels_gemm.py), against numpy: a Relax
function with a symbolic T calling the GEMM (as the prefill entry does), compiled once per weight
shape for this CPU and run for T = 1, T below, at and past the 6-row tile and T with a tail; 4-bit
weights symmetric and asymmetric, group 32 and 128, fp16 and fp32 scales, N in whole 16-column
panels and not, float weights (f16 / f32); and which entries of the demo's host module call it."""

from __future__ import annotations

import numpy as np
import pytest

from arkinfer.backend import get_backend

BACKEND = get_backend("tvm")
if not BACKEND.available():
    pytest.skip(f"tvm is not installed: {BACKEND.install_hint()}", allow_module_level=True)

import tvm
from arkinfer.backends.tvm import kernels_gemm as gm
from arkinfer.backends.tvm.default_pipeline import finish, host_target, schedule
from arkinfer.backends.tvm.weights import SCALES, dequantize_q4, pack_q4
from tvm import relax
from tvm import tirx as tir

from arkinfer.testing.synthetic import random_q4_weight

ROWS = (1, 2, 5, 6, 7, 12, 13, 64)   # T: one row, a partial tile, whole tiles, tails


def gemm_module(k: int, weights: list[np.ndarray], names: list[str], q4: bool):
    """A compiled Relax `main(x [1, T, K], *weights)` returning emit_q4_gemm's (q4) or
    emit_float_gemm's call (T a shape variable); weights named codes, scales, zeros?, bias? or
    w, bias?."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, tir.Var("T", "int64"), k], "float32"))
    params = [relax.Var(n, relax.TensorType(list(a.shape), str(a.dtype)))
              for n, a in zip(names, weights)]
    by_name = dict(zip(names, params))
    with bb.function("main", [x, *params]):
        with bb.dataflow():
            if q4:
                call = gm.emit_q4_gemm(bb, x, by_name["codes"], by_name["scales"],
                                       by_name.get("zeros"), by_name.get("bias"))
            else:
                call = gm.emit_float_gemm(bb, x, by_name["w"], by_name.get("bias"))
            out = bb.emit_output(call)
        bb.emit_func_output(out)
    target = host_target()
    return relax.VirtualMachine(finish(schedule(bb.get(), target), target), tvm.cpu())


def check_rows(vm, k: int, weights: list[np.ndarray], dense: np.ndarray, bias):
    """main(x) for every T in ROWS within fp32 summation error of x @ dense.T (+ bias)."""
    rng = np.random.default_rng(7)
    args = [tvm.runtime.tensor(a) for a in weights]
    for t in ROWS:
        x = rng.standard_normal((1, t, k)).astype(np.float32)
        got = vm["main"](tvm.runtime.tensor(x), *args).numpy()
        assert got.shape == (1, t, dense.shape[0]), t
        want = x.astype(np.float64) @ dense.T.astype(np.float64) + (0 if bias is None else bias)
        bound = np.abs(x).sum(-1, keepdims=True) * np.abs(dense).max()   # |partial sums|
        assert (np.abs(got - want) <= 1e-6 * bound).all(), t


@pytest.mark.parametrize("n,k,group,sym,scale_dtype,bias", [
    (96, 128, 32, True, np.float16, False),
    (96, 256, 128, False, np.float16, True),
    (200, 256, 32, False, np.float32, False),    # N = 12.5 panels: the last one clamped
    (40, 384, 128, True, np.float32, True)],
    ids=["sym-g32", "asym-g128-bias", "asym-g32-f32scales-ntail", "sym-g128-f32scales-bias"])
def test_q4_gemm_equals_numpy(n, k, group, sym, scale_dtype, bias):
    """y = x @ dequant(W).T (+ bias) for every T in ROWS."""
    packed = pack_q4(random_q4_weight(n, k, group, sym))
    packed[SCALES] = packed[SCALES].astype(scale_dtype)
    names = {"q4_codes": "codes", "q4_scales": "scales", "q4_zeros": "zeros"}
    weights, wnames = list(packed.values()), [names[key] for key in packed]
    b = np.random.default_rng(3).standard_normal(n).astype(np.float32) if bias else None
    if b is not None:
        weights, wnames = [*weights, b], [*wnames, "bias"]
    assert ("zeros" in wnames) == (not sym)
    vm = gemm_module(k, weights, wnames, q4=True)
    check_rows(vm, k, weights, dequantize_q4(packed, k), b)


@pytest.mark.parametrize("n,dtype,bias", [(64, np.float16, False), (72, np.float32, True)],
                         ids=["f16", "f32-bias-ntail"])
def test_float_gemm_equals_numpy(n, dtype, bias):
    """The float path (lm_head): w f16 / f32 widened in the panel, y = x @ w.T (+ bias)."""
    k = 96
    w = (np.random.default_rng(2).standard_normal((n, k)) * 0.1).astype(dtype)
    b = np.random.default_rng(3).standard_normal(n).astype(np.float32) if bias else None
    weights, names = ([w, b], ["w", "bias"]) if bias else ([w], ["w"])
    check_rows(gemm_module(k, weights, names, q4=False), k, weights, w.astype(np.float32), b)


def test_supported_for_prefill_rows_only():
    t = tir.Var("T", "int64")
    assert gm.supported([tir.IntImm("int64", 1), t, tir.IntImm("int64", 576)])
    assert gm.supported([tir.IntImm("int64", 1), tir.IntImm("int64", 8), 576])
    assert not gm.supported([tir.IntImm("int64", 1), tir.IntImm("int64", 1), 576])  # decode
    assert not gm.supported([t, tir.IntImm("int64", 576)])


def test_demo_host_prefill_calls_the_gemm(demo_q4):
    """The host module's prefill computes every linear with the GEMM (one PrimFunc per weight
    shape), its decode with none; the portable module (device builds) has no GEMM."""
    import re

    from arkinfer.backends.tvm.lower_relax import HostDecode, lower_program

    program, params = demo_q4
    mod, _ = lower_program(program, params, HostDecode(host_target()))
    prefill, decode = str(mod["prefill"]), str(mod["decode"])
    calls = re.findall(r"call_tir\(((?:q4_)?gemm)\d*,", prefill)
    assert len(calls) == 7 * program.num_layers + 1   # q, k, v, o, gate, up, down; lm_head
    assert "q4_linear" not in prefill and "gemm" not in decode
    portable, _ = lower_program(program, params)
    assert not any("gemm" in gv.name_hint for gv in portable.get_global_vars())
