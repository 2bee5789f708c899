"""Decode's 4-bit linears with int16 / int8 activations (backends/tvm/kernels_qact.py), against
numpy: the activation quantiser's layout and values, the GEMV on the rounded activations (exact
up to fp32 summation), and the demo's host build with each width against the fp32 one."""

from __future__ import annotations

import numpy as np
import pytest

from arkinfer.backend import get_backend

BACKEND = get_backend("tvm")
if not BACKEND.available():
    pytest.skip(f"tvm is not installed: {BACKEND.install_hint()}", allow_module_level=True)

import tvm  # noqa: E402
from tvm.target import Target  # noqa: E402

from arkinfer.backends.tvm import kernels_qact as qa  # noqa: E402
from arkinfer.backends.tvm.default_pipeline import host_target  # noqa: E402
from arkinfer.errors import ArkError  # noqa: E402


def numpy_quantize(x: np.ndarray, bits: int):
    """Per 32 values: qmax = 2^(bits-1) - 1, scale max|x| / qmax, q = round(x * qmax / max|x|)
    (0 for a zero block)."""
    qmax = np.float32(2 ** (bits - 1) - 1)
    blocks = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(blocks).max(1)
    inv = np.where(amax > 0, qmax / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.round(blocks * inv[:, None]).astype(f"int{bits}")
    return q, (amax / qmax).astype(np.float32)


@pytest.mark.parametrize("bits", qa.BITS)
def test_activation_quantiser_layout_and_values(run_host, bits):
    """xq holds each block's even columns then its odd ones; xs and xsum per block; an all-zero
    block quantises to zeros with scale 0."""
    x = np.random.default_rng(0).standard_normal((1, 1, 96)).astype(np.float32)
    x[0, 0, 32:64] = 0.0
    got = run_host(lambda bb, v: bb.emit_te(qa.quantize_activations, v, bits), [x], ["x"])
    xq, xs, xsum = (got[i].numpy() for i in range(3))
    assert xq.dtype == np.dtype(f"int{bits}")
    q, s = numpy_quantize(x, bits)
    order = np.r_[0:32:2, 1:32:2]
    np.testing.assert_array_equal(xq.reshape(3, 32), q[:, order])
    np.testing.assert_allclose(xs, s, rtol=1e-7)
    np.testing.assert_array_equal(xsum, q.astype(np.int32).sum(1))
    assert not xq[32:64].any() and xs[1] == 0


@pytest.mark.parametrize("bits", qa.BITS)
@pytest.mark.parametrize("n,k,group,sym,bias", [(96, 128, 32, True, False),
                                                 (200, 256, 64, False, True),
                                                 (64, 192, 96, True, True)],
                         ids=["sym-g32", "asym-g64-bias", "sym-g96-bias"])
def test_gemv_equals_numpy_on_the_rounded_activations(run_host, random_linear, n, k, group, sym,
                                                       bias, bits):
    """y = dequantised W @ (x rounded per 32 values) (+ bias) within fp32 summation error,
    and within the rounding's effect (2e-2 for int8, 1e-4 for int16) of the fp32 product."""
    dense, x, inputs, names, split = random_linear(n, k, group, sym, bias)

    def body(bb, xv, *rest):
        return qa.emit_linear_q4_qact(bb, xv, *split(rest), bits=bits)

    got = run_host(body, inputs, names).numpy()
    q, s = numpy_quantize(x, bits)
    want = (q * s[:, None]).reshape(1, 1, k) @ dense.T + (inputs[-1] if bias else 0)
    exact = x @ dense.T + (inputs[-1] if bias else 0)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    assert np.abs(got - exact).max() <= (2e-2 if bits == 8 else 1e-4) * np.abs(exact).max()


def test_supported_only_for_x86_and_whole_blocks():
    assert qa.supported(host_target(), 576, 32)
    assert not qa.supported(host_target(), 48, 16)      # K not whole 32-blocks
    assert not qa.supported(host_target(), 576, 16)     # a scale per 16 columns
    assert not qa.supported(Target({"kind": "llvm", "mtriple": "aarch64-linux-android"}), 576, 32)


def test_decode_activations_option_is_checked():
    from arkinfer.backends.tvm.artifact import decode_activations

    assert decode_activations({}) == "int16"
    assert decode_activations({"decode_activations": "int8"}) == "int8"
    assert decode_activations({"decode_activations": "f32"}) == "f32"
    with pytest.raises(ArkError, match="decode_activations='int4'") as exc:
        decode_activations({"decode_activations": "int4"})
    assert "int16" in exc.value.hint


@pytest.mark.parametrize("options,message", [
    ({"decode_activations": "int4"}, "decode_activations='int4'"),
    ({"devices": "adreno,nvidia"}, "unknown tvm device variant 'nvidia'"),
    ({"colour": "blue"}, r"unknown tvm option\(s\) \['colour'\]")])
def test_bad_options_fail_at_plan_time(tmp_path, options, message):
    """A bad --option stops `resolve_plan` (before any trace, quantise or file), naming it."""
    from arkinfer.pipeline.plan import resolve_plan

    with pytest.raises(ArkError, match=message):
        resolve_plan("demo", target="android", quant="q4_0", out=tmp_path / "out",
                     options=options)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bits,tolerance", [(16, 1e-4), (8, 3e-2)])
def test_demo_host_decode_with_quantised_activations(demo_q4, bits, tolerance):
    """The int<bits> host build: prefill identical to the fp32 build (prefill stays fp32), decode
    logits within the rounding's effect of the fp32 build's, the same top-1 on these steps; the
    decode entry calls the int<bits> GEMV and the prefill entry does not."""
    from arkinfer.backends.tvm.compile import build
    from arkinfer.backends.tvm.lower_relax import HostDecode, lower_program
    from arkinfer.backends.tvm.session import TVMSession

    program, params = demo_q4
    mod, _ = lower_program(program, params, HostDecode(host_target(), f"int{bits}"))
    gemv = f"q4_gemv_int{bits}"
    assert gemv not in str(mod["prefill"]) and gemv in str(mod["decode"])

    sessions = []
    for activations in ("f32", f"int{bits}"):
        b = build(program, params, devices=(), decode_activations=activations)
        sessions.append(TVMSession(b.host_exec, tvm.cpu(), b.params, b.signature))
    prompt = [1, 17, 300, 5, 2000, 42, 7, 99]
    pre = [s.step(prompt) for s in sessions]  # new sessions: empty caches
    np.testing.assert_array_equal(pre[0], pre[1])
    for pos, tok in enumerate([11, 1234, 3, 77], start=len(prompt)):
        f32, quantised = (s.step([tok])[-1] for s in sessions)
        assert np.abs(quantised - f32).max() <= tolerance * np.abs(f32).max(), pos
        assert int(quantised.argmax()) == int(f32.argmax()), pos
