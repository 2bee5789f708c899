"""The build summary shows the quantisation's own KL only where it is another number than verify's:
for a backend with its own runtime (gguf: llama.cpp) beside the verify line, recorded as
`verification.fidelity.quantisation`; never for the reference backend, whose runtime is the
reference model over the quantised weights (the same number twice).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.pipeline.verify import QUALITY_KEYS, THRESHOLDS, judge

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()


@pytest.mark.llamacpp
def test_gguf_build_shows_the_quantisation_alone(dense_demo, tmp_path):
    pytest.importorskip("llama_cpp")
    out = tmp_path / "gguf"
    res = runner.invoke(app, ["build", str(dense_demo), "--quant", "q4_0", "-o", str(out)],
                        env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "quantisation alone: KL vs float on the verify prompts" in res.output
    v = json.loads((out / "arkinfer.json").read_text())["verification"]
    q = v["fidelity"]["quantisation"]
    assert set(q) == set(QUALITY_KEYS)
    assert judge(q, THRESHOLDS["4bit"]) == []
    # llama.cpp reproduces the quantised reference (fidelity top-1 >= 0.95 on the demo), so the
    # quantisation is most of verify's KL, yet the two are measured apart
    assert 0 < q["mean_kl"] <= 1.5 * v["metrics"]["mean_kl"] + 0.01
    assert q["prompts"] == v["metrics"]["prompts"]
    assert f"{q['mean_kl']:.3f}" in res.output


def test_reference_build_does_not_repeat_verifys_kl(demo_artifact):
    m = json.loads((demo_artifact / "arkinfer.json").read_text())
    assert m["backend"]["name"] == "reference"
    assert "fidelity" not in m["verification"]  # so no `quantisation` line in the summary
