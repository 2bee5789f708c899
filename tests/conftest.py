"""Shared fixtures: tiny checkpoints of every architecture written on the fly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from arkinfer.testing.synthetic import write_checkpoint
from arkinfer.models.configs import tiny_config

torch.manual_seed(0)


@pytest.fixture(scope="session", autouse=True)
def onnx_host_cache(tmp_path_factory):
    """The ONNX host runner's rewritten graphs (backends/onnx/host_graph.py) go to a temporary
    folder, not the user's ~/.cache/arkinfer (subprocesses inherit it)."""
    before = os.environ.get("ARKINFER_ONNX_HOST_CACHE")
    os.environ["ARKINFER_ONNX_HOST_CACHE"] = str(tmp_path_factory.mktemp("onnx-host"))
    yield
    if before is None:
        os.environ.pop("ARKINFER_ONNX_HOST_CACHE", None)
    else:
        os.environ["ARKINFER_ONNX_HOST_CACHE"] = before


@pytest.fixture
def one_thread():
    """One intra-op thread for the test, restored after it: suites of many tiny ops on a shared
    2-core machine run up to 100x faster than with OpenMP workers spinning against other
    processes. Suites opt in with an autouse fixture or `pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Factory: tiny_checkpoint(model_type, **config_overrides) -> folder (cached per arguments)."""
    made: dict[str, Path] = {}

    def make(model_type: str = "llama", shard_bytes: int | None = None, **overrides) -> Path:
        key = repr((model_type, shard_bytes, sorted(overrides.items())))
        if key not in made:
            folder = tmp_path_factory.mktemp(f"tiny-{model_type}")
            made[key] = write_checkpoint(folder, tiny_config(model_type, **overrides),
                                         shard_bytes=shard_bytes)
        return made[key]

    return make


@pytest.fixture(scope="module")
def dense_demo(tmp_path_factory) -> Path:
    """A copy of the embedded demo model without its sparse_config (dense attention only: what
    llama.cpp runs, so the reference and an artifact compare like with like)."""
    import json
    import shutil

    from arkinfer.frontend.demo import demo_model_path

    folder = tmp_path_factory.mktemp("dense") / "dense-demo"
    shutil.copytree(demo_model_path(), folder,
                    ignore=shutil.ignore_patterns("__init__.py", "__pycache__"))
    config = json.loads((folder / "config.json").read_text())
    config.pop("sparse_config")
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
