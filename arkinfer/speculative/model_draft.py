"""A draft model: a second Runner with the target's tokenizer (a smaller artifact, or the same one
as a sanity check) that decodes k tokens ahead. Its KV cache follows the accepted tokens: each
proposal truncates it to the longest prefix it shares with the new context and appends the rest."""

from __future__ import annotations

import torch

from arkinfer.backend import Runner
from arkinfer.errors import ArkError, NotAvailableError
from arkinfer.generate import sample_next
from arkinfer.speculative.draft import Proposal
from arkinfer.speculative.rejection import sampling_probs

PROBE = "The quick brown fox, 12 jumps; over the lazy dog.\n"  # tokenizer identity check


def check_same_tokenizer(draft: Runner, target: Runner, name: str) -> None:
    """Raise ArkError unless `draft` has the target's vocabulary size and tokenizes PROBE the
    same way (a draft whose ids mean other strings would never be accepted)."""
    if draft.vocab_size != target.vocab_size:
        raise ArkError(f"draft {name} has a vocabulary of {draft.vocab_size} tokens, the target "
                       f"{target.vocab_size}", hint="use a draft built from a model with the "
                       "target's tokenizer")
    ours, theirs = draft.tokenize(PROBE), target.tokenize(PROBE)
    if ours != theirs:
        raise ArkError(f"draft {name} tokenizes {PROBE!r} as {ours[:8]}..., the target as "
                       f"{theirs[:8]}...", hint="use a draft built from a model with the "
                       "target's tokenizer")


class ModelDraft:
    """Drafts with `runner` (which must speculate: it needs `truncate`). Greedy (temperature 0)
    proposes argmaxes, q one-hot; sampling draws each token from its q (`sampling_probs`)."""

    def __init__(self, runner: Runner, target: Runner | None = None, name: str = "model") -> None:
        if not getattr(runner, "speculates", False):
            raise NotAvailableError(f"draft {name} runs on {type(runner).__name__}, which cannot "
                                    "truncate its KV cache", hint="use a draft artifact of a "
                                    "runtime that speculates (docs/speculative.md), or lookup")
        if target is not None:
            check_same_tokenizer(runner, target, name)
        self.runner, self.name = runner, name
        self.cached: list[int] = []  # the ids in the runner's cache, in order

    def reset(self) -> None:
        self.runner.reset()
        self.cached = []

    def propose(self, context: list[int], k: int, temperature: float, top_p: float,
                gen: torch.Generator) -> Proposal:
        keep = 0
        while keep < min(len(self.cached), len(context) - 1) and \
                self.cached[keep] == context[keep]:
            keep += 1
        # the last context token is always fed again: its logits give the first draft token
        if keep < len(self.cached):
            self.runner.truncate(keep)
        logits = self.runner.prefill(context[keep:])
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(k):
            if temperature <= 0:
                token = sample_next(logits, 0.0, 1.0, gen)
            else:
                rows.append(sampling_probs(logits, temperature, top_p))
                token = int(torch.multinomial(rows[-1], 1, generator=gen))
            tokens.append(token)
            if i + 1 < k:
                logits = self.runner.decode(token)
        self.cached = list(context) + tokens[:-1]
        return Proposal(tokens, torch.stack(rows) if rows else None)
