"""Float matrices stored as Q8_0 (backends/tvm weights.py, `--option float_weights=q8`, the
default): the packing against a numpy unpack, and every kernel that reads them against numpy on
the dequantised matrix: the embedding rows, the device / fallback TE reduction, prefill's tiled
GEMM and decode's int16 / int8 GEMV on the rounded activations."""

from __future__ import annotations

import numpy as np
import pytest

from arkinfer.backend import get_backend

BACKEND = get_backend("tvm")
if not BACKEND.available():
    pytest.skip(f"tvm is not installed: {BACKEND.install_hint()}", allow_module_level=True)

from arkinfer.backends.tvm import kernels_gemm as gm  # noqa: E402
from arkinfer.backends.tvm import kernels_linear as kl  # noqa: E402
from arkinfer.backends.tvm import kernels_qact as qa  # noqa: E402
from arkinfer.backends.tvm.weights import Q8_CODES, Q8_SCALES, dequantize_q8, pack_q8  # noqa: E402


def matrix(n: int, k: int) -> np.ndarray:
    w = np.random.default_rng(3).standard_normal((n, k)).astype(np.float32) * 0.05
    w[1, :32] = 0.0          # an all-zero block: scale 0, codes 0
    w[2, 5] = 3.0            # an outlier: its block's scale follows it
    return w


def test_pack_q8_is_ggml_q8_0_with_the_scale_rounded_first():
    """Per block of 32: d = fp16(max|w| / 127), codes = round(w / d) in [-127, 127]; the unpack
    is codes * d, within d / 2 of w; an all-zero block stays zero."""
    w = matrix(8, 96)
    packed = pack_q8(w)
    codes, d = packed[Q8_CODES], packed[Q8_SCALES]
    assert codes.dtype == np.int8 and codes.shape == (8, 96)
    assert d.dtype == np.float16 and d.shape == (8, 3)
    blocks = w.reshape(8, 3, 32)
    want_d = (np.abs(blocks).max(-1) / 127).astype(np.float16)
    np.testing.assert_array_equal(d, want_d)
    assert np.abs(codes).max() <= 127 and not codes[1, :32].any() and d[1, 0] == 0
    back = dequantize_q8(packed)
    np.testing.assert_array_equal(back, codes.astype(np.float32)
                                  * np.repeat(d.astype(np.float32), 32, axis=1))
    half = np.repeat(d.astype(np.float32), 32, axis=1) / 2
    assert (np.abs(back - w) <= half * (1 + 1e-6) + 1e-12).all()


def _inputs(n, k, t, bias):
    w = matrix(n, k)
    packed = pack_q8(w)
    x = np.random.default_rng(4).standard_normal((1, t, k)).astype(np.float32)
    inputs, names = [x, packed[Q8_CODES], packed[Q8_SCALES]], ["x", "codes", "scales"]
    if bias:
        inputs.append(np.random.default_rng(5).standard_normal(n).astype(np.float32))
        names.append("bias")
    dense = dequantize_q8(packed)
    want = x @ dense.T + (inputs[3] if bias else 0)
    return inputs, names, want


@pytest.mark.parametrize("n,k,t,bias", [(40, 96, 7, False), (33, 64, 13, True)],
                         ids=["whole-panels-no", "ragged-bias"])
def test_prefill_gemm_equals_numpy(run_host, n, k, t, bias):
    """The tiled GEMM's panel decodes codes * scale: y = x @ dequant(W).T within fp32 error."""
    inputs, names, want = _inputs(n, k, t, bias)
    got = run_host(lambda bb, x, *rest: gm.emit_q8_gemm(bb, x, *rest), inputs, names).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("t", [1, 5])
def test_te_reduction_equals_numpy(run_host, t):
    """The TE reduction (device builds; the host's decode with f32 activations)."""
    inputs, names, want = _inputs(24, 64, t, True)
    got = run_host(lambda bb, *v: bb.emit_te(kl.linear_q8, *v), inputs, names).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("wide", [False, True], ids=["sse2", "avx2"])
@pytest.mark.parametrize("bits", qa.BITS)
@pytest.mark.parametrize("bias", [False, True])
def test_decode_gemv_equals_numpy_on_the_rounded_activations(run_host, bits, bias, wide):
    """y = dequant(W) @ (x rounded per 32 values, natural order) (+ bias), exact integer sums:
    within fp32 summation error of numpy, and within the rounding's effect of the fp32 product;
    both the SSE2 (128-bit) and the AVX2 (256-bit) pmaddwd forms."""
    from arkinfer.backends.tvm.default_pipeline import host_target

    if wide and not qa.has_avx2(host_target()):
        pytest.skip("this CPU has no AVX2")
    inputs, names, exact = _inputs(50, 128, 1, bias)
    got = run_host(lambda bb, x, *rest: qa.emit_linear_q8_qact(
        bb, x, rest[0], rest[1], rest[2] if bias else None, bits=bits, wide=wide),
        inputs, names).numpy()
    x = inputs[0]
    qmax = np.float32(2 ** (bits - 1) - 1)
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(1)
    q = np.round(blocks * (qmax / amax)[:, None])
    xr = (q * (amax / qmax)[:, None]).reshape(1, 1, -1).astype(np.float32)
    want = xr @ dequantize_q8({Q8_CODES: inputs[1], Q8_SCALES: inputs[2]}).T + \
        (inputs[3] if bias else 0)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    assert np.abs(got - exact).max() <= (2e-2 if bits == 8 else 1e-4) * np.abs(exact).max()


def test_embedding_rows_are_dequantised_and_ids_clipped(run_host):
    """embed_q8: rows codes[id] * their scales, ids outside [0, N) clipped as take(mode=clip)."""
    w = matrix(10, 64)
    packed = pack_q8(w)
    ids = np.array([[3, 0, 9, 12, -1]], dtype=np.int64)
    got = run_host(lambda bb, c, s, i: bb.emit_te(kl.embed_q8, c, s, i),
                   [packed[Q8_CODES], packed[Q8_SCALES], ids], ["codes", "scales", "ids"]).numpy()
    dense = dequantize_q8(packed)
    np.testing.assert_array_equal(got, dense[np.clip(ids, 0, 9)])
