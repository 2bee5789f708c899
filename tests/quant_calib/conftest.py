"""Fixtures for the calibration tests: one intra-op thread (tiny tensors on a shared 2-core
machine run ~2x faster without OpenMP contention) and small calibration sets."""

from __future__ import annotations

import pytest
import torch
from arkinfer.quant.calib_data import calibration_from_ids


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one intra-op thread (tests/conftest.py)."""


@pytest.fixture(scope="session")
def calib_ids():
    """calib_ids(n, t, vocab=512, seed=0) -> CalibData of random token ids."""

    def make(n: int = 8, t: int = 32, vocab: int = 512, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        return calibration_from_ids(torch.randint(0, vocab, (n, t), generator=gen))

    return make
