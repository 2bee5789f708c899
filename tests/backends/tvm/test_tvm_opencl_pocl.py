"""The OpenCL kernels TVM writes for Android GPUs, run on a real OpenCL runtime (PoCL on the CPU).

Independent references: the same PrimFunc built for llvm (per kernel), the llvm build of the whole
module (per step) and ArkInfer's reference model on the same 4-bit weights (top-1). PoCL has no
cl_khr_fp16: kernels touching fp16 run with `half` widened to `float` (checked for indexing and
fp32 arithmetic, not half rounding). Skipped with the reason when PoCL / pyopencl is missing:
    apt-get install -y pocl-opencl-icd ocl-icd-opencl-dev clinfo && pip install pyopencl
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm", reason="apache-tvm (the [tvm] extra) is not installed")
import opencl_check as oc  # noqa: E402 - tests/backends/tvm/opencl_check.py

if (_why := oc.opencl_unavailable()) is not None:
    pytest.skip(f"no OpenCL device ({_why}); install: {oc.INSTALL_HINT}", allow_module_level=True)

import tvm  # noqa: E402
from tvm import relax, te, tirx  # noqa: E402
from tvm.target import Target  # noqa: E402

ADRENO = Target({"kind": "opencl", "device": "adreno"}, host={"kind": "llvm"})
H, V, G = 64, 96, 32


@pytest.fixture(scope="module")
def device() -> oc.OpenCLDevice:
    return oc.OpenCLDevice()


# ---- a toy module: rms_norm, an int4 GEMV that dequantises inside its sum, softmax, matmuls --


def rms_norm(x, w):
    k = te.reduce_axis((0, x.shape[1]), "k")
    ss = te.compute((x.shape[0],), lambda i: te.sum(x[i, k] * x[i, k], axis=k), name="ss")
    return te.compute(x.shape, lambda i, j: x[i, j] * tirx.rsqrt(ss[i] / H + 1e-6) * w[j],
                      name="rms")


def int4_gemv(x, codes, scales):
    """codes uint32 [V, H/8] (column 8w+i in bits 4i..4i+3), scales fp16 [V, H/G], zero 8."""
    k = te.reduce_axis((0, H), "k")

    def weight(n, kk):
        code = (codes[n, kk // 8] >> ((kk % 8) * 4).astype("uint32")) & tirx.const(15, "uint32")
        return (code.astype("float32") - 8.0) * scales[n, kk // G].astype("float32")

    return te.compute((x.shape[0], V), lambda i, n: te.sum(x[i, k] * weight(n, k), axis=k),
                      name="int4_gemv")


def _toy(rows) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, H), "float32"))
    w = relax.Var("w", relax.TensorType((H,), "float32"))
    codes = relax.Var("codes", relax.TensorType((V, H // 8), "uint32"))
    scales = relax.Var("scales", relax.TensorType((V, H // G), "float16"))
    m1 = relax.Var("m1", relax.TensorType((V, 32), "float32"))
    m2 = relax.Var("m2", relax.TensorType((32, 16), "float32"))
    with bb.function("main", [x, w, codes, scales, m1, m2]):
        with bb.dataflow():
            h = bb.emit_te(rms_norm, x, w)
            g = bb.emit_te(int4_gemv, h, codes, scales)
            p = bb.emit(relax.op.nn.softmax(g, axis=-1))
            out = bb.emit_output(relax.op.matmul(bb.emit(relax.op.matmul(p, m1)), m2))
        bb.emit_func_output(out)
    return bb.get()


def _toy_args(rows: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, (rows, H)).astype(np.float32),
            rng.uniform(0.5, 1.5, H).astype(np.float32),
            rng.integers(0, 2**32, (V, H // 8), dtype=np.uint64).astype(np.uint32),
            rng.uniform(0.01, 0.1, (V, H // G)).astype(np.float16),
            rng.uniform(-1, 1, (V, 32)).astype(np.float32),
            rng.uniform(-1, 1, (32, 16)).astype(np.float32)]


@pytest.fixture(scope="module", params=["decode (1 row)", "symbolic rows"])
def toy(request):
    """(relax module, scheduled module, OpenCL executable, dims, rows to run) for 1 row or a
    symbolic `n` rows (launch grids and host scalars then depend on n)."""
    rows = 1 if request.param.startswith("decode") else tirx.Var("n", "int64")
    mod = _toy(rows)
    with ADRENO:
        scheduled = relax.get_default_pipeline(ADRENO)(mod)
    exe = tvm.compile(scheduled, ADRENO, relax_pipeline=None)
    return mod, scheduled, exe, {"n": 5}, 1 if isinstance(rows, int) else 3


def test_every_toy_kernel_matches_llvm(toy, device):
    mod, scheduled, exe, dims, _ = toy
    checks = oc.check_kernels(scheduled, exe, ADRENO, dims=dims, device=device)
    names = {c.name for c in checks}
    assert names == set(oc.launch_plans(scheduled, ADRENO)) and len(names) >= 5
    bad = [c for c in checks if not c.ok]
    assert not bad, bad
    by_name = {c.name: c for c in checks}
    # the int4 GEMV is ONE kernel reading the packed words (no float copy of the weight)
    gemv = by_name["int4_gemv"]
    assert len(gemv.kernels) == 1
    assert "__global uint*" in oc.opencl_sections(exe)[gemv.kernels[0]]
    # its fp16 scales: PoCL has no cl_khr_fp16, so it ran widened (still matching fp32 closely)
    assert not device.has_fp16 and gemv.precision == "fp16 run as fp32"
    assert gemv.max_rel_diff <= oc.FP32_TOL
    assert all(c.precision == "fp32" for c in checks if c.name != "int4_gemv")


def test_whole_toy_step_on_opencl_matches_llvm_build(toy, device):
    mod, scheduled, exe, _, rows = toy
    args = _toy_args(rows)
    got, checks = oc.run_on_opencl(scheduled, exe, ADRENO, "main", args, device=device)
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    want = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
    assert got.shape == want.shape == (rows, 16)
    assert oc.rel_diff(got, want) <= oc.FP32_TOL
    assert len(checks) == 5 and all(c.ok for c in checks), checks


def test_a_wrong_kernel_or_launch_is_caught(device):
    """The comparison has teeth: a changed constant in the source, or swapped arguments."""
    with ADRENO:
        scheduled = relax.get_default_pipeline(ADRENO)(_toy(1))
    exe = tvm.compile(scheduled, ADRENO, relax_pipeline=None)
    plans = oc.launch_plans(scheduled, ADRENO)
    plan = plans["int4_gemv"]
    sections = oc.opencl_sections(exe)
    args = oc.random_inputs(plan.func, {}, np.random.default_rng(1))
    want = oc.LLVMReference(plans).run(plan, args)
    kernel = plan.launches[0].kernel
    assert "- 8.000000e+00f" in sections[kernel]
    zero7 = dict(sections, **{kernel: sections[kernel].replace("- 8.000000e+00f",
                                                               "- 7.000000e+00f")})
    got, widened = device.run(plan, zero7, args)
    assert not oc.compare(plan, got, want, widened).ok
    launch = plan.launches[0]
    swapped = oc.Launch(launch.kernel, (launch.args[1], launch.args[0], *launch.args[2:]),
                        launch.extents, launch.tags)
    plan2 = oc.FuncPlan(plan.name, plan.func, plan.host, (swapped,), plan.written)
    got, widened = device.run(plan2, sections, args)
    assert not oc.compare(plan2, got, want, widened).ok


def test_rel_diff_compares_finite_values_and_pins_the_others():
    """-inf where no kernel is visible must sit at the same places on both sides; the finite
    values compare relatively."""
    b = np.array([-np.inf, 1.0, 2.0], np.float32)
    assert oc.rel_diff(np.array([-np.inf, 1.0, 2.0 + 2e-6], np.float32), b) <= oc.FP32_TOL
    assert oc.rel_diff(np.array([0.0, 1.0, 2.0], np.float32), b) == float("inf")
    assert oc.rel_diff(np.array([np.inf, 1.0, 2.0], np.float32), b) == float("inf")
    assert oc.rel_diff(np.array([-np.inf, 1.0, 2.1], np.float32), b) > oc.FP32_TOL


def test_no_opencl_module_is_one_clear_error():
    exe = tvm.compile(_toy(1), "llvm")
    with pytest.raises(oc.NotAvailableError, match="no OpenCL module"):
        oc.opencl_sections(exe)


# ---- the demo model: every kernel of its prefill and decode step, and one whole decode step --


@pytest.fixture(scope="module")
def demo_build():
    """The demo (dense attention) with every linear RTN-quantised to 4 bits, group 32, fp16
    scales, lowered by the tvm backend and built for Adreno; plus the reference model on the
    same (dequantised) weights. The host build decodes with fp32 activations, like the device
    build, so whole steps compare at fp32 tolerance."""
    import torch
    from arkinfer.backends.tvm.compile import build
    from arkinfer.backends.tvm.weights import program_params
    from arkinfer.lowering.source_weights import SourceWeights
    from arkinfer.quant.rtn import quantize_rtn

    from arkinfer.frontend.checkpoint import load
    from arkinfer.ir.tracing import trace

    ckpt, model = load("demo", dense=True)

    class RTNWeights(SourceWeights):
        def quantised(self, weight_name, shape):
            w = self.ckpt.weights.get(weight_name).to(torch.float32)
            qw = quantize_rtn(w, 4, 32, scale_dtype=torch.float16,
                              name=weight_name.removesuffix(".weight"))
            model.get_submodule(weight_name.removesuffix(".weight").removeprefix("model.")
                                if weight_name.startswith("lm_head") else
                                weight_name.removesuffix(".weight")).weight.data = \
                qw.dequantize().to(torch.float32)
            return qw

    program = trace("demo", dtype=torch.float32, dense=True)
    params, layers = program_params(program, RTNWeights(ckpt.path))
    assert any("q4" in v for v in layers.values())
    return build(program, params, devices=("adreno",), decode_activations="f32"), model, ckpt


def prefill_then_decode_on_opencl(b, ids: list[int], hkv: int, d: int, device):
    """Prefill ids[:-1] from an empty cache, then decode ids[-1], every kernel of the Adreno build
    on OpenCL: (outputs, the host (llvm) build's outputs, kernel checks) of prefill and decode."""
    target, scheduled = b.device_targets["adreno"], b.device_mod_scheduled["adreno"]
    exe, sig = b.device_exec["adreno"], b.signature
    weights = [b.params[n] for n in sig.params]
    empty = [np.zeros((1, hkv, 0, d), np.float32) for _ in sig.entries["prefill"].inputs[2:]]
    host = relax.VirtualMachine(b.host_exec, tvm.cpu())

    def step(entry, tokens, start, caches):
        args = [np.asarray([tokens], np.int64), np.arange(start, start + len(tokens)),
                *caches, *weights]
        got, checks = oc.run_on_opencl(scheduled, exe, target, entry, args, device=device)
        want = oc._numpy(host[entry](*[tvm.runtime.tensor(a) for a in args]))
        return got, want, checks

    pre = step("prefill", ids[:-1], 0, empty)
    return pre, step("decode", ids[-1:], len(ids) - 1, pre[0][1:])


def test_demo_prefill_and_decode_on_opencl(demo_build, device):
    import torch
    from arkinfer.generate import model_logits_fn

    b, model, ckpt = demo_build
    target, scheduled = b.device_targets["adreno"], b.device_mod_scheduled["adreno"]
    cfg = ckpt.config
    ids = ckpt.tokenizer.encode("Most bread is made from flour, water", add_special_tokens=False)
    (pre, pre_host, pre_checks), (dec, dec_host, dec_checks) = prefill_then_decode_on_opencl(
        b, ids, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads, device)
    checks = pre_checks + dec_checks
    # every device kernel of both entry points ran on OpenCL, on the step's real activations
    assert {c.name for c in checks} == set(oc.launch_plans(scheduled, target))
    bad = [c for c in checks if not c.ok]
    assert not bad, bad
    assert any(c.precision == "fp16 run as fp32" for c in checks)  # the int4 linears
    for got, want in ((pre, pre_host), (dec, dec_host)):
        assert max(oc.rel_diff(g, w) for g, w in zip(got, want)) <= oc.FP32_TOL
    # the whole decode step on OpenCL predicts what the reference model predicts
    with torch.no_grad():
        ref = model_logits_fn(model)(ids)[-1].numpy()
    assert int(np.argmax(dec[0][0, -1])) == int(np.argmax(ref))
    assert oc.rel_diff(dec[0][0, -1], ref) < 1e-3


# ---- InfLLM v2: the sparse-attention kernels of a sparse_config model, prefill and decode ----

# Blocks of 16, budget 6 blocks (96 keys), dense below 150 tokens (test_tvm_infllmv2.py's config)
SMALL_SPARSE = {"kernel_size": 8, "kernel_stride": 4, "block_size": 16, "init_blocks": 1,
                "window_size": 32, "topk": 4, "use_nope": False, "dense_len": 150}


@pytest.fixture(scope="module")
def sparse_build(tmp_path_factory):
    """A tiny MiniCPM4 (GQA 4/2, LongRoPE) with SMALL_SPARSE, float weights, built for Adreno:
    its prefill and decode entries hold the InfLLM v2 kernels (kernels_infllmv2.py)."""
    import torch
    from arkinfer.backends.tvm.compile import build
    from arkinfer.backends.tvm.weights import program_params
    from arkinfer.lowering.source_weights import SourceWeights
    from arkinfer.ir.tracing import trace
    from arkinfer.models.configs import tiny_config
    from arkinfer.testing.synthetic import write_checkpoint

    src = write_checkpoint(tmp_path_factory.mktemp("pocl-sparse") / "hf",
                           tiny_config("minicpm", vocab_size=300, sparse_config=SMALL_SPARSE))
    program = trace(src, dtype=torch.float32)
    params, _ = program_params(program, SourceWeights(src))
    return build(program, params, devices=("adreno",)), src


def test_infllmv2_kernels_on_opencl_past_dense_len(sparse_build, device):
    """Prefill 170 tokens (total >= dense_len: InfLLM v2 selects 6 of 11 blocks) then one decode
    step, every kernel on PoCL: each equals its llvm build on the step's real inputs, every
    kernel of both entries ran (the InfLLM v2 ones included), and both steps equal the host
    build of the module; the decode's top-1 is the reference model's."""
    from arkinfer.pipeline.reference_runner import ReferenceRunner

    from arkinfer.frontend.checkpoint import open_checkpoint

    b, src = sparse_build
    target, scheduled = b.device_targets["adreno"], b.device_mod_scheduled["adreno"]
    cfg = open_checkpoint(src, with_tokenizer=False).config
    ids = np.random.default_rng(3).integers(3, 300, 171).tolist()
    (pre, pre_host, pre_checks), (dec, dec_host, dec_checks) = prefill_then_decode_on_opencl(
        b, ids, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads, device)
    checks = pre_checks + dec_checks
    assert {c.name for c in checks} == set(oc.launch_plans(scheduled, target))
    infllm = {c.name for c in checks if c.name.startswith("infllm")}
    assert {"infllm_coarse_lse", "infllm_group_scores"} <= infllm, sorted({c.name for c in checks})
    bad = [c for c in checks if not c.ok]
    assert not bad, bad
    for got, want in ((pre, pre_host), (dec, dec_host)):
        assert max(oc.rel_diff(g, w) for g, w in zip(got, want)) <= oc.FP32_TOL
    ref = ReferenceRunner(src)
    ref.prefill(ids[:-1])
    assert int(np.argmax(dec[0][0, -1])) == int(ref.decode(ids[-1]).argmax())
