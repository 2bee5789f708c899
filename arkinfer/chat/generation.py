"""Generation over any `arkinfer.backend.Runner`: prefill the prompt, then one decode per token.

    settings = GenerationSettings(max_tokens=64, temperature=0.0)
    for token in generate_tokens(runner, prompt_ids, settings, stop_ids={2}):
        ...

The runner's KV cache is emptied first, so a call gives the same tokens whatever ran before it.
Sampling is `arkinfer.generate.sample_next` (greedy at temperature 0, else nucleus sampling with a
torch.Generator seeded with `seed`), the same as `arkinfer run MODEL` on the reference model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from arkinfer.errors import ArkError
from arkinfer.generate import check_sampling, require_finite, sample_next


@dataclass(frozen=True)
class GenerationSettings:
    """max_tokens: tokens to generate at most (>= 1); temperature >= 0 (0 = greedy); top_p in
    (0, 1]; seed: the sampling generator's seed (0..2^64-1)."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def check(self) -> None:
        """Raise ArkError for a value outside the ranges above."""
        if self.max_tokens < 1:
            raise ArkError(f"max_tokens {self.max_tokens} is below 1",
                           hint="ask for at least one token")
        check_sampling(self.temperature, self.top_p)


def generate_tokens(runner, prompt_ids: list[int], settings: GenerationSettings,
                    stop_ids: set[int] | frozenset[int] = frozenset(), where: str = "the runtime",
                    cancelled: Callable[[], bool] = lambda: False) -> Iterator[int]:
    """Yield generated token ids one at a time; a stop id is yielded, then generation ends.
    `cancelled()` is asked before each decode step (a client that went away). Logits [V] holding
    NaN/inf raise NonFiniteError naming `where`."""
    settings.check()
    if not prompt_ids:
        raise ArkError("the prompt is empty after tokenisation", hint="give a non-empty prompt")
    gen = torch.Generator().manual_seed(settings.seed)
    runner.reset()
    logits = runner.prefill(list(prompt_ids))
    for step in range(settings.max_tokens):
        require_finite(logits, where)
        token = sample_next(logits, settings.temperature, settings.top_p, gen)
        yield token
        if token in stop_ids or step + 1 == settings.max_tokens or cancelled():
            return
        logits = runner.decode(token)
