"""Fixtures of the speculative decoding tests: the demo model's reference runners and runners over
a demo gguf artifact built once per module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from spec_support import built_demo

from arkinfer.frontend.demo import demo_model_path
from arkinfer.pipeline.artifact import load_runner
from arkinfer.pipeline.reference_runner import ReferenceRunner


@pytest.fixture(scope="module", autouse=True)
def _upstream_llamacpp():
    """gguf artifacts in upstream llama.cpp (this process), even where the InfLLM v2 build exists:
    that build does not speculate (docs/speculative.md); the tests of it load it explicitly
    (`infllmv2_gguf` in test_spec_sparse.py). Module scope: set before each module's fixtures
    load runners, and undone after it, so tests outside this folder see the environment as is."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ARKINFER_LLAMACPP", "upstream")
        yield


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here on one intra-op thread (tests/conftest.py)."""


@pytest.fixture(scope="module")
def demo_gguf(tmp_path_factory) -> Path:
    return built_demo("gguf", tmp_path_factory.mktemp("spec") / "demo-gguf", quant="q4_0")


@pytest.fixture(scope="module")
def gguf_pair(demo_gguf):
    """(target, draft): two runners over the same demo gguf artifact, each on one llama.cpp
    thread (the backend takes torch's thread count; spinning threads on a shared machine make
    every decode step wait)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return load_runner(demo_gguf)[1], load_runner(demo_gguf)[1]
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def reference_pair():
    """(target, draft): two reference runners over the demo (InfLLM v2 past dense_len)."""
    return ReferenceRunner(demo_model_path()), ReferenceRunner(demo_model_path())
