"""`arkinfer inspect --ir` prints the graph IR from a folder holding only config.json."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.models.configs import tiny_config


@pytest.fixture()
def config_only(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_config("minicpm")))
    return str(tmp_path)


def test_inspect_ir_prints_both_entry_points(config_only):
    result = CliRunner().invoke(app, ["inspect", config_only, "--ir"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("# ArkInfer IR: minicpm, f32")
    assert "prefill(" in result.output and "decode(" in result.output
    assert "long_after=64 length=P+T" in result.output


def test_inspect_ir_with_passes_and_json(config_only):
    result = CliRunner().invoke(app, ["inspect", config_only, "--ir", "--ir-passes", "default"])
    assert result.exit_code == 0 and "qkv_proj" in result.output and "rope_table(" in result.output
    result = CliRunner().invoke(app, ["inspect", config_only, "--ir", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.output)["schema_version"] == 1


def test_inspect_ir_unknown_pass_is_a_clean_error(config_only):
    result = CliRunner().invoke(app, ["inspect", config_only, "--ir", "--ir-passes", "fuse_all"])
    assert result.exit_code == 1 and "unknown pass" in result.output
