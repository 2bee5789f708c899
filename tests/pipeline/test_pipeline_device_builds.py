"""`arkinfer build` for device targets on the demo model: the backends through the whole pipeline.

The verification in the manifest holds both gates: against the float model (quantisation loss)
and `fidelity`, the runtime against ArkInfer's reference model on the same quantised weights
(lowering/runtime error only)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from arkinfer.cli.main import app

runner = CliRunner()
CALIB = ["--samples", "8", "--seq-len", "128"]


def _build(tmp_path, *args):
    res = runner.invoke(app, ["build", *args, *CALIB, "-o", str(tmp_path / "a"), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_jetson_orin_marlin_artifact_verifies_in_onnxruntime(tmp_path):
    m = _build(tmp_path, "--target", "jetson-orin", "--quant", "marlin")
    assert m["backend"]["name"] == "tensorrt" and m["target"]["id"] == "jetson-agx-orin-64gb"
    assert {"model.onnx", "hf/config.json"} <= set(m["files"])
    fid = m["verification"]["fidelity"]
    assert fid["reference_weights"] == "hf"
    assert fid["top1_agreement"] >= 0.99 and fid["passed"]
    assert fid["max_abs_logit_diff"] < 1e-2
    qcfg = json.loads((tmp_path / "a" / "hf" / "config.json").read_text())["quantization_config"]
    assert qcfg["quant_method"] == "gptq" and qcfg["checkpoint_format"] == "marlin"
    # the checkpoint layouts take GPTQ's second pass over static groups (quant/recipe.py)
    assert all(r["recipe"].endswith("static-groups 2-pass")
               for r in m["quant"]["layers"].values() if r["status"] == "quantised")


@pytest.mark.llamacpp
def test_rpi5_q4_0_artifact_verifies_in_llama_cpp(tmp_path):
    pytest.importorskip("llama_cpp")
    m = _build(tmp_path, "--target", "rpi5", "--quant", "q4_0")
    assert m["backend"]["name"] == "gguf" and set(m["files"]) == {"model.gguf"}
    assert m["verification"]["passed"]
    assert m["verification"]["metrics"]["tokenizer_agreement"] == 1.0
    assert "dense" in m["backend"]["ops"]["attention"]  # llama.cpp ignores sparse_config


def test_marlin_shape_rule_is_checked_before_any_work(tmp_path):
    from arkinfer.testing.smollm2 import smollm2_hf_dir

    res = runner.invoke(app, ["build", str(smollm2_hf_dir()), "--target", "jetson-orin",
                              "--quant", "marlin", "-o", str(tmp_path / "x")])
    assert res.exit_code == 1
    assert "model.layers.0" in res.output and "128" in res.output
    assert not (tmp_path / "x").exists()
