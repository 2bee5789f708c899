"""`arkinfer bench` (llama-bench fields, plot) and `arkinfer eval` on an artifact."""

from __future__ import annotations

import json

import numpy as np
from arkinfer.quant.load import load_quantized
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.generate import model_logits_fn, perplexity
from arkinfer.pipeline.verify import EVAL_TEXT

runner = CliRunner()
LLAMA_BENCH = ("n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts", "samples_ts", "avg_ns",
               "stddev_ns", "samples_ns", "model_filename", "model_size", "n_threads", "cpu_info")


def test_bench_json_has_llama_bench_fields_and_plot_renders(demo_artifact, tmp_path):
    png = tmp_path / "bench.png"
    res = runner.invoke(app, ["bench", str(demo_artifact), "-p", "32", "-n", "4", "-d", "0,64",
                              "-r", "2", "--attention", "both", "--json", "--plot", str(png)])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout[res.stdout.index("["):])
    assert len(rows) == 2 * 2 * 2  # attention x depth x (pp, tg)
    for r in rows:
        assert all(k in r for k in LLAMA_BENCH)
        assert isinstance(r["cpu_features"], list)  # the SIMD flags the speed depends on
        assert len(r["samples_ts"]) == 2 and r["avg_ts"] > 0
        assert abs(r["avg_ts"] - np.mean(r["samples_ts"])) < 1e-6 * r["avg_ts"]
    pp = [r for r in rows if r["n_prompt"]]
    assert all(r["n_gen"] == 0 and r["ttft_ms"] > 0 for r in pp)
    assert {r["attention"] for r in rows} == {"dense", "sparse"}
    import matplotlib.image

    img = matplotlib.image.imread(png)
    assert img.shape[0] > 200 and img.shape[1] > 400 and img.std() > 0  # not blank


def test_bench_csv_and_markdown(demo_artifact):
    res = runner.invoke(app, ["bench", str(demo_artifact), "-p", "16", "-n", "2", "-r", "1",
                              "--warmup", "0", "--format", "csv"])
    assert res.exit_code == 0, res.output
    header = res.stdout.splitlines()[0].split(",")
    assert "avg_ts" in header and "n_depth" in header
    res = runner.invoke(app, ["bench", str(demo_artifact), "-p", "16", "-n", "2", "-r", "1"])
    assert res.exit_code == 0 and "| pp16 |" in res.stdout.replace("  ", " ")


def test_bench_rejects_bad_lists(demo_artifact):
    res = runner.invoke(app, ["bench", str(demo_artifact), "-p", "12,abc"])
    assert res.exit_code == 1 and "-p '12,abc'" in res.output


def test_eval_on_artifact_equals_the_quantised_reference(demo_artifact):
    res = runner.invoke(app, ["eval", str(demo_artifact), "--text", str(EVAL_TEXT), "--ctx",
                              "128", "--max-windows", "3", "--json"])
    assert res.exit_code == 0, res.output
    ppl = json.loads(res.stdout)["ppl"]
    model = load_quantized(demo_artifact / "model")
    from arkinfer.frontend.tokenizer import load_tokenizer

    ids = load_tokenizer(demo_artifact / "model").encode(EVAL_TEXT.read_text(),
                                                         add_special_tokens=False)[:3 * 128]
    assert abs(perplexity(model_logits_fn(model), ids, 128).ppl - ppl) < 1e-6 * ppl
