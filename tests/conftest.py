"""Shared fixtures: tiny checkpoints of every architecture written on the fly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arkinfer.frontend.synthetic import write_checkpoint
from arkinfer.models.configs import tiny_config

torch.manual_seed(0)


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
