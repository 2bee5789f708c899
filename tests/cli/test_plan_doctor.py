"""`arkinfer plan` and `arkinfer doctor` through a Typer app around the two commands, and the host
measurements they share (a real measurement into a temporary cache)."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from arkinfer.cli import doctor, plan
from arkinfer.latency.source import KNOWN_CONFIGS


@pytest.fixture(scope="module")
def app():
    app = typer.Typer(pretty_exceptions_enable=False)
    app.command(name="plan", help=plan.HELP)(plan.command)
    app.command(name="doctor", help=doctor.HELP)(doctor.command)

    @app.callback()
    def _root() -> None:
        pass

    return app


@pytest.fixture(scope="module")
def host_cache(tmp_path_factory):
    """One real host measurement for the module, in a temporary $ARKINFER_CACHE."""
    mp = pytest.MonkeyPatch()
    mp.setenv("ARKINFER_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


def invoke(app, *args):
    result = CliRunner().invoke(app, [*map(str, args)])
    return result.exit_code, result.stdout, result.stderr


def test_plan_minicpm_on_orin_int4_json(app):
    code, out, err = invoke(app, "plan", "minicpm4.1-8b", "--target", "jetson-orin", "--quant",
                            "int4", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert (data["backend"], data["quant"], data["fits"]) == ("tensorrt", "marlin", True)
    rows = {(p["ctx"], p["attention"]): p for p in data["predictions"]}
    assert set(rows) == {(c, a) for c in (4096, 32768, 131072) for a in ("dense", "sparse")}
    assert 33 < rows[4096, "dense"]["decode_tok_s"] < 41  # docs/targets.md: ~37 tok/s
    assert rows[131072, "sparse"]["decode_tok_s"] > 1.5 * rows[131072, "dense"]["decode_tok_s"]
    assert rows[131072, "sparse"]["decode_attention"] == "sparse"
    assert data["cost"]["kv_bytes_per_token"] == 32768
    assert data["target_formats"]["tensorrt"]["quant_formats"][0] == "marlin"
    # every number carries its provenance
    inputs = rows[4096, "dense"]["inputs"]
    assert inputs["bandwidth"]["provenance"] == "vendor" and inputs["eta_bw"]["value"] == 0.79


def test_plan_refuses_fp16_on_rpi5_with_the_numbers(app, monkeypatch):
    monkeypatch.setenv("ARKINFER_LLAMACPP", "upstream")  # even where the InfLLM v2 build exists
    code, out, err = invoke(app, "plan", "minicpm4.1-8b", "-t", "rpi5", "-q", "fp16")
    assert code == 1
    assert "f16 does not fit rpi5-8gb" in err and "16.37 GB" in err and "q4_0" in err
    assert "NO" in out  # the table is still printed
    code, out, err = invoke(app, "plan", "minicpm4.1-8b", "-t", "rpi5", "-q", "int4")
    assert code == 0, err
    assert "q4_0" in out and "InfLLM v2 not on gguf" in out


def test_plan_from_a_bare_config_json(app, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(KNOWN_CONFIGS["minicpm4.1-8b"]))
    code, out, err = invoke(app, "plan", path, "-t", "apple-m4-pro", "-q", "mlx4", "--json",
                            "-c", "8192")
    assert code == 0, err
    data = json.loads(out)
    assert data["model"].startswith(str(path)) and data["contexts"] == [8192]
    assert [p["decode_attention"] for p in data["predictions"]] == ["dense", "sparse"]


def test_plan_unknown_model_and_scheme(app):
    code, _, err = invoke(app, "plan", "no-such-model", "-t", "rpi5", "-q", "q4_0")
    assert code == 1 and "minicpm4.1-8b" in err
    code, _, err = invoke(app, "plan", "minicpm4.1-8b", "-t", "rpi5", "-q", "q3_k")
    assert code == 1 and "unknown --quant 'q3_k'" in err


def test_doctor_measures_once_then_host_plans(app, host_cache):
    code, out, err = invoke(app, "doctor", "--json")
    assert code == 0, err
    data = json.loads(out)
    host = data["host"]
    assert host["from_cache"] is False and host["copy_bandwidth_bytes_s"] > 1e8
    assert host["matmul_fp32_flop_s"] > 1e8 and host["memory_bytes"] > 2**28
    assert {b["name"] for b in data["backends"]} >= {"reference", "gguf"}
    assert data["packages"]["torch"]
    decode = data["infllmv2_decode"]     # what a sparse decode step runs on here
    from arkinfer.ops.infllmv2.native import kernels
    assert decode["path"] == ("C kernel" if kernels() is not None else "torch")
    code, out, _ = invoke(app, "doctor", "--json")
    assert json.loads(out)["host"]["from_cache"] is True
    assert json.loads(out)["host"]["date"] == host["date"]

    from arkinfer.latency import host_target

    t = host_target(measure_if_missing=False)
    assert t.bandwidth.value == host["copy_bandwidth_bytes_s"]
    assert str(t.bandwidth.provenance) == "measured" and t.roofline == "fp32"
    code, out, err = invoke(app, "plan", "demo", "-t", "host", "-q", "q4_0", "--json",
                            "-c", "512")
    assert code == 0, err
    p = json.loads(out)["predictions"][0]
    assert p["inputs"]["bandwidth"]["value"] == host["copy_bandwidth_bytes_s"]
    step = p["decode"]  # host η_bw 0.9 and η_c 0.5 (targets/host.toml)
    assert 1 / p["decode_tok_s"] == pytest.approx(max(
        step["bytes"] / (0.9 * host["copy_bandwidth_bytes_s"]),
        step["flops"] / (0.5 * host["matmul_fp32_flop_s"])))


def test_plan_predicts_the_builds_calibration_from_the_measured_matmul_rate(app, host_cache):
    from arkinfer.quant.calib.cost import predict_calibration
    from arkinfer.quant.recipe import get_preset

    from arkinfer.targets.host import host_measurement

    rate = host_measurement(measure_if_missing=True)["matmul_fp32_flop_s"]
    code, out, err = invoke(app, "plan", "minicpm4.1-8b", "-t", "jetson-orin", "-q", "marlin",
                            "--samples", "8", "--seq-len", "256", "--json")
    assert code == 0, err
    build = json.loads(out)["build"]
    assert (build["samples"], build["seq_len"]) == (8, 256)
    calib = build["calibration"]
    import torch

    want = predict_calibration(KNOWN_CONFIGS["minicpm4.1-8b"], get_preset("marlin"), 8, 256,
                               rate, static_passes=2, threads=torch.get_num_threads())
    assert calib["predicted"] is True and calib["blocks"] == 32
    assert calib["seconds"] == want.seconds and calib["peak_bytes"] == want.peak_bytes
    assert build["disk_bytes"] > 4e9  # two copies of ~5 GB of marlin weights at least
    code, out, err = invoke(app, "plan", "minicpm4.1-8b", "-t", "jetson-orin", "-q", "marlin",
                            "--samples", "8", "--seq-len", "256")
    assert code == 0, err
    assert "building it (predicted)" in out and "32 blocks" in out


def test_plan_predicts_the_calibration_on_a_named_gpu(app, tmp_path, monkeypatch):
    from arkinfer.quant.calib.cost import predict_calibration_on_gpu
    from arkinfer.quant.calib.gpus import GPUS
    from arkinfer.quant.recipe import get_preset

    monkeypatch.setenv("ARKINFER_CACHE", str(tmp_path))  # the GPU needs no host measurement
    code, out, err = invoke(app, "plan", "minicpm4.1-8b", "-t", "jetson-orin", "-q", "marlin",
                            "--samples", "128", "--seq-len", "2048", "--gpu", "h100", "--json")
    assert code == 0, err
    gpu = json.loads(out)["build"]["calibration_gpu"]
    want = predict_calibration_on_gpu(KNOWN_CONFIGS["minicpm4.1-8b"], get_preset("marlin"), 128,
                                      2048, GPUS["h100"], static_passes=2)
    assert gpu["predicted"] is True and gpu["gpu"] == "NVIDIA H100 SXM"
    assert gpu["seconds"] == want.seconds and gpu["peak_bytes"] == want.peak_bytes
    assert gpu["seconds"] < 15 * 60  # the target for one H100 at 128 x 2048
    code, out, err = invoke(app, "plan", "minicpm4.1-8b", "-t", "jetson-orin", "-q", "marlin",
                            "--gpu", "h100")
    assert code == 0, err
    assert "calibration on NVIDIA H100 SXM" in out and "of the GPU's 80.00 GB" in out
    code, out, err = invoke(app, "plan", "minicpm4.1-8b", "-t", "jetson-orin", "-q", "marlin",
                            "--gpu", "t4")
    assert code != 0 and "'t4'" in out + err and "h100-pcie" in out + err


def test_plan_says_what_it_cannot_predict_about_the_build(app, tmp_path, monkeypatch):
    monkeypatch.setenv("ARKINFER_CACHE", str(tmp_path))  # this machine not measured
    code, out, err = invoke(app, "plan", "minicpm4.1-8b", "-t", "jetson-orin", "-q", "marlin",
                            "--json")
    assert code == 0, err
    calib = json.loads(out)["build"]["calibration"]
    assert calib["predicted"] is False and "arkinfer doctor" in calib["why"]
    code, out, err = invoke(app, "plan", "minicpm4.1-8b", "-t", "rpi5", "-q", "q4_0", "--json")
    assert json.loads(out)["build"]["calibration"]["why"].startswith("no calibration")
