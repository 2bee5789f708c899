"""`arkinfer build --target host` on the imported SmolLM2-135M (real weights).

Heavy: each build calibrates 30 layers and verifies against the float model (minutes on 2 cores).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from arkinfer.cli.main import app

pytestmark = pytest.mark.heavy
runner = CliRunner()
CALIB = ["--samples", "16", "--seq-len", "256"]


@pytest.fixture(scope="module")
def smollm2():
    from arkinfer.testing.smollm2 import smollm2_hf_dir

    return str(smollm2_hf_dir())


@pytest.mark.parametrize("quant", ["q4_0", "gptq"])
def test_smollm2_host_build_passes_verify(smollm2, tmp_path, quant):
    out = tmp_path / quant
    res = runner.invoke(app, ["build", smollm2, "--quant", quant, *CALIB, "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)
    assert m["verification"]["passed"]
    res = runner.invoke(app, ["verify", str(out)])
    assert res.exit_code == 0, res.output


def test_smollm2_ternary_fails_the_gate_unless_loosened(smollm2, tmp_path):
    out = tmp_path / "ternary"
    res = runner.invoke(app, ["build", smollm2, "--quant", "ternary", *CALIB, "-o", str(out)])
    assert res.exit_code == 1 and "ppl_delta" in res.output
    assert not out.exists()
    res = runner.invoke(app, ["build", smollm2, "--quant", "ternary", *CALIB, "-o", str(out),
                              "--threshold", "ppl_delta=1e12", "--threshold", "kl=100",
                              "--threshold", "top1=0"])
    assert res.exit_code == 0, res.output
    assert out.exists()
