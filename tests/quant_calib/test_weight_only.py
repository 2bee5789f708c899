"""RTN / ternary without calibration (quant/calib/weight_only.py): the same codes as the streaming
calibration path, in a fraction of the time, and the SNR report only on request."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.quant.calib.stream import block_file, calibrate, load_weights
from arkinfer.quant.calib.weight_only import quantize_weight_only
from arkinfer.quant.calib_data import calibration_from_ids
from arkinfer.quant.recipe import get_preset


@pytest.mark.parametrize("preset", ["q4_0", "q8_0", "ternary"])
def test_weight_only_codes_equal_the_streaming_path(preset, tmp_path):
    recipe = get_preset(preset)
    ids = torch.randint(0, 2048, (2, 32), generator=torch.Generator().manual_seed(0))
    streamed = calibrate("demo", recipe, calibration_from_ids(ids), tmp_path / "s")
    direct = quantize_weight_only("demo", recipe, tmp_path / "w")
    assert direct.n_layers == streamed.n_layers
    for i in range(direct.n_layers):
        qa, fa, ia = load_weights(block_file(tmp_path / "s", i))
        qb, fb, ib = load_weights(block_file(tmp_path / "w", i))
        assert sorted(qa) == sorted(qb) and not fb
        for name in qa:
            for field in ("codes", "scales", "zeros"):
                assert torch.equal(getattr(qa[name], field), getattr(qb[name], field)), name
        assert [r["status"] for r in ia["linears"]] == [r["status"] for r in ib["linears"]]
    assert (direct.tail or {}).get("status") == (streamed.tail or {}).get("status")
    assert direct.calib["tokens"] == 0 and direct.calib["sha256"] is None


def test_build_rtn_needs_no_calibration_and_reports_snr_on_request(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["build", "demo", "--quant", "q4_0", "-o", str(tmp_path / "a"),
                              "--json"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)
    # host's gguf backend rounds RTN itself while lowering (Backend.quantizes_in_lower)
    assert m["quant"]["calibration_sha256"] is None and m["quant"]["calibration"] is None
    assert "ggml" in m["quant"]["quantised_by"]
    assert all(v.get("snr_db") is None for v in m["quant"]["layers"].values())
    res = runner.invoke(app, ["build", "demo", "--quant", "q4_0", "--report", "--samples", "2",
                              "--seq-len", "64", "-o", str(tmp_path / "b"), "--json"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)
    assert m["quant"]["calibration"]["tokens"] == 128
    assert all(v["snr_db"] > 5 for v in m["quant"]["layers"].values()
               if v["status"] == "quantised")
