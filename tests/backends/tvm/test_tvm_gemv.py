"""Decode's 4-bit linears in fp32 on the host build (backends/tvm/kernels_gemv.py), against
numpy: the activation layout and group sums, the GEMV against the dequantised weight, and the
demo's host build against the portable module (TE reductions) the device builds compile."""

from __future__ import annotations

import re

import numpy as np
import pytest

from arkinfer.backend import get_backend

BACKEND = get_backend("tvm")
if not BACKEND.available():
    pytest.skip(f"tvm is not installed: {BACKEND.install_hint()}", allow_module_level=True)

import tvm  # noqa: E402

from arkinfer.backends.tvm import kernels_gemv as kg  # noqa: E402
from arkinfer.backends.tvm.default_pipeline import finish, host_target, schedule  # noqa: E402


def test_prepared_activations_layout_and_group_sums(run_host):
    """xr holds each 16-column run's 8 even columns then its 8 odd ones; xsum per group."""
    x = np.random.default_rng(0).standard_normal((1, 1, 96)).astype(np.float32)
    got = run_host(lambda bb, v: bb.emit_te(kg.prepare_activations, v, 48), [x], ["x"])
    xr, xsum = got[0].numpy(), got[1].numpy()
    order = np.r_[0:16:2, 1:16:2]
    np.testing.assert_array_equal(xr.reshape(6, 16), x.reshape(6, 16)[:, order])
    np.testing.assert_allclose(xsum, x.reshape(2, 48).sum(1), rtol=1e-6)


@pytest.mark.parametrize("n,k,group,sym,bias", [(96, 128, 32, True, False),
                                                 (200, 256, 64, False, True),
                                                 (64, 192, 96, True, True),
                                                 (40, 64, 16, False, False)],
                         ids=["sym-g32", "asym-g64-bias", "sym-g96-bias", "asym-g16"])
def test_gemv_equals_numpy(run_host, random_linear, n, k, group, sym, bias):
    """y = dequantised W @ x (+ bias) within fp32 summation error."""
    dense, x, inputs, names, split = random_linear(n, k, group, sym, bias)
    dense = dense.astype(np.float64)

    def body(bb, xv, *rest):
        return kg.emit_linear_q4_f32(bb, xv, *split(rest))

    got = run_host(body, inputs, names).numpy()
    want = x.astype(np.float64) @ dense.T + (inputs[-1] if bias else 0)
    scale = np.abs(x).sum() * np.abs(dense).max()   # bound of any |partial sum|
    assert np.abs(got - want).max() <= 1e-6 * scale


def test_supported_only_for_whole_runs():
    assert kg.supported(576, 32) and kg.supported(1536, 16)
    assert not kg.supported(56, 8)       # K not whole 16-column runs
    assert not kg.supported(576, 8)      # a scale per 8 columns


def test_demo_host_decode_equals_the_portable_module(demo_q4):
    """The host module's decode calls the fp32 GEMV (q, k and v share one prepared x), prefill
    does not; its decode logits equal the portable module's (TE reductions, as the device
    builds compile it) run on this CPU, within fp32 summation order, with the same top-1."""
    from arkinfer.backends.tvm.compile import build
    from arkinfer.backends.tvm.lower_relax import HostDecode, lower_program
    from arkinfer.backends.tvm.session import TVMSession

    program, params = demo_q4
    mod, sig = lower_program(program, params, HostDecode(host_target(), "f32"))
    decode = str(mod["decode"])
    assert "q4_gemv_f32" in decode and "q4_gemv_f32" not in str(mod["prefill"])
    # per layer: one prepared x for q, k, v; o; gate, up; down; and one for a packed lm_head
    gemvs = 7 * program.num_layers + ("lm_head.q4_codes" in params)
    prepared = 4 * program.num_layers + ("lm_head.q4_codes" in params)
    assert len(re.findall(r"call_tir\(prepare_activations\d*,", decode)) == prepared
    assert len(re.findall(r"call_tir\(q4_gemv_f32\d*,", decode)) == gemvs

    host = build(program, params, devices=(), decode_activations="f32")
    target = host_target()
    portable, _ = lower_program(program, params)
    sessions = [TVMSession(host.host_exec, tvm.cpu(), host.params, host.signature),
                TVMSession(finish(schedule(portable, target), target), tvm.cpu(), params, sig)]
    prompt = [1, 17, 300, 5, 2000, 42, 7, 99]
    pre = [s.step(prompt) for s in sessions]  # new sessions: empty caches
    # the host prefill's linears are kernels_gemm's tiles, the portable module's the TE
    # reduction: equal up to fp32 summation order
    assert np.abs(pre[0] - pre[1]).max() <= 1e-4 * np.abs(pre[1]).max()
    assert (pre[0].argmax(-1) == pre[1].argmax(-1)).all()
    for pos, tok in enumerate([11, 1234, 3, 77], start=len(prompt)):
        fast, te = (s.step([tok])[-1] for s in sessions)
        assert np.abs(fast - te).max() <= 1e-4 * np.abs(te).max(), pos
        assert int(fast.argmax()) == int(te.argmax()), pos
