"""Broken checkpoints each give one clear error (library) and no traceback (CLI)."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.errors import CheckpointError, ConfigError
from arkinfer.frontend.checkpoint import load_model, open_checkpoint


@pytest.fixture
def broken(tiny_checkpoint, tmp_path):
    """A private copy of a tiny 2-shard llama checkpoint to break."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_checkpoint("llama", shard_bytes=400_000), folder)
    return folder


def _shard_with(folder, name):
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return folder / index["weight_map"][name]


def _rewrite(file, edit):
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file)


def _cli_error(folder) -> str:
    result = CliRunner().invoke(app, ["eval", str(folder), "--text", __file__])
    assert result.exit_code == 1, result.output
    assert "error:" in result.output and "Traceback" not in result.output
    return result.output


def test_missing_and_misshaped_tensors_listed_together(broken):
    import torch

    name_a, name_b = "model.layers.1.mlp.up_proj.weight", "model.layers.0.self_attn.k_proj.weight"
    _rewrite(_shard_with(broken, name_a), lambda t: t.pop(name_a))
    _rewrite(_shard_with(broken, name_b), lambda t: t.update({name_b: torch.zeros(3, 3)}))
    with pytest.raises(CheckpointError) as err:
        load_model(open_checkpoint(broken, with_tokenizer=False))
    msg = str(err.value)
    assert "missing (1): model.layers.1.mlp.up_proj.weight" in msg
    assert "wrong shape (1): model.layers.0.self_attn.k_proj.weight: checkpoint [3, 3]" in msg
    _cli_error(broken)


def test_unexpected_tensor(broken):
    import torch

    file = _shard_with(broken, "model.norm.weight")
    _rewrite(file, lambda t: t.update({"model.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match="unexpected \\(1\\): model.extra.weight"):
        load_model(open_checkpoint(broken, with_tokenizer=False))


def test_truncated_safetensors(broken):
    file = _shard_with(broken, "model.norm.weight")
    data = file.read_bytes()
    file.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match="truncated"):
        open_checkpoint(broken)
    assert "truncated" in _cli_error(broken)


def test_malformed_config(broken):
    (broken / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    with pytest.raises(ConfigError, match="not valid JSON"):
        open_checkpoint(broken)
    _cli_error(broken)


def test_config_with_bad_values_lists_all_problems(broken):
    cfg = json.loads((broken / "config.json").read_text())
    cfg.pop("vocab_size")
    cfg["num_attention_heads"] = "four"
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as err:
        open_checkpoint(broken)
    assert "missing key 'vocab_size'" in str(err.value)
    assert "'num_attention_heads' must be int" in str(err.value)


def test_unknown_model_type(broken):
    cfg = json.loads((broken / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="'gpt_neox' is not supported") as err:
        open_checkpoint(broken)
    assert "minicpm" in err.value.hint
    assert "gpt_neox" in _cli_error(broken)


def test_pickled_weights_are_refused(tmp_path, tiny_checkpoint):
    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(tiny_checkpoint("llama") / "config.json", folder)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(CheckpointError, match="never unpickles") as err:
        open_checkpoint(folder)
    assert "safe_serialization=True" in err.value.hint


def test_missing_shard_named(broken):
    _shard_with(broken, "model.norm.weight").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        open_checkpoint(broken)
