"""`arkinfer quantize` prints and records the quantised model's KL against the float model on the
verify prompts beside the SNR; the number equals an independent computation: both models run
with torch on the first six paragraphs of corpus_eval.txt (cut to 96 tokens), KL in float64.

The demo model without its sparse_config (dense attention, so the verify prompts are those six
paragraphs only) and RTN (no calibration): a few seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from arkinfer.cli.main import app

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
EVAL_TEXT = Path(__file__).resolve().parents[2] / "arkinfer" / "data" / "corpus_eval.txt"
RTN = ["--method", "rtn", "--bits", "4", "--group-size", "32", "--format", "gptq"]


@pytest.fixture(scope="module")
def quantised(dense_demo, tmp_path_factory):
    """(folder, console output) of `arkinfer quantize` with the KL measurement."""
    out = tmp_path_factory.mktemp("kl-out") / "q"
    res = runner.invoke(app, ["quantize", str(dense_demo), *RTN, "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out, res.output


@torch.no_grad()
def independent_metrics(source: Path, folder: Path) -> dict[str, float]:
    """KL(float || quantised), top-1 agreement and perplexity ratio on the six prompts, computed
    here: the tokenizer, the float loader and quant.load, nothing of pipeline/verify.py."""
    from arkinfer.frontend.checkpoint import load
    from arkinfer.quant.load import load_quantized

    ckpt, float_model = load(source)
    quant_model = load_quantized(folder)
    paragraphs = [p.strip() for p in EVAL_TEXT.read_text().split("\n\n") if p.strip()][:6]
    kl = agree = positions = nll_f = nll_q = 0.0
    for text in paragraphs:
        ids = ckpt.tokenizer.encode(text, add_special_tokens=False)[:96]
        x, pos = torch.tensor([ids]), torch.arange(len(ids))
        lf = torch.log_softmax(float_model(x, pos, float_model.empty_cache(1))[0][0].double(), -1)
        lq = torch.log_softmax(quant_model(x, pos, quant_model.empty_cache(1))[0][0].double(), -1)
        kl += float(torch.nn.functional.kl_div(lq, lf, log_target=True, reduction="sum"))
        agree += int((lf.argmax(-1) == lq.argmax(-1)).sum())
        positions += len(ids)
        target = torch.tensor(ids[1:])
        nll_f -= float(lf[:-1, :].gather(1, target[:, None]).sum())
        nll_q -= float(lq[:-1, :].gather(1, target[:, None]).sum())
    return {"mean_kl": kl / positions, "top1_agreement": agree / positions,
            "ppl_delta": float(torch.tensor((nll_q - nll_f) / (positions - len(paragraphs))).exp())
            - 1}


def test_kl_line_equals_an_independent_torch_computation(dense_demo, quantised):
    folder, output = quantised
    quality = json.loads((folder / "quant_summary.json").read_text())["quality"]
    expected = independent_metrics(dense_demo, folder)
    assert quality["prompts"] == 6
    for key, value in expected.items():
        assert quality[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    assert quality["mean_kl"] > 0  # 4-bit RTN changes the predictions
    line = (f"mean KL vs float on the verify prompts: {expected['mean_kl']:.3f} (top-1 agreement "
            f"{expected['top1_agreement']:.1%}, perplexity {expected['ppl_delta']:+.1%})"
            ).replace("%", " %")
    assert line in output, output
    assert "mean linear / block SNR" in output and " s KL" in output


def test_summary_keeps_its_keys_and_lists_its_files_unchanged(quantised):
    from arkinfer.quant.export import quantised_record

    folder, _ = quantised
    summary = json.loads((folder / "quant_summary.json").read_text())
    for key in ("mean_linear_snr_db", "mean_block_snr_db", "bits_per_weight", "blocks", "files"):
        assert key in summary
    record = quantised_record(folder)
    assert record is not None and record["quant_summary.json"] is None


def test_json_output_carries_quality_and_no_kl_skips_it(dense_demo, tmp_path):
    res = runner.invoke(app, ["quantize", str(dense_demo), *RTN, "-o", str(tmp_path / "a"),
                              "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["quality"]["mean_kl"] > 0
    res = runner.invoke(app, ["quantize", str(dense_demo), *RTN, "-o", str(tmp_path / "b"),
                              "--no-kl"])
    assert res.exit_code == 0, res.output
    assert "mean KL vs float on the verify prompts: not measured (--no-kl)" in res.output
    summary = json.loads((tmp_path / "b" / "quant_summary.json").read_text())
    assert summary["quality"] is None and "mean_linear_snr_db" in summary


def test_no_kl_has_help_with_an_example():
    res = runner.invoke(app, ["quantize", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    assert "--no-kl" in res.output
