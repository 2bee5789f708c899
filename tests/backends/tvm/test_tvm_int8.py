"""Decode's 4-bit linears with int8 activations (backends/tvm/kernels_int8.py), against numpy:
the activation quantiser's layout and values, the GEMV on the rounded activations (exact up to
fp32 summation), and the demo's host build with the path on vs off."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arkinfer.backend import get_backend

BACKEND = get_backend("tvm")
if not BACKEND.available():
    pytest.skip(f"tvm is not installed: {BACKEND.install_hint()}", allow_module_level=True)

import tvm  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.target import Target  # noqa: E402

from arkinfer.backends.tvm import kernels_int8 as k8  # noqa: E402
from arkinfer.backends.tvm.compile import finish, host_target, schedule  # noqa: E402
from arkinfer.backends.tvm.weights import dequantize_q4, pack_q4  # noqa: E402
from arkinfer.errors import ArkError  # noqa: E402
from arkinfer.testing.synthetic import random_q4_weight  # noqa: E402


def numpy_quantize(x: np.ndarray):
    """Per 32 values: scale max|x| / 127, q = round(x * 127 / max|x|) (0 for a zero block)."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(blocks).max(1)
    inv = np.where(amax > 0, np.float32(127.0) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.round(blocks * inv[:, None]).astype(np.int8)
    return q, (amax / np.float32(127.0)).astype(np.float32)


def _run(build_body, inputs: list[np.ndarray], names: list[str]):
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(list(a.shape), str(a.dtype)))
              for n, a in zip(names, inputs)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build_body(bb, *params))
        bb.emit_func_output(out)
    target = host_target()
    vm = relax.VirtualMachine(finish(schedule(bb.get(), target), target), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in inputs])


def test_activation_quantiser_layout_and_values():
    """xq holds each block's even columns then its odd ones; xs and xsum per block; an all-zero
    block quantises to zeros with scale 0."""
    x = np.random.default_rng(0).standard_normal((1, 1, 96)).astype(np.float32)
    x[0, 0, 32:64] = 0.0
    got = _run(lambda bb, v: bb.emit_te(k8.quantize_activations, v), [x], ["x"])
    xq, xs, xsum = (got[i].numpy() for i in range(3))
    q, s = numpy_quantize(x)
    order = np.r_[0:32:2, 1:32:2]
    np.testing.assert_array_equal(xq.reshape(3, 32), q[:, order])
    np.testing.assert_allclose(xs, s, rtol=1e-7)
    np.testing.assert_array_equal(xsum, q.astype(np.int32).sum(1))
    assert not xq[32:64].any() and xs[1] == 0


@pytest.mark.parametrize("n,k,group,sym,bias", [(96, 128, 32, True, False),
                                                 (200, 256, 64, False, True),
                                                 (64, 192, 96, True, True)],
                         ids=["sym-g32", "asym-g64-bias", "sym-g96-bias"])
def test_int8_gemv_equals_numpy_on_the_rounded_activations(n, k, group, sym, bias):
    """y = dequantised W @ (x rounded to int8 per 32) (+ bias) within fp32 summation error,
    and within the rounding's effect of the fp32 product."""
    packed = pack_q4(random_q4_weight(n, k, group, sym))
    dense = dequantize_q4(packed, k)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 1, k)).astype(np.float32)
    inputs, names = [x, *packed.values()], ["x", *packed]
    if bias:
        inputs.append(rng.standard_normal(n).astype(np.float32))
        names.append("bias")

    def body(bb, xv, *rest):
        codes, scales = rest[0], rest[1]
        zeros = rest[2] if not sym else None
        b = rest[-1] if bias else None
        return k8.emit_linear_q4_int8(bb, xv, codes, scales, zeros, b)

    got = _run(body, inputs, names).numpy()
    q, s = numpy_quantize(x)
    want = (q * s[:, None]).reshape(1, 1, k) @ dense.T + (inputs[-1] if bias else 0)
    exact = x @ dense.T + (inputs[-1] if bias else 0)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    assert np.abs(got - exact).max() <= 2e-2 * np.abs(exact).max()


def test_supported_only_for_x86_and_whole_blocks():
    assert k8.supported(host_target(), 576, 32)
    assert not k8.supported(host_target(), 48, 16)      # K not whole 32-blocks
    assert not k8.supported(host_target(), 576, 16)     # a scale per 16 columns
    assert not k8.supported(Target({"kind": "llvm", "mtriple": "aarch64-linux-android"}), 576, 32)


def test_decode_activations_option_is_checked():
    from arkinfer.backends.tvm.artifact import decode_int8

    assert decode_int8({"decode_activations": "int8"})
    assert not decode_int8({}) and not decode_int8({"decode_activations": "f32"})
    with pytest.raises(ArkError, match="decode_activations='int4'") as exc:
        decode_int8({"decode_activations": "int4"})
    assert "f32" in exc.value.hint


@pytest.fixture(scope="module")
def demo_q4():
    """The demo traced dense, every linear RTN 4-bit g32 (fp16 scales), and its params."""
    from arkinfer import ir
    from arkinfer.backends.tvm.weights import SourceWeights, program_params
    from arkinfer.frontend.checkpoint import resolve_model_path
    from arkinfer.quant.rtn import quantize_rtn

    class RTNWeights(SourceWeights):
        def quantised(self, weight_name, shape):
            w = self.ckpt.weights.get(weight_name).to(torch.float32)
            return quantize_rtn(w, 4, 32, scale_dtype=torch.float16,
                                name=weight_name.removesuffix(".weight"))

    src = resolve_model_path("demo")
    program = ir.run_passes(ir.trace(str(src), dtype=torch.float32, dense=True),
                            ("fold_rope_tables", "dce"))
    params, _ = program_params(program, RTNWeights(src))
    return program, params


def test_demo_host_decode_with_int8_activations(demo_q4):
    """The int8 host build: prefill identical to the fp32 build (prefill stays fp32), decode
    logits within int8 rounding of the fp32 build's, the same top-1 on these steps; the decode
    entry calls the int8 GEMV and the prefill entry does not."""
    from arkinfer.backends.tvm.compile import build
    from arkinfer.backends.tvm.lower_relax import lower_program
    from arkinfer.backends.tvm.session import TVMSession

    program, params = demo_q4
    mod, _ = lower_program(program, params, host_target())
    names = {gv.name_hint for gv in mod.functions}
    assert any(n.startswith("q4_gemv_int8") for n in names)
    prefill_calls = str(mod["prefill"])
    assert "q4_gemv_int8" not in prefill_calls and "q4_gemv_int8" in str(mod["decode"])

    sessions = []
    for int8 in (False, True):
        b = build(program, params, devices=(), decode_int8=int8)
        sessions.append(TVMSession(b.host_exec, tvm.cpu(), b.params, b.signature))
    prompt = [1, 17, 300, 5, 2000, 42, 7, 99]
    pre = [s.window(prompt) for s in sessions]
    np.testing.assert_array_equal(pre[0], pre[1])
    for pos, tok in enumerate([11, 1234, 3, 77], start=len(prompt)):
        f32, i8 = (s.decode(tok) for s in sessions)
        assert np.abs(i8 - f32).max() <= 3e-2 * np.abs(f32).max(), pos
        assert int(i8.argmax()) == int(f32.argmax()), pos
