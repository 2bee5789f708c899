"""A demo-model artifact built once per session (host target, reference backend, q4_0)."""

from __future__ import annotations

import pytest

from arkinfer.pipeline.build import build
from arkinfer.pipeline.plan import CalibSettings, resolve_plan

SMALL_CALIB = CalibSettings(None, samples=8, seq_len=128)


@pytest.fixture(scope="session")
def demo_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist") / "demo.host.q4_0"
    plan = resolve_plan("demo", target="host", quant="q4_0", backend="reference", out=out,
                        calib=SMALL_CALIB)
    return build(plan).path
