"""Shared pieces of the speculative decoding tests: the demo built for one backend, and a prompt whose
greedy continuation repeats its own text (where prompt lookup gets tokens accepted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from arkinfer.backend import get_backend
from arkinfer.pipeline.build import build
from arkinfer.pipeline.plan import resolve_plan
from arkinfer.speculative import plain_generate

TEXT = "The cat sat on the mat, and the dog sat on the log. "


def built_demo(backend: str, out: Path, quant: str = "int4", source: str = "demo") -> Path:
    """`source` (the demo by default) built for this machine's host target with `backend`;
    skipped when the backend's toolchain is not installed."""
    if not get_backend(backend).available():
        pytest.skip(f"{backend}: toolchain not installed ({get_backend(backend).install_hint()})")
    return build(resolve_plan(source, target="host", quant=quant, backend=backend,
                              out=out)).path


def repetitive_prompt(runner, new: int = 24) -> list[int]:
    """TEXT, its greedy continuation G, then TEXT again: greedy decoding is then likely to
    repeat G, which prompt lookup proposes."""
    ids = runner.tokenize(TEXT)
    return ids + list(plain_generate(runner, ids, new)) + ids
