"""Fixtures for the IR tests: traced programs per architecture (traced once per session)."""

from __future__ import annotations

import pytest
from ir_helpers import ARCHS

from arkinfer import ir
from arkinfer.frontend.checkpoint import load_model, open_checkpoint


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one intra-op thread (tests/conftest.py)."""


@pytest.fixture(scope="session")
def traced(tiny_checkpoint):
    """traced(arch) -> (eager model, {stage: Program}) with stages traced, each pass, round trip."""
    made: dict[str, tuple] = {}

    def make(arch: str):
        if arch not in made:
            model_type, overrides = ARCHS[arch]
            folder = tiny_checkpoint(model_type, **overrides)
            model = load_model(open_checkpoint(folder, with_tokenizer=False))
            program = ir.trace(folder)  # weights read lazily from the checkpoint
            stages = {"traced": program}
            for name in ir.DEFAULT_PIPELINE:
                program = ir.run_passes(program, [name])
                stages[name] = program
            made[arch] = (model, stages)
        return made[arch]

    return make
