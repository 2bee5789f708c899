"""The 8B fixture generator: byte counts against the real parameter counts, the disk refusal, the
cache stamp, and one reduced (~5 MB) fixture opened and run through the reference model."""

from __future__ import annotations

import json
import shutil
from collections import namedtuple

import numpy as np
import pytest
import torch

from arkinfer.disk_space import DiskSpaceError
from arkinfer.frontend.checkpoint import load_model, open_checkpoint
from arkinfer.testing import fixture_8b
from arkinfer.testing.fixture_8b import (
    FixtureError,
    ensure_fixture,
    fixture_bytes,
    fixture_path,
    write_fixture,
)

# Same width pattern as the 8B shapes (head_dim 128, so MiniCPM's 64 LongRoPE factors still fit),
# small enough for a ~5 MB folder.
SMALL = {"hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,
         "intermediate_size": 512, "vocab_size": 4096}


def params_8b(vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int) -> int:
    """Parameters of an untied Llama-family decoder, written out independently of the models."""
    head_dim = hidden // heads
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim  # q, o; k, v
    mlp = 3 * hidden * ffn  # gate, up, down
    norms = 2 * hidden
    return 2 * vocab * hidden + layers * (attention + mlp + norms) + hidden  # + final norm


def test_fixture_bytes_match_the_8b_parameter_counts():
    minicpm = params_8b(73448, 4096, 32, 32, 2, 16384)
    llama = params_8b(128256, 4096, 32, 32, 8, 14336)
    assert minicpm == 8_185_253_888  # MiniCPM4.1-8B, untied lm_head included
    assert llama == 8_030_261_248  # Meta-Llama-3.1-8B
    assert fixture_bytes("minicpm4.1-8b") == 2 * minicpm
    assert fixture_bytes("llama-3-8b") == 2 * llama
    one_layer = fixture_bytes("minicpm4.1-8b", layers=1)
    assert one_layer == 2 * params_8b(73448, 4096, 1, 32, 2, 16384)


def test_unknown_shape_is_refused():
    with pytest.raises(FixtureError, match="unknown fixture shape 'qwen3-8b'"):
        fixture_bytes("qwen3-8b")


def test_not_enough_disk_is_refused_before_writing(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 10**12 - 10**9, 10**9))
    folder = tmp_path / "fixture"
    with pytest.raises(DiskSpaceError) as info:
        write_fixture(folder, "minicpm4.1-8b")
    message = str(info.value)
    assert f"{fixture_bytes('minicpm4.1-8b') + fixture_8b.DISK_MARGIN:,} bytes" in message
    assert "1,000,000,000 bytes) free" in message and str(folder) in message
    assert "--layers" in message  # the next step
    assert not folder.exists()


def test_cli_reports_the_disk_refusal(tmp_path, monkeypatch, capsys):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 10**12, 0))
    assert fixture_8b.main(["--shape", "llama-3-8b", "--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    needed = fixture_bytes("llama-3-8b") + fixture_8b.DISK_MARGIN  # 16.06 GB of tensors
    assert captured.out == "" and f"about {needed / 1e9:.2f} GB" in captured.err
    assert f"into {tmp_path / 'llama-3-8b'}: about" in captured.err


@pytest.mark.parametrize("shape", ["minicpm4.1-8b", "llama-3-8b"])
def test_reduced_fixture_opens_and_runs(tmp_path, shape):
    seen = []
    folder = write_fixture(tmp_path / shape, shape, layers=2, shard_bytes=2**20,
                           progress=seen.append, config_overrides=SMALL)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == fixture_bytes(shape, 2, SMALL)
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) == len(set(index["weight_map"].values())) == seen[-1].shards_total > 2
    assert (seen[-1].tensors_done, seen[-1].shards_done) == (len(index["weight_map"]), len(shards))
    assert json.loads((folder / "fixture.json").read_text())["layers"] == 2

    ckpt = open_checkpoint(folder)
    assert ckpt.config.num_hidden_layers == 2 and ckpt.config.hidden_size == 256
    assert {info.dtype for info in ckpt.weights.infos.values()} == {"BF16"}
    if shape == "minicpm4.1-8b":
        assert ckpt.config.sparse_config is not None
    ids = torch.tensor([ckpt.tokenizer.encode("The quick brown fox jumps over the lazy dog.")])
    model = load_model(ckpt)
    with torch.no_grad():
        logits, _ = model(ids, torch.arange(ids.shape[1]), model.empty_cache())
    assert logits.shape == (1, ids.shape[1], 4096)
    assert torch.isfinite(logits).all() and logits.std() > 0.1


@pytest.mark.parametrize("shape", ["minicpm4.1-8b", "llama-3-8b"])
def test_the_planted_successor_is_a_clear_top_1(tmp_path, shape):
    """next_token_rows: at every position the top-1 logit is the successor s(t) of the current
    token, well clear of the rest (a trained model's peaked logits, not a random cloud)."""
    folder = write_fixture(tmp_path / shape, shape, layers=2, config_overrides=SMALL)
    ckpt = open_checkpoint(folder)
    ids = ckpt.tokenizer.encode("A fixture's logits should have one clear winner per position.")
    model = load_model(ckpt)
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]), torch.arange(len(ids)), model.empty_cache())
    successor = np.random.default_rng(0).permutation(SMALL["vocab_size"])
    top2 = logits[0].topk(2, dim=-1)
    assert top2.indices[:, 0].tolist() == [int(successor[t]) for t in ids]
    gap = (top2.values[:, 0] - top2.values[:, 1]).median().item()
    assert gap > 3.0, gap   # version 1 of the fixture: ~0.3


def test_ensure_fixture_writes_once_and_leaves_nothing_half_written(tmp_path, monkeypatch):
    assert fixture_path("llama-3-8b", 2, tmp_path) == tmp_path / "llama-3-8b-L2"
    monkeypatch.setenv("ARKINFER_FIXTURES", str(tmp_path / "env"))
    assert fixture_path("llama-3-8b") == tmp_path / "env" / "llama-3-8b"

    def killed(progress):
        if progress.tensors_done == 3:
            raise KeyboardInterrupt  # a run stopped half way
    with pytest.raises(KeyboardInterrupt):
        ensure_fixture("llama-3-8b", layers=2, root=tmp_path, progress=killed,
                       config_overrides=SMALL)
    assert list(tmp_path.iterdir()) == []  # no partial folder, no folder that looks complete
    dead = tmp_path / f".llama-3-8b-L2.partial-{2**30}"  # left by a SIGKILLed run
    dead.mkdir()

    folder = ensure_fixture("llama-3-8b", layers=2, root=tmp_path, config_overrides=SMALL)
    assert folder == tmp_path / "llama-3-8b-L2" and (folder / "fixture.json").exists()
    assert list(tmp_path.iterdir()) == [folder]  # the dead run's partial folder is gone
    writes = []
    monkeypatch.setattr(fixture_8b, "write_fixture", lambda *a, **k: writes.append(a))
    assert ensure_fixture("llama-3-8b", layers=2, root=tmp_path, config_overrides=SMALL) == folder
    assert writes == []  # the stamp matched: reused
