"""What a draft is: `Draft` proposes up to k next tokens for a context, as a `Proposal`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class Proposal:
    """Draft tokens for the positions after a context.

    tokens: up to k ids (may be empty: the step then decodes one token plainly).
    q: float32 [len(tokens), V], row i the draft's sampling distribution that tokens[i] was drawn
        from (temperature and top_p applied like `sample_next`); None for a deterministic draft
        (lookup, or any greedy draft): q is then one-hot at each token.
    """

    tokens: list[int]
    q: torch.Tensor | None = None


class Draft(Protocol):
    name: str

    def reset(self) -> None:
        """Forget every context seen (a new generation starts)."""

    def propose(self, context: list[int], k: int, temperature: float, top_p: float,
                gen: torch.Generator) -> Proposal:
        """At most `k` tokens to follow `context` (the prompt and every token emitted so far)."""

    # Optional: `finish()`, called when a generation ends (however it ends), undoes what
    # `reset()` changed on the target (the EAGLE-3 draft turns the target's taps off).
