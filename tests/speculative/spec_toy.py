"""A toy Runner for the statistical tests: a bigram model over a tiny vocabulary whose logits
depend on the last token only (a fixed table), with a cache that is just the list of ids."""

from __future__ import annotations

import torch

from arkinfer.backend import RunnerBase


class BigramRunner(RunnerBase):
    """logits of position i = table[ids[i]] (table float32 [V, V]); extend / truncate work."""

    speculates = True

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table
        self.vocab_size = int(table.shape[0])
        self.ids: list[int] = []

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) % self.vocab_size for c in text]

    def reset(self) -> None:
        self.ids = []

    def window_logits(self, ids: list[int]) -> torch.Tensor:
        self.reset()
        return self.extend(ids)

    def extend(self, ids: list[int]) -> torch.Tensor:
        self.ids += list(ids)
        return self.table[torch.tensor(ids)]

    def prefill(self, ids: list[int]) -> torch.Tensor:
        return self.extend(ids)[-1]

    def decode(self, token: int) -> torch.Tensor:
        return self.extend([token])[-1]

    def truncate(self, n: int) -> None:
        assert 0 <= n <= len(self.ids)
        del self.ids[n:]


def random_table(vocab: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    return torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)) * scale
