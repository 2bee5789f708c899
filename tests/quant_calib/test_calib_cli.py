"""`arkinfer quantize` through a Typer app built around the command (main.py registers it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from arkinfer.cli import quantize
from arkinfer.testing.synthetic import write_checkpoint
from arkinfer.models.configs import tiny_config

DEMO = Path(__file__).resolve().parents[2] / "arkinfer" / "demo"


@pytest.fixture(scope="module")
def app():
    app = typer.Typer(pretty_exceptions_enable=False)
    app.command(name="quantize", help=quantize.HELP)(quantize.command)

    @app.callback()
    def _root() -> None:
        pass

    return app


@pytest.fixture(scope="module")
def model_with_tokenizer(tmp_path_factory):
    extra = {n: (DEMO / n).read_text() for n in ("tokenizer.json", "tokenizer_config.json")}
    return write_checkpoint(tmp_path_factory.mktemp("tok"),
                            tiny_config("minicpm", vocab_size=2048, hidden_size=192,
                                        num_attention_heads=6, num_key_value_heads=2),
                            extra_files=extra)


def invoke(app, *args):
    result = CliRunner().invoke(app, ["quantize", *map(str, args)])
    return result.exit_code, result.stdout + (result.stderr if result.stderr_bytes else "")


def test_quantize_json(app, model_with_tokenizer, tmp_path):
    code, out = invoke(app, model_with_tokenizer, "--method", "pgptq", "--group-size", "64",
                       "--samples", "4", "--seq-len", "32", "-o", tmp_path / "q", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["recipe"] == "pgptq 4-bit g64 sym -> gptq"
    assert data["calibration"]["samples"] == 4 and len(data["calibration_sha256"]) == 64
    assert data["quantised_linears"] == 14 and data["bits_per_weight"] > 4
    assert (tmp_path / "q" / "tokenizer.json").is_file()
    assert not (tmp_path / "q.work").exists()


def test_quantize_table_lists_refused_layers_and_strict_fails(app, model_with_tokenizer, tmp_path):
    code, out = invoke(app, model_with_tokenizer, "--preset", "marlin", "--group-size", "64",
                       "--samples", "2", "--seq-len", "16", "-o", tmp_path / "m")
    assert code == 0, out
    assert "layers not quantised" in out and "in_features=192" in out
    assert "block SNR" in out
    code, out = invoke(app, model_with_tokenizer, "--preset", "marlin", "--group-size", "64",
                       "--samples", "2", "--seq-len", "16", "-o", tmp_path / "s", "--strict")
    assert code == 1 and "error:" in out and "in_features=192" in out
    code, out = invoke(app, model_with_tokenizer, "--method", "awq", "--act-order",
                       "-o", tmp_path / "x")
    assert code == 1 and "desc_act" in out


def test_build_recipe_defaults_and_overrides():
    r = quantize.build_recipe("awq", None, 64, None, False, None, None, False)
    assert (r.calib, r.format, r.bits, r.group_size, r.sym) == ("awq", "awq", 4, 64, False)
    r = quantize.build_recipe(None, None, None, None, False, None, "marlin", True)
    assert (r.calib, r.format, r.group_size, r.skip) == ("gptq", "marlin", 128, ())
    r = quantize.build_recipe("ternary", None, None, None, False, None, None, False)
    assert (r.format, r.bits, r.group_size) == ("gguf-tq2_0", 2, -1)


def test_act_order_with_static_groups_into_q4_0(app, model_with_tokenizer, tmp_path):
    """gguf-q4_0 has no g_idx: --act-order alone is refused, with --static-groups it runs (the
    groups stay k // 32) and the calibration config records act-order over static groups."""
    code, out = invoke(app, model_with_tokenizer, "--preset", "gptq-q4_0", "--act-order",
                       "--samples", "2", "--seq-len", "16", "-o", tmp_path / "x")
    assert code == 1 and "desc_act" in out
    code, out = invoke(app, model_with_tokenizer, "--preset", "gptq-q4_0", "--act-order",
                       "--static-groups", "--samples", "2", "--seq-len", "16",
                       "-o", tmp_path / "q", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["recipe"] == "gptq 4-bit g32 sym -> gguf-q4_0"
    assert data["calibration_config"]["act_order"] is True
    assert data["calibration_config"]["static_groups"] is True
    assert data["bits_per_weight"] == 4.5


def test_refit_changes_only_the_scales(app, model_with_tokenizer, tmp_path):
    """--refit: the codes are GPTQ's either way; only the refitted scales differ."""
    from arkinfer.quant.load import dequantized_state

    args = ["--method", "gptq", "--group-size", "32", "--format", "gguf-q4_0", "--samples", "4",
            "--seq-len", "32", "--no-kl"]
    assert invoke(app, model_with_tokenizer, *args, "-o", tmp_path / "a")[0] == 0
    code, out = invoke(app, model_with_tokenizer, *args, "--refit", "-o", tmp_path / "b")
    assert code == 0, out
    refit, plain = dequantized_state(tmp_path / "a"), dequantized_state(tmp_path / "b")
    name = "model.layers.0.mlp.down_proj.weight"
    assert not (refit[name] == plain[name]).all()
    code, out = invoke(app, model_with_tokenizer, "--method", "rtn", "--refit", "-o",
                       tmp_path / "c")
    assert code != 0 and "refit" in out and "rtn" in out, out


def test_asymmetric_gptq_from_the_cli(app, model_with_tokenizer, tmp_path):
    """--asymmetric: GPTQ aims at the float model's outputs (the summary's blocks say so); AWQ,
    which has no such target, refuses it with the option's name."""
    code, out = invoke(app, model_with_tokenizer, "--method", "gptq", "--group-size", "32",
                       "--samples", "4", "--seq-len", "32", "--no-kl", "--asymmetric",
                       "-o", tmp_path / "a", "--json")
    assert code == 0, out
    summary = json.loads((tmp_path / "a" / "quant_summary.json").read_text())
    assert "asymmetric" in summary["blocks"][0]["linears"][0]["recipe"]
    code, out = invoke(app, model_with_tokenizer, "--method", "awq", "--asymmetric",
                       "-o", tmp_path / "b")
    assert code != 0 and "asymmetric" in out and "awq" in out, out


def test_static_passes_from_the_cli(app, model_with_tokenizer, tmp_path):
    """--static-passes 2 (with --static-groups): the recipe line says so and the scales differ
    from one pass's; without --static-groups it is refused, naming both options."""
    from arkinfer.quant.load import dequantized_state

    args = ["--method", "gptq", "--group-size", "32", "--format", "gguf-q4_0", "--samples", "4",
            "--seq-len", "32", "--no-kl", "--act-order", "--static-groups"]
    assert invoke(app, model_with_tokenizer, *args, "-o", tmp_path / "a")[0] == 0
    code, out = invoke(app, model_with_tokenizer, *args, "--static-passes", "2",
                       "-o", tmp_path / "b")
    assert code == 0, out
    summary = json.loads((tmp_path / "b" / "quant_summary.json").read_text())
    assert "2-pass" in summary["blocks"][0]["linears"][0]["recipe"]
    one, two = dequantized_state(tmp_path / "a"), dequantized_state(tmp_path / "b")
    name = "model.layers.0.mlp.down_proj.weight"
    assert not (one[name] == two[name]).all()
    code, out = invoke(app, model_with_tokenizer, "--method", "gptq", "--static-passes", "2",
                       "-o", tmp_path / "c")
    assert code != 0 and "--static-passes" in out and "--static-groups" in out, out
