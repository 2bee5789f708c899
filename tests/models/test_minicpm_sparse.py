"""MiniCPM4 with sparse_config runs InfLLM v2: fast == reference through `arkinfer run`."""

from __future__ import annotations

import shutil

import pytest
import torch
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.frontend.checkpoint import load
from arkinfer.frontend.demo import demo_model_path

# Small enough that sparse attention selects a strict subset of blocks within ~100 tokens.
SPARSE = {"kernel_size": 8, "kernel_stride": 4, "block_size": 16, "init_blocks": 1,
          "window_size": 32, "topk": 2, "use_nope": False, "dense_len": 48}


@pytest.fixture(scope="module")
def sparse_demo(tmp_path_factory):
    import json

    folder = tmp_path_factory.mktemp("sparse") / "demo"
    shutil.copytree(demo_model_path(), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["sparse_config"] = SPARSE
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_sparse_differs_from_dense_beyond_the_budget(sparse_demo):
    _, sparse = load(sparse_demo)
    _, dense = load(sparse_demo, dense=True)
    ids = torch.randint(5, 2000, (1, 120), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, _ = sparse(ids, torch.arange(120), sparse.empty_cache(1))
        b, _ = dense(ids, torch.arange(120), dense.empty_cache(1))
    # budget = (topk + window/block) * block = (2 + 2) * 16 = 64 keys: positions < 64 see everything
    assert (a[0, :64] - b[0, :64]).abs().max() < 1e-4
    assert (a[0, 80:] - b[0, 80:]).abs().max() > 1e-3


def test_run_generates_the_same_tokens_with_fast_and_reference(sparse_demo):
    prompt = "Bread is one of the oldest foods that people make. At its simplest it needs only"
    outputs = []
    for impl in ("fast", "reference"):
        result = CliRunner().invoke(app, ["run", str(sparse_demo), "-p", prompt, "--raw",
                                          "-n", "40", "--infllmv2", impl])
        assert result.exit_code == 0, result.output
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1] and len(outputs[0].split()) > 10
