"""The `numpy` backend's runtime: ArkInfer's reference model built from the artifact's
config.json, its weights read from weights.npz (`arkinfer.backend.StepRunner` supplies the rest
of the Runner contract)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from arkinfer import models
from arkinfer.backend import StepRunner
from arkinfer.frontend.tokenizer import load_tokenizer
from arkinfer.generate import forward_checked

from .backend import WEIGHTS


class NumpyRunner(StepRunner):
    def __init__(self, artifact_dir: Path) -> None:
        self.dir = artifact_dir
        raw = json.loads((artifact_dir / "config.json").read_text(encoding="utf-8"))
        self.model = models.build_model(models.parse_config(raw))
        with np.load(artifact_dir / WEIGHTS) as arrays:
            self.model.load_state_dict({k: torch.from_numpy(arrays[k]) for k in arrays.files})
        self.model.eval()
        self.tokenizer = load_tokenizer(artifact_dir)
        self.vocab_size = int(raw["vocab_size"])
        self.reset()

    def reset(self) -> None:
        self._cache, self._pos = self.model.empty_cache(1), 0

    @torch.no_grad()
    def _step(self, ids: list[int], last_only: bool) -> torch.Tensor:
        positions = torch.arange(self._pos, self._pos + len(ids))
        logits, self._cache = forward_checked(self.model, torch.tensor([ids]), positions,
                                              self._cache, f"the numpy artifact {self.dir}")
        self._pos += len(ids)
        return logits[0].float()
