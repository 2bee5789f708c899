"""`plan --speculative`: the predicted speed-up against E = (1 - A^(k+1)) / (1 - A) and the step
times computed by hand from the byte counts (MiniCPM4.1-8B, marlin, on jetson-orin, where decode,
the verify step and the draft's decode are all bandwidth-bound)."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from arkinfer.cli import plan
from arkinfer.errors import ConfigError
from arkinfer.latency import ModelCost
from arkinfer.latency.source import KNOWN_CONFIGS
from arkinfer.latency.speculative import (
    draft_cost,
    expected_tokens,
    predict_speculative,
)
from arkinfer.targets import load_target

H, V, L, D, KV_HEADS = 4096, 73448, 32, 128, 2
CTX = 4096


@pytest.fixture(scope="module")
def marlin():
    return ModelCost.from_config(KNOWN_CONFIGS["minicpm4.1-8b"], quant="marlin")


@pytest.fixture(scope="module")
def orin():
    return load_target("jetson-orin")


def bandwidth(target) -> float:
    return target.bandwidth.value * target.eta_bw.value


def decode_bytes(cost: ModelCost, layers: int) -> float:
    """Bytes one decode step of the first `layers` layers reads at CTX: their linears (every
    layer has the same shapes), their two bf16 norms, the final norm, the bf16 lm_head, one bf16
    embedding row and their fp16 KV cache."""
    linears = cost.bytes_of("linear") * layers / L
    norms = (2 * layers + 1) * H * 2
    kv = 2 * layers * KV_HEADS * D * 2 * CTX
    return linears + norms + V * H * 2 + H * 2 + kv


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.6, 4) == pytest.approx(1 + 0.6 + 0.36 + 0.216 + 0.1296)
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)


def test_lookup_speedup_is_e_as_the_draft_reads_nothing(marlin, orin):
    p = predict_speculative(marlin, orin, "lookup", acceptance=0.7, k=5, ctx=CTX)
    t_target = decode_bytes(marlin, L) / bandwidth(orin)
    assert p.t_target == pytest.approx(t_target) and p.t_verify == pytest.approx(t_target)
    assert p.t_draft == 0.0
    e = (1 - 0.7 ** 6) / (1 - 0.7)
    assert p.expected_tokens == pytest.approx(e) and p.speedup == pytest.approx(e)


def test_self_draft_pays_n_of_l_layers_plus_the_lm_head(marlin, orin):
    p = predict_speculative(marlin, orin, "self:8", acceptance=0.6, k=4, ctx=CTX)
    t_target = decode_bytes(marlin, L) / bandwidth(orin)
    t_draft = decode_bytes(marlin, 8) / bandwidth(orin)
    assert p.t_draft == pytest.approx(t_draft)
    e = (1 - 0.6 ** 5) / (1 - 0.6)
    assert p.speedup == pytest.approx(e * t_target / (4 * t_draft + t_target))
    assert 0.9 < p.speedup < 1.0  # an untrained early exit at A = 0.6 does not pay here
    assert draft_cost(marlin, 8).layers == 8


def eagle3_bytes(ctx: int, vocab: int, k: int) -> float:
    """An EAGLE-3 head shaped after MiniCPM4.1-8B (32 / 2 heads of 128, FFN 16384), by hand:
    q/k/v read 2H, o_proj, the SwiGLU MLP, the LM head over `vocab`, the fc [H, 3H] once per
    chain of k, all bf16; its float32 KV cache of ctx positions."""
    weights = (2 * H * 36 * D + 32 * D * H + 3 * H * 16384 + vocab * H + 3 * H * H / k)
    return 2 * weights + 2 * KV_HEADS * D * ctx * 4


def test_eagle3_head_reads_one_layer_and_its_lm_head(marlin, orin):
    full = predict_speculative(marlin, orin, "eagle3", acceptance=0.6, k=4, ctx=CTX)
    assert full.t_draft == pytest.approx(eagle3_bytes(CTX, V, 4) / bandwidth(orin))
    frspec = predict_speculative(marlin, orin, "eagle3:32768", acceptance=0.6, k=4, ctx=CTX)
    assert frspec.t_draft == pytest.approx(eagle3_bytes(CTX, 32768, 4) / bandwidth(orin))
    # FR-Spec's cut of the LM head is most of what the draft step saves
    assert frspec.t_draft < 0.75 * full.t_draft and frspec.speedup > full.speedup


@pytest.mark.parametrize("kwargs, error", [
    ({"draft": "eagle3:0"}, ConfigError),
    ({"draft": "eagle3:80000"}, ConfigError),  # more than the vocabulary
    ({"draft": "lookup", "acceptance": 1.5}, ConfigError),
    ({"draft": "lookup", "k": 0}, ConfigError),
    ({"draft": "self:32"}, ConfigError),  # all 32 layers would be the target itself
    ({"draft": "self:x"}, ConfigError),
    ({"draft": "eagle"}, ConfigError),
])
def test_bad_inputs_are_refused(marlin, orin, kwargs, error):
    with pytest.raises(error):
        predict_speculative(marlin, orin, ctx=CTX, **kwargs)


@pytest.fixture(scope="module")
def app():
    app = typer.Typer(pretty_exceptions_enable=False)
    app.command(name="plan", help=plan.HELP)(plan.command)

    @app.callback()
    def _root() -> None:
        pass

    return app


def test_cli_speculative_json_and_table(app):
    args = ["plan", "minicpm4.1-8b", "-t", "jetson-orin", "-q", "int4", "--speculative",
            "--draft-k", "3", "--draft-layers", "4"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.stderr
    spec = json.loads(result.stdout)["speculative"]
    assert spec["ctx"] == CTX and spec["acceptance_assumed"] is True
    rows = {r["draft"]: r for r in spec["predictions"]}
    assert set(rows) == {"lookup", "self:4", "eagle3"}
    e = (1 - 0.6 ** 4) / (1 - 0.6)
    assert rows["lookup"]["k"] == 3 and rows["lookup"]["speedup"] == pytest.approx(e)
    assert rows["self:4"]["speedup"] < e

    result = CliRunner().invoke(app, [*args, "--acceptance", "0.9"])
    assert result.exit_code == 0, result.stderr
    assert "speculative decoding, predicted at 4K tokens" in result.stdout
    assert "self:4" in result.stdout and "0.9" in result.stdout and "eagle3" in result.stdout
    frspec = CliRunner().invoke(app, [*args, "--json", "--draft-vocab", "32768"])
    assert {r["draft"] for r in json.loads(frspec.stdout)["speculative"]["predictions"]} == {
        "lookup", "self:4", "eagle3", "eagle3:32768"}
    assert "acceptance) is assumed" not in result.stdout
    plain = CliRunner().invoke(app, ["plan", "minicpm4.1-8b", "-t", "jetson-orin", "-q", "int4",
                                     "--json"])
    assert "speculative" not in json.loads(plain.stdout)
