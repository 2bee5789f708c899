"""examples/demo_model/train_demo_model.py runs end to end and writes a loadable HF folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from arkinfer.frontend.checkpoint import load

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "demo_model" / "train_demo_model.py"


def test_two_training_steps_write_a_loadable_checkpoint(tmp_path):
    out = tmp_path / "demo"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--steps", "2", "--batch", "2",
                    "--seq", "64"], check=True, capture_output=True, text=True)
    names = sorted(p.name for p in out.iterdir())
    assert "model.safetensors.index.json" in names and "tokenizer.json" in names
    assert sum(n.endswith(".safetensors") for n in names) == 2
    ckpt, model = load(out)
    assert ckpt.config.sparse_config["dense_len"] == 1024
    ids = ckpt.tokenizer.encode("Bread is")
    logits, _ = model(torch.tensor([ids]), torch.arange(len(ids)), model.empty_cache(1))
    assert torch.isfinite(logits).all()
