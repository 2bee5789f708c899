"""`arkinfer bench --speculative` on the demo's gguf and reference artifacts: a `spec-tg<n>` row
with the speculative fields beside the usual rows, greedy output identical (fields are checked,
never speed); a runner that cannot speculate is refused before anything is timed; a draft that
changes the greedy tokens is an error naming the first differing position."""

from __future__ import annotations

import json

import pytest
import torch
from spec_support import built_demo
from spec_toy import BigramRunner, random_table
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.errors import ArkError
from arkinfer.pipeline import bench as pipeline_bench
from arkinfer.pipeline.bench import BenchSpec, run_speculative_bench
from arkinfer.pipeline.reference_runner import ReferenceRunner
from arkinfer.speculative import LookupDraft

cli = CliRunner()
FAST = ["-p", "0", "-n", "6", "-r", "1", "--warmup", "0", "--threads", "1"]


@pytest.fixture(scope="module")
def demo_reference(tmp_path_factory):
    return built_demo("reference", tmp_path_factory.mktemp("spec") / "demo-ref", quant="q4_0")


@pytest.fixture(params=["demo_gguf", "demo_reference"])
def artifact(request):
    return request.getfixturevalue(request.param)


def bench_json(*args: str) -> list[dict]:
    res = cli.invoke(app, ["bench", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout[res.stdout.index("["):])


def test_speculative_rows_beside_the_usual_ones(artifact):
    rows = bench_json(str(artifact), *FAST, "--speculative")
    assert [r["test"] for r in rows] == ["tg6", "spec-tg6"]
    usual, spec = rows
    assert not any(field in usual for field in pipeline_bench.SPEC_FIELDS)
    assert all(field in spec for field in pipeline_bench.SPEC_FIELDS)
    assert spec["greedy_identical"] is True
    assert (spec["draft"], spec["draft_k"]) == ("lookup", 4)
    assert spec["n_gen"] == 6 and spec["n_prompt"] == 0 and spec["n_depth"] > 20  # the prompt
    assert spec["avg_ts"] > 0 and spec["plain_ts"] > 0
    assert spec["speedup"] == pytest.approx(spec["avg_ts"] / spec["plain_ts"])
    assert spec["mean_accepted_length"] >= 1.0 and 0.0 <= spec["acceptance_rate"] <= 1.0
    assert spec["draft_s"] >= 0.0 and spec["verify_s"] > 0.0
    assert spec["predicted_ts"] is None  # the latency model predicts plain decoding only


def test_the_artifact_as_its_own_draft_accepts_every_token(demo_gguf):
    rows = bench_json(str(demo_gguf), *FAST, "--speculative", "--draft", str(demo_gguf),
                      "--draft-k", "3")
    spec = rows[-1]
    assert (spec["draft"], spec["draft_k"]) == (demo_gguf.name, 3)
    assert spec["acceptance_rate"] == 1.0 and spec["mean_accepted_length"] > 1.0


def test_csv_and_markdown_carry_the_speculative_fields(demo_gguf):
    res = cli.invoke(app, ["bench", str(demo_gguf), *FAST, "--speculative", "--format", "csv"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    header = lines[0].split(",")
    assert {"avg_ts", *pipeline_bench.SPEC_FIELDS} <= set(header)
    assert len(lines) == 3 and all(len(line.split(",")) >= len(header) for line in lines[1:])
    res = cli.invoke(app, ["bench", str(demo_gguf), *FAST, "--speculative"])
    assert res.exit_code == 0, res.output
    assert "| tg6 |" in res.stdout and "spec-tg6 @ d" in res.stdout
    assert "greedy identical" in res.stdout and "| yes |" in res.stdout


def test_a_runner_that_cannot_speculate_is_refused_before_timing(demo_reference, monkeypatch):
    def timed(*args, **kwargs):
        raise AssertionError("timed before the refusal")

    monkeypatch.setattr(ReferenceRunner, "speculates", False)
    monkeypatch.setattr(pipeline_bench, "run_bench", timed)
    res = cli.invoke(app, ["bench", str(demo_reference), *FAST, "--speculative"])
    assert res.exit_code == 1
    assert "cannot extend and truncate its KV cache" in res.output
    assert "bench without --speculative" in res.output


@pytest.mark.parametrize(("args", "message"), [
    (["--draft", "lookup"], "--draft and --draft-k choose the draft of --speculative"),
    (["--speculative", "-n", "0", "-p", "8"], "-n has no length above 0"),
    (["--speculative", "--rpc", "127.0.0.1:9090"], "--rpc times a remote device"),
])
def test_option_errors_before_loading(tmp_path, args, message):
    res = cli.invoke(app, ["bench", str(tmp_path / "not-built"), *args])
    assert res.exit_code == 1 and message in res.output, res.output


class DecodeDiffers(BigramRunner):
    """A runner whose single-token decode disagrees with its extend (a broken runtime): plain
    greedy decoding then leaves speculative decoding's path at the first decoded token."""

    def decode(self, token: int) -> torch.Tensor:
        return super().decode(token).roll(1)


def test_a_difference_from_plain_greedy_names_its_position():
    runner = DecodeDiffers(random_table(8, seed=0))
    manifest = {"name": "toy", "backend": {"name": "toy"},
                "source": {"architecture": "bigram", "n_params": 64},
                "memory": {"weights_bytes": 256}, "target": {"id": "host"},
                "quant": {"scheme": "f32"}}
    spec = BenchSpec(prompts=(0,), gens=(4,), repetitions=1, warmup=0)
    with pytest.raises(ArkError, match=r"differs from plain greedy decoding: at generated token "
                                       r"1 \(plain \d+, speculative \d+\)"):
        run_speculative_bench(runner, manifest, spec, LookupDraft(), 2, runner.tokenize("abcab"))
