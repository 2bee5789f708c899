"""Not enough disk for an output: one error before any work, naming the bytes needed and free."""

from __future__ import annotations

from collections import namedtuple

import pytest
from arkinfer.quant.recipe import get_preset
from typer.testing import CliRunner

from arkinfer import disk_space
from arkinfer.disk_space import DiskSpaceError, check_free_disk
from arkinfer.frontend.demo import demo_model_path
from arkinfer.pipeline.disk_space import build_disk_bytes

Usage = namedtuple("Usage", "total used free")


def _free(monkeypatch, free: int) -> None:
    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda _p: Usage(10**12, 0, free))


def test_refusal_names_bytes_needed_and_free(tmp_path, monkeypatch):
    _free(monkeypatch, 1000)
    with pytest.raises(DiskSpaceError) as exc:
        check_free_disk(tmp_path / "not" / "yet" / "there", 5_000_000, "the artifact")
    assert "5,000,000 bytes" in exc.value.message and "1,000 bytes" in exc.value.message
    assert str(tmp_path) in exc.value.message and "-o" in exc.value.hint


def test_enough_space_passes(tmp_path, monkeypatch):
    _free(monkeypatch, 10**10)
    check_free_disk(tmp_path / "out", 5_000_000, "the artifact")


def test_estimate_covers_a_real_build(tmp_path):
    """The estimate is an upper bound: at least the demo artifact's bytes on disk."""
    import json

    from arkinfer.pipeline.build import build
    from arkinfer.pipeline.plan import resolve_plan

    plan = resolve_plan("demo", target="host", quant="q4_0", out=tmp_path / "a")
    built = build(plan).path
    size = sum(p.stat().st_size for p in built.rglob("*") if p.is_file())
    raw = json.loads((demo_model_path() / "config.json").read_text())
    assert build_disk_bytes(raw, get_preset("q4_0")) >= size


def test_marlin_8b_estimate_is_two_copies_of_its_weights():
    from arkinfer.latency.cost import ModelCost
    from arkinfer.latency.source import KNOWN_CONFIGS

    raw, recipe = KNOWN_CONFIGS["minicpm4.1-8b"], get_preset("marlin")
    weights = ModelCost.from_config(raw, recipe).weight_bytes
    tokens = 8 * 256
    assert build_disk_bytes(raw, recipe, tokens) == \
        2 * weights + tokens * 4096 * 4 + disk_space.MARGIN_BYTES
    assert 4e9 < weights < 6e9  # 4-bit linears, 16-bit embeddings


@pytest.mark.parametrize("command", [["build", "demo", "--quant", "gptq", "-o", "OUT"],
                                     ["quantize", "demo", "--preset", "gptq", "-o", "OUT"]])
def test_cli_refuses_before_writing(command, tmp_path, monkeypatch):
    from arkinfer.cli.main import app

    _free(monkeypatch, 1000)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [str(out) if a == "OUT" else a for a in command])
    assert result.exit_code != 0
    assert "bytes) free" in result.output and "1,000 bytes" in result.output
    assert list(tmp_path.iterdir()) == []
