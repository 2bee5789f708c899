"""The build's own cost (arkinfer/pipeline/build_cost.py): a calibration that cannot fit is
refused before it starts with the numbers; a stage's peak resident set is measured."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from arkinfer.errors import CheckpointError
from arkinfer.pipeline.build_cost import (
    check_calibration_memory,
    cost_line,
    measure_stage,
    predict_build,
)


def test_a_calibration_predicted_beyond_memory_is_refused_with_the_numbers(monkeypatch):
    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=4 * 2**30))
    fits = {"predicted": {"seconds": 10.0, "peak_bytes": 5 * 2**30}}  # 70 % of it fits
    check_calibration_memory(fits)
    too_big = {"predicted": {"seconds": 10.0, "peak_bytes": 8 * 2**30}}
    with pytest.raises(CheckpointError, match=r"predicted peak 8\.00 GiB.*4\.00 GiB") as err:
        check_calibration_memory(too_big)
    assert "--samples" in err.value.hint
    check_calibration_memory({"predicted": None, "why": "not modelled"})  # nothing to check


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux /proc only")
def test_measure_stage_sees_the_peak_of_its_body_only():
    import numpy as np

    big = np.ones(64 * 2**20 // 8)  # 64 MiB touched before the stage
    del big
    with measure_stage() as m:
        a = np.ones(256 * 2**20 // 8)  # 256 MiB inside
        a.sum()
        del a
    assert m["seconds"] >= 0 and m["peak_rss_bytes"] > 256 * 2**20
    line = cost_line({"predicted": {"seconds": 12.0, "peak_bytes": 2**30}, "measured": m})
    assert line.startswith("calibration took") and "plan predicted 12 s, 1.00 GiB" in line


def test_float_and_weight_only_builds_predict_no_calibration_but_disk():
    from arkinfer.quant.recipe import get_preset

    from arkinfer.latency.source import KNOWN_CONFIGS

    raw = KNOWN_CONFIGS["minicpm4.1-8b"]
    fp16 = predict_build(raw, "f16", 128, 512)
    assert fp16["calibration"]["predicted"] is False and fp16["disk_bytes"] > 16e9
    q4 = predict_build(raw, get_preset("q4_0"), 128, 512)
    assert q4["calibration"]["why"].startswith("no calibration") and q4["disk_bytes"] < 16e9
    awq = predict_build(raw, get_preset("awq"), 128, 512)
    assert awq["calibration"]["predicted"] is False and "awq" in awq["calibration"]["why"]


def test_calibration_on_a_known_gpu_is_predicted_and_checked_against_its_free_memory(monkeypatch):
    import torch
    from arkinfer.quant.calib import device
    from arkinfer.quant.recipe import get_preset

    from arkinfer.latency.source import KNOWN_CONFIGS
    from arkinfer.pipeline import build_cost

    monkeypatch.setattr(device, "resolve_device", lambda _choice: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_a: "NVIDIA H100 80GB HBM3")
    cfg = KNOWN_CONFIGS["minicpm4.1-8b"]
    cost = build_cost.calibration_cost(cfg, get_preset("marlin"), "cuda", 128, 2048)
    p = cost["predicted"]
    assert p["device"] == "cuda:0 (NVIDIA H100 80GB HBM3)" and 300 < p["seconds"] < 900
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *_a: (80 * 10**9, 80 * 10**9))
    check_calibration_memory(cost, "cuda")  # fits
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *_a: (4 * 2**30, 80 * 10**9))
    with pytest.raises(CheckpointError, match=r"GPU memory.*4\.00 GiB free"):
        check_calibration_memory(cost, "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_a: "Tesla T4")
    cost = build_cost.calibration_cost(cfg, get_preset("marlin"), "cuda", 128, 2048)
    assert cost["predicted"] is None and "Tesla T4" in cost["why"]
