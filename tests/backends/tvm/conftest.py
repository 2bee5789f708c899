"""Shared by the tvm tests: the demo built once per session for android by the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tvm_demo_artifact(tmp_path_factory) -> tuple[Path, dict]:
    """(folder, manifest) of `arkinfer build demo --target android --quant q4_0` (about a
    minute: trace, quantise, host + adreno + mali builds, verify)."""
    from typer.testing import CliRunner

    from arkinfer.cli.main import app

    out = tmp_path_factory.mktemp("tvm") / "demo.android.q4_0"
    res = CliRunner().invoke(app, ["build", "demo", "--target", "android", "--quant", "q4_0",
                                   "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    return out, json.loads((out / "arkinfer.json").read_text())
