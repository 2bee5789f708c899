"""Reference models vs transformers' own implementations, loaded from the same safetensors."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from arkinfer.frontend.checkpoint import load_model, open_checkpoint

transformers = pytest.importorskip("transformers", reason="transformers is a [dev] dependency")


def _hf_logits(folder, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with torch.no_grad():
        return model(ids).logits


def _our_logits(folder, ids):
    model = load_model(open_checkpoint(folder, with_tokenizer=False))
    with torch.no_grad():
        logits, _ = model(ids, torch.arange(ids.shape[1]), model.empty_cache(ids.shape[0]))
    return logits


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_llama_family_matches_transformers(tiny_checkpoint, model_type):
    folder = tiny_checkpoint(model_type)
    ids = torch.randint(0, 512, (2, 23), generator=torch.Generator().manual_seed(1))
    ours, theirs = _our_logits(folder, ids), _hf_logits(folder, ids)
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_llama3_rope_scaling_matches_transformers(tiny_checkpoint):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    folder = tiny_checkpoint("llama", rope_scaling=scaling, rope_theta=500000.0)
    ids = torch.randint(0, 512, (1, 40), generator=torch.Generator().manual_seed(2))
    assert (_our_logits(folder, ids) - _hf_logits(folder, ids)).abs().max().item() <= 1e-4


def _as_granite(minicpm_folder, out):
    """The same weights described as a transformers Granite model (same three scales)."""
    shutil.copytree(minicpm_folder, out)
    cfg = json.loads((out / "config.json").read_text())
    layers, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    head_dim = hidden // cfg["num_attention_heads"]
    cfg.update(model_type="granite", architectures=["GraniteForCausalLM"],
               embedding_multiplier=float(cfg.pop("scale_emb")),
               residual_multiplier=cfg.pop("scale_depth") / math.sqrt(layers),
               logits_scaling=hidden / cfg.pop("dim_model_base"),
               attention_multiplier=1.0 / math.sqrt(head_dim), attention_bias=False,
               mlp_bias=False)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_minicpm_dense_matches_granite(tiny_checkpoint, tmp_path):
    folder = tiny_checkpoint("minicpm", rope_scaling=None)
    granite = _as_granite(folder, tmp_path / "granite")
    ids = torch.randint(0, 512, (2, 31), generator=torch.Generator().manual_seed(3))
    ours, theirs = _our_logits(folder, ids), _hf_logits(granite, ids)
    assert (ours - theirs).abs().max().item() <= 1e-4


@pytest.mark.parametrize("length", [40, 90])  # below and above original_max_position_embeddings=64
def test_minicpm_longrope_matches_granite(tiny_checkpoint, tmp_path, length):
    folder = tiny_checkpoint("minicpm")
    granite = _as_granite(folder, tmp_path / "granite")
    ids = torch.randint(0, 512, (1, length), generator=torch.Generator().manual_seed(4))
    ours, theirs = _our_logits(folder, ids), _hf_logits(granite, ids)
    assert (ours - theirs).abs().max().item() <= 1e-4
