"""`arkinfer build` on the demo model: the artifact, its manifest, atomicity and the gate."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.pipeline import manifest as mf

runner = CliRunner()
SCHEMA = json.loads((Path(mf.__file__).with_name("manifest.schema.json")).read_text())
ARK = [sys.executable, "-m", "arkinfer.cli.main"]


def test_manifest_validates_and_hashes_every_file(demo_artifact):
    m = json.loads((demo_artifact / "arkinfer.json").read_text())
    jsonschema.validate(m, SCHEMA)  # independent of our validator
    files = {p.relative_to(demo_artifact).as_posix(): p for p in demo_artifact.rglob("*")
             if p.is_file() and p.name != "arkinfer.json"}
    assert set(m["files"]) == set(files)
    for rel, p in files.items():
        assert m["files"][rel]["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
        assert m["files"][rel]["bytes"] == p.stat().st_size
    assert m["source"]["config_sha256"] == hashlib.sha256(
        (Path(m["source"]["path"]) / "config.json").read_bytes()).hexdigest()
    assert m["quant"]["recipe"]["format"] == "gguf-q4_0"
    # RTN (q4_0) quantises from the weights alone: no calibration recorded
    assert m["quant"]["calibration_sha256"] is None and m["quant"]["calibration"]["tokens"] == 0
    assert m["quant"]["layers"], "per-layer recipe recorded"
    assert "InfLLM v2" in m["backend"]["ops"]["attention"]
    assert m["ir"]["ops"]["attention"] > 0 or any("attention" in k for k in m["ir"]["ops"])
    assert m["verification"]["passed"] is True
    assert m["memory"]["kv_bytes_per_token"] == 2 * 4 * 2 * 32 * 2  # 2*layers*kv_heads*dim*fp16
    # the long prompt crosses dense_len (1024), so InfLLM v2 ran during verification
    assert max(m["verification"]["prompt_lengths"]) > 1024


def test_verify_passes_and_reports_metrics(demo_artifact):
    res = runner.invoke(app, ["verify", str(demo_artifact), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["passed"] and out["metrics"]["top1_agreement"] >= 0.7
    assert out["metrics"]["tokenizer_agreement"] == 1.0


def test_corrupting_one_byte_fails_verify_naming_the_file(demo_artifact, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(demo_artifact, copy)
    shard = sorted((copy / "model").glob("*.safetensors"))[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    res = runner.invoke(app, ["verify", str(copy)])
    assert res.exit_code == 1
    assert shard.name in res.output and "sha256 differs" in res.output


def test_impossible_threshold_fails_build_and_leaves_nothing(tmp_path):
    out = tmp_path / "dist" / "bad"
    res = runner.invoke(app, ["build", "--quant", "q8_0", "--samples", "4", "--seq-len", "64",
                              "-o", str(out), "--threshold", "kl=0"])
    assert res.exit_code == 1
    assert "mean_kl" in res.output and "> threshold 0.0" in res.output
    assert not out.exists()
    assert list(out.parent.iterdir()) == []  # no staging or work folders either


def test_a_fidelity_failure_does_not_suggest_a_threshold(tmp_path, monkeypatch):
    """Runtime against reference on the same weights has no --threshold key: the hint says what
    such a failure is instead."""
    import arkinfer.pipeline.build as build_module

    failure = ("fidelity top1_agreement 0.5000 < threshold 0.95 (runtime vs the reference model "
               "on the same quantised weights)")
    monkeypatch.setattr(build_module, "backend_fidelity",
                        lambda *a, **k: {"passed": False, "failure": failure})
    out = tmp_path / "dist" / "bad"
    res = runner.invoke(app, ["build", "--quant", "q8_0", "-o", str(out)])
    assert res.exit_code == 1
    assert "fidelity top1_agreement 0.5000" in res.output and "--threshold" not in res.output
    assert "runtime disagrees with ArkInfer's reference model" in " ".join(res.output.split())
    assert not out.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_build_leaves_no_artifact(tmp_path, sig):
    out = tmp_path / "dist" / "killed"
    out.parent.mkdir()
    proc = subprocess.Popen([*ARK, "build", "--quant", "q4_0", "--samples", "64", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=tmp_path)
    staging = out.parent / f".{out.name}.building-{proc.pid}"
    deadline = time.time() + 120
    while not staging.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert staging.exists(), "the build never started"
    os.kill(proc.pid, sig)
    proc.wait(timeout=60)
    assert not out.exists()
    if sig == signal.SIGTERM:  # handled: cleans up after itself
        assert list(out.parent.iterdir()) == []
    else:  # SIGKILL cannot be handled: the next build of the same name removes the leftovers
        from arkinfer.output_folder import remove_leftovers

        assert staging.exists()
        remove_leftovers(out)
        assert list(out.parent.iterdir()) == []


@pytest.mark.parametrize(("args", "expect"), [
    (["--target", "no-such-board"], "unknown target 'no-such-board'"),
    (["--quant", "q5_k"], "unknown --quant 'q5_k'"),
    (["--target", "rpi5", "--quant", "marlin"], "quant format 'marlin' is not allowed"),
    (["--target", "android", "--backend", "tvm", "--quant", "marlin"], "backend 'tvm'"),
])
def test_bad_requests_fail_before_any_work(tmp_path, args, expect):
    t0 = time.time()
    res = runner.invoke(app, ["build", *args, "-o", str(tmp_path / "x")])
    assert res.exit_code == 1
    assert expect in res.output, res.output
    assert "hint:" in res.output
    assert not (tmp_path / "x").exists()
    assert time.time() - t0 < 20


def test_existing_output_needs_force(demo_artifact):
    res = runner.invoke(app, ["build", "-o", str(demo_artifact)])
    assert res.exit_code == 1 and "already exists" in res.output and "--force" in res.output


def test_ternary_builds_the_demo_model(tmp_path):
    res = runner.invoke(app, ["build", "--quant", "ternary", "--samples", "8", "--seq-len", "128",
                              "-o", str(tmp_path / "t"), "--json"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)
    # GGUF TQ needs 256-column rows; the demo's are 128 wide, so the plan picks `ternary`
    assert m["quant"]["recipe"]["format"] == "ternary"
    assert not m["quant"]["float_layers"]
    assert any("using ternary instead" in n for n in m["backend"]["notes"])
    assert m["quant"]["bits_per_weight"] < 2.5


def test_gptq_build_records_its_calibration_cost_beside_the_prediction(tmp_path):
    """The manifest carries what `plan` predicted for the calibration and what it measured."""
    res = runner.invoke(app, ["build", "--quant", "gptq", "--samples", "4", "--seq-len", "64",
                              "-o", str(tmp_path / "g"), "--json"])
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "g" / "arkinfer.json").read_text())
    jsonschema.validate(m, SCHEMA)
    cost = m["quant"]["calibration_cost"]
    predicted, measured = cost["predicted"], cost["measured"]
    assert predicted["seconds"] > 0 and predicted["peak_bytes"] > 2**20
    assert predicted["flops"]["forward"] > 0 and predicted["matmul_flop_s"] > 1e8
    assert measured["seconds"] > 0
    if Path("/proc/self/clear_refs").exists():
        assert measured["peak_rss_bytes"] > 2**20
    res = runner.invoke(app, ["build", "--quant", "q4_0", "-o", str(tmp_path / "r"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["quant"].get("calibration_cost") is None  # no calibration
