"""The ONNX host runner's cached rewritten graph (backends/onnx/host_graph.py): the first load
writes one complete entry, later loads run from it without rewriting and give the same logits as a
runner that rewrites in memory; an edited artifact gets a new entry; a failed or impossible write
leaves nothing half-written and the runner still works from memory."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

ort = pytest.importorskip("onnxruntime", reason="pip install 'arkinfer[onnx]'")
onnx = pytest.importorskip("onnx")

from arkinfer.backend import LowerRequest, get_backend
from arkinfer.backends.onnx import host_graph
from arkinfer.backends.onnx.runner import OnnxRunner


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    from arkinfer.models.configs import tiny_config
    from arkinfer.testing.synthetic import write_checkpoint

    root = tmp_path_factory.mktemp("host-graph")
    src = write_checkpoint(root / "hf", tiny_config("llama", vocab_size=300))
    get_backend("onnx").lower(LowerRequest(model_dir=src, source_dir=src, recipe=None, dtype="f32",
                                           target=None, out_dir=root / "artifact"))
    return root / "artifact"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "entries"
    monkeypatch.setenv("ARKINFER_ONNX_HOST_CACHE", str(root))
    return root


IDS = torch.randint(3, 300, (12,), generator=torch.Generator().manual_seed(1)).tolist()


def _logits(runner: OnnxRunner) -> np.ndarray:
    runner.reset()
    first = runner.prefill(IDS[:8])
    return torch.stack([first, *(runner.decode(t) for t in IDS[8:])]).numpy()


def test_first_load_writes_an_entry_later_loads_read_it(artifact, cache, monkeypatch):
    first = OnnxRunner(artifact)
    entries = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1 and first.graph_file == entries[0] / "model.onnx"
    assert {p.name for p in entries[0].iterdir()} == {"model.onnx", "model.onnx.data",
                                                       host_graph.REWRITE_FILE}

    def no_rewrite(*_args, **_kwargs):
        raise AssertionError("a cached graph was rewritten again")

    monkeypatch.setattr(host_graph, "rewrite", no_rewrite)
    second = OnnxRunner(artifact)
    assert second.graph_file == first.graph_file
    assert (second.fused, second.packed_qkv, second.max_positions, second.notes) == \
        (first.fused, first.packed_qkv, first.max_positions, first.notes)
    assert second.fused and second.shared_kv is not None
    monkeypatch.undo()
    in_memory = OnnxRunner(artifact, cache=False)
    assert in_memory.graph_file is None
    np.testing.assert_array_equal(_logits(second), _logits(in_memory))


def test_settings_and_edits_get_entries_of_their_own(artifact, cache, tmp_path):
    OnnxRunner(artifact)
    OnnxRunner(artifact, ops="nbits")
    edited = tmp_path / "edited"
    shutil.copytree(artifact, edited)
    data = edited / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 1                         # one bit of the last weight
    data.write_bytes(bytes(raw))
    OnnxRunner(edited)
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 3


def test_environment_turns_the_cache_off(artifact, tmp_path, monkeypatch):
    monkeypatch.setenv("ARKINFER_ONNX_HOST_CACHE", "0")
    runner = OnnxRunner(artifact)
    assert runner.graph_file is None and runner.fused


def test_failed_write_leaves_no_entry_and_the_next_load_writes_it(artifact, cache, monkeypatch):
    def disk_full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(host_graph.onnx, "save_model", disk_full)
    runner = OnnxRunner(artifact)
    assert runner.graph_file is None
    assert any("not cached" in n and "No space left" in n for n in runner.notes)
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == []
    assert not any(p.is_dir() for p in cache.iterdir())      # no temporary folder left
    monkeypatch.undo()
    monkeypatch.setenv("ARKINFER_ONNX_HOST_CACHE", str(cache))
    again = OnnxRunner(artifact)
    assert again.graph_file is not None and again.graph_file.is_file()
    np.testing.assert_array_equal(_logits(again), _logits(runner))


def test_unwritable_cache_runs_from_memory(artifact, tmp_path, monkeypatch):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    monkeypatch.setenv("ARKINFER_ONNX_HOST_CACHE", str(blocked / "entries"))
    runner = OnnxRunner(artifact)
    assert runner.graph_file is None and runner.fused
    assert any("not cached" in n for n in runner.notes)


def test_an_entry_missing_a_file_is_written_again(artifact, cache):
    first = OnnxRunner(artifact)
    (first.graph_file.parent / "model.onnx.data").unlink()
    again = OnnxRunner(artifact)
    assert again.graph_file == first.graph_file and again.graph_file.with_suffix(".onnx.data").is_file()
    np.testing.assert_array_equal(_logits(again), _logits(OnnxRunner(artifact, cache=False)))
