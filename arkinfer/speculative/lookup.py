"""Prompt lookup (n-gram) drafting: the last n tokens of the context occurred before, so propose
the tokens that followed them then. No model, no cache: it pays off where the output repeats the
input (editing, summarising, code), and costs one empty proposal elsewhere."""

from __future__ import annotations

import torch

from arkinfer.errors import ArkError
from arkinfer.speculative.draft import Proposal


class LookupDraft:
    """Match the context's last n tokens (n from `max_ngram` down to `min_ngram`) at their most
    recent earlier occurrence and propose the (up to k) tokens that followed it; deterministic
    (q one-hot). An empty proposal when no n-gram recurs."""

    name = "lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ArkError(f"lookup n-gram sizes {min_ngram}..{max_ngram} are not 1 <= min <= max",
                           hint="e.g. max_ngram=3, min_ngram=1")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def reset(self) -> None:
        """Nothing to forget: every proposal reads the context it is given."""

    def propose(self, context: list[int], k: int, temperature: float = 0.0, top_p: float = 1.0,
                gen: torch.Generator | None = None) -> Proposal:
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) <= n:
                continue
            tail = context[-n:]
            # the most recent earlier start first; start + n <= len - 1, so something follows
            for start in range(len(context) - n - 1, -1, -1):
                if context[start] == tail[0] and context[start:start + n] == tail:
                    return Proposal(list(context[start + n:start + n + k]))
        return Proposal([])
