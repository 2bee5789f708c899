"""The shipped demo model: exact HF layout, Marlin-friendly dims, and peaked, meaningful outputs."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from arkinfer.frontend.checkpoint import load
from arkinfer.frontend.demo import demo_model_path
from arkinfer.generate import generate, model_logits_fn, perplexity

DATA = Path(__file__).resolve().parents[2] / "arkinfer" / "data"


def test_layout_and_dims():
    folder = demo_model_path()
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    ckpt, model = load("demo")
    cfg = ckpt.config
    assert cfg.model_type == "minicpm" and cfg.sparse_config and cfg.rope_scaling["rope_type"] == "longrope"
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head":
            assert module.in_features % 128 == 0 and module.out_features % 64 == 0, name
    assert {i.dtype for i in ckpt.weights.infos.values()} == {"BF16"}


def test_chat_answer_and_peaked_distributions():
    ckpt, model = load("demo")
    tok = ckpt.tokenizer
    ids = tok.encode_chat([{"role": "user", "content": "What is bread made from?"}])
    reply = tok.decode(list(generate(model, ids, 24, stop_ids=tok.stop_ids)), skip_special_tokens=True)
    assert reply.startswith("Most bread is made from flour, water, salt and yeast")
    text = (DATA / "corpus_train.txt").read_text(encoding="utf-8")
    result = perplexity(model_logits_fn(model), tok.encode(text, add_special_tokens=False)[:1024], 256)
    assert result.ppl < 6.0  # the text it learned: far from the 2048-way flat distribution
