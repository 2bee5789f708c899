"""The seams a new backend is written against (issue #13): one declared backend contract, one
`--quant` resolver for build / plan / quantize, formats that own their facts, and a manifest that
records what was really lowered. Each test fails on the code before the fix."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from arkinfer.backend import (Backend, BackendBase, backend_names, check_token_ids,
                              get_backend)
from arkinfer.cli.main import app
from arkinfer.errors import ArkError, TargetError
from arkinfer.frontend.demo import demo_model_path
from arkinfer.quant.formats import all_formats
from arkinfer.resolve import resolve
from arkinfer.targets import load_target

runner = CliRunner()
CALIB = ["--samples", "4", "--seq-len", "64"]
# SmolLM2-135M's shapes (576-wide rows: the g128 presets do not divide them)
SMOLLM2 = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 576,
           "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
           "num_hidden_layers": 30, "vocab_size": 49152, "max_position_embeddings": 8192,
           "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True,
           "torch_dtype": "bfloat16"}


@pytest.fixture
def smollm2_config(tmp_path):
    folder = tmp_path / "smollm2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(SMOLLM2))
    return folder


@pytest.mark.parametrize("name", backend_names())
def test_every_registered_backend_declares_the_whole_contract(name):
    backend = get_backend(name)
    assert isinstance(backend, Backend) and isinstance(backend, BackendBase)
    assert isinstance(backend.ir_passes, tuple) and 0 < backend.fidelity_top1 <= 1


def test_plan_and_build_resolve_gptq_for_smollm2_to_the_same_recipe(smollm2_config):
    host = load_target("host")
    r = resolve("gptq", SMOLLM2, host)
    assert r.recipe.group_size == 64 and any("group size 64" in n for n in r.notes)
    res = runner.invoke(app, ["plan", str(smollm2_config), "--target", "host", "--quant", "gptq",
                              "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    kept = plan["cost"]["float_layers"]
    # before: plan reported every linear as "stays bf16" while build quantised them at g64
    assert not [t for t in kept if ".layers." in t["name"]], kept
    assert any("group size 64" in n for n in plan["notes"])


@pytest.mark.parametrize(("quant", "scheme"), [("int4", "q4_0"), ("fp16", "f16"),
                                                ("FP32", "f32"), ("bfloat16", "bf16")])
def test_build_accepts_the_names_plan_accepts(quant, scheme, tmp_path):
    from arkinfer.pipeline.plan import resolve_plan

    plan = resolve_plan("demo", target="host", quant=quant, backend="gguf" if quant == "int4"
                        else None, out=tmp_path / "a")
    assert plan.quant == scheme


def test_an_unknown_quant_names_every_accepted_value():
    with pytest.raises(ArkError, match="unknown --quant 'q5_k'.*int4.*f16.*q4_0"):
        resolve("q5_k", SMOLLM2, load_target("host"))


def test_gguf_impossibility_fails_before_any_work(tmp_path, monkeypatch):
    """preflight raises on an impossible build (here: no llama.cpp architecture) — before the
    calibration, not after it."""
    import arkinfer.quant.calib_data as calib_data

    def no_calibration(*a, **k):
        raise AssertionError("calibration started although the build is impossible")

    monkeypatch.setattr(calib_data, "load_calibration", no_calibration)
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(SMOLLM2, model_type="gpt2")))
    res = runner.invoke(app, ["build", str(folder), "--target", "rpi5", "--quant", "q4_0",
                              "-o", str(tmp_path / "out")])
    assert res.exit_code == 1 and "no llama.cpp architecture" in res.output, res.output
    with pytest.raises(TargetError):
        get_backend("gguf").preflight({"model_type": "gpt2"}, None, None, "f32")


def test_manifest_passes_and_op_counts_are_those_of_the_lowered_program(tmp_path):
    import torch

    from arkinfer import ir

    res = runner.invoke(app, ["build", "demo", "--target", "host", "--backend", "reference",
                              "--quant", "f32", "-o", str(tmp_path / "a"), "--json"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)
    backend = get_backend(m["backend"]["name"])
    assert m["ir"]["passes"] == list(backend.ir_passes)
    program = ir.run_passes(ir.trace(str(demo_model_path()), dtype=torch.float32,
                                     shape_only=True),
                            backend.ir_passes)
    counts: dict[str, int] = {}
    for graph in program.entries.values():
        for node in graph.nodes:
            counts[str(node.op)] = counts.get(str(node.op), 0) + 1
    assert m["ir"]["ops"] == dict(sorted(counts.items()))


def test_every_format_answers_its_own_size_and_shape_questions():
    for fmt in all_formats():
        bits = fmt.constraints.bits[0]
        group = 256 if fmt.name.startswith("gguf-tq") else 32
        assert fmt.nbytes(64, 512, bits=bits, group_size=group, sym=True) > 0
        assert fmt.shape_refusal(64, 512, bits=bits, group_size=group) is None
        assert fmt.shape_refusal(64, 500, bits=bits, group_size=group) is not None


def test_onnx_is_a_backend_of_its_own_and_tensorrt_extends_it(tmp_path):
    # tensorrt composes the onnx backend through the registry (no subclass, no import): its
    # declaration, host runner and reference weights are the onnx backend's own
    onnx, trt = get_backend("onnx"), get_backend("tensorrt")
    assert not isinstance(trt, type(onnx)) and isinstance(trt, BackendBase)
    assert trt.capabilities is onnx.capabilities and trt.available() == onnx.available()
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}", encoding="utf-8")
    assert trt.reference_weights(tmp_path) == onnx.reference_weights(tmp_path) == tmp_path / "hf"
    res = runner.invoke(app, ["build", "demo", "--target", "host", "--backend", "onnx",
                              "--quant", "gptq", *CALIB, "-o", str(tmp_path / "a"), "--json"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)
    assert m["backend"]["name"] == "onnx" and "model.onnx" in m["files"]
    assert m["verification"]["passed"] and m["verification"]["fidelity"]["passed"]


def test_targets_output_is_untruncated_when_piped():
    res = runner.invoke(app, ["targets"])  # CliRunner's stdout is not a terminal
    assert res.exit_code == 0
    ids = [line.split("\t")[0] for line in res.output.splitlines()]
    assert "jetson-agx-orin-64gb" in ids and "android-sd8gen3" in ids


def test_core_imports_no_backend_and_ships_no_fixture_in_its_packages():
    """The core (arkinfer/) never imports a plugin; fixtures live in arkinfer/testing/ only."""
    import re
    from pathlib import Path

    import arkinfer

    root = Path(arkinfer.__file__).parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if re.search(r"^\s*(from|import) arkinfer\.backends", p.read_text(), re.M)]
    assert offenders == []
    for fixture in ("synthetic.py", "gguf_synthetic.py", "smollm2.py", "golden.py"):
        assert [p.parent.name for p in root.rglob(fixture)] == ["testing"], fixture


def test_each_name_means_one_thing():
    """VerifyError, DType, TensorPlan and arch_spec each meant two things before."""
    from arkinfer import ir
    from arkinfer.frontend import gguf_model
    from arkinfer.pipeline import verify
    from arkinfer.targets import model as target_model

    assert ir.IRVerifyError is not verify.VerifyError and not hasattr(ir, "VerifyError")
    assert hasattr(target_model, "DeviceDType") and not hasattr(target_model, "DType")
    assert hasattr(gguf_model, "ImportTensor") and not hasattr(gguf_model, "TensorPlan")
    assert hasattr(gguf_model, "spec_from_gguf") and not hasattr(gguf_model, "arch_spec")


def test_one_token_id_check_names_the_bad_input():
    """Every runner checks a step's ids with `check_token_ids`: the same messages everywhere."""
    check_token_ids([0, 5, 9], 10, cached=1, max_positions=4)  # fills the context exactly
    with pytest.raises(ArkError, match="no tokens to evaluate"):
        check_token_ids([], 10)
    with pytest.raises(ArkError, match=r"token id 10 is outside the vocabulary 0\.\.9") as err:
        check_token_ids([1, 10, -1], 10)
    assert "tokenizer" in err.value.hint
    with pytest.raises(ArkError, match="token id -1 is outside"):
        check_token_ids([-1], 10)
    with pytest.raises(ArkError, match=r"3 cached \+ 2 new tokens exceed the context of 4") as err:
        check_token_ids([1, 2], 10, cached=3, max_positions=4, length_hint="load a longer one")
    assert err.value.hint == "load a longer one"
