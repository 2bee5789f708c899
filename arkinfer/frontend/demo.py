"""The embedded demo model: a tiny MiniCPM4.1-architecture checkpoint shipped in the package.

It was trained once by `examples/demo_model/train_demo_model.py` on the project's own English text
(`arkinfer/data/corpus_train.txt`) with a byte-level BPE tokenizer of 2048 tokens, so its
next-token distributions are peaked and meaningful (quantisation and parity metrics mean something
on it). Its dims satisfy every int4 format's shape rules (in_features % 128, out_features % 64).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from arkinfer.errors import CheckpointError


def demo_model_path() -> Path:
    """The folder of the demo checkpoint inside the installed package."""
    folder = Path(str(resources.files("arkinfer.demo")))
    if not (folder / "config.json").exists():
        raise CheckpointError(
            f"the demo model is missing from {folder}",
            hint="reinstall ArkInfer, or regenerate it: python examples/demo_model/train_demo_model.py")
    return folder


def demo_eagle3_path() -> Path:
    """The folder of the EAGLE-3 draft head trained for the demo model (shipped beside it)."""
    folder = demo_model_path() / "eagle3"
    if not (folder / "config.json").exists():
        raise CheckpointError(
            f"the demo's EAGLE-3 head is missing from {folder}",
            hint="reinstall ArkInfer, or train it: python examples/eagle3/train_eagle3_head.py")
    return folder
