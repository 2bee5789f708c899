"""The EAGLE-3 draft: a trained head (eagle3_head.py) that drafts from the target's own hidden
states instead of from tokens alone.

The target runner records its taps (taps.py: the residual stream at the input of three of its
layers) for every cached position. The head reads pairs: pair t = (the target's taps at position
t, fused by the head's fc; the embedding of token t + 1), at position t, and predicts token t + 2.
For a proposal after `context` (the target's cache holds context[:-1], C = len(context) - 1
positions):

1. the head's own cache is cut back to the pairs it built from the target's taps (`done`), and
   pairs done..C-1 are run in one call (their taps now final: those positions were accepted);
2. the last pair's logits give draft token 1; then each further token runs one pair
   (the head's own output hidden state in place of taps, the token just drafted), at positions
   C, C + 1, ...: EAGLE-3's test-time loop, chain-shaped. These one-token steps run in C where
   it builds (eagle3_native.py), else through PyTorch.

Draft ids are mapped to the target's vocabulary through the head's d2t (a head with a reduced,
FR-Spec vocabulary proposes only tokens of that vocabulary; the target verifies on the full one,
so the output never changes). Sampling draws from the head's distribution over its vocabulary;
q is that distribution scattered onto the target's ids (zero elsewhere), as the rejection rule needs.
"""

from __future__ import annotations

import torch

from arkinfer.backend import Runner
from arkinfer.errors import ArkError, NotAvailableError
from arkinfer.speculative.draft import Proposal
from arkinfer.speculative.engine import check_target
from arkinfer.speculative.rejection import sampling_probs
from arkinfer.speculative.taps import check_tap_layers

#: new pairs a proposal runs as C steps one by one (more: one PyTorch call, e.g. the prompt)
NATIVE_PAIRS = 8
TAP_RUNTIMES = "reference, gguf (upstream llama.cpp), mlx, onnx (dense graphs)"


class Eagle3Draft:
    """Drafts with `head` from `target`'s taps. `reset()` (the engine calls it as a generation
    starts) turns the target's tap recording on and empties its cache; `finish()` (as it ends)
    turns it off, so plain decoding on the same runner pays nothing for the taps."""

    def __init__(self, head, target: Runner, name: str = "eagle3") -> None:
        if not (hasattr(target, "enable_taps") and hasattr(target, "disable_taps")):
            raise NotAvailableError(f"an EAGLE-3 head needs the target's hidden states, which "
                                    f"{type(target).__name__} does not expose; the runtimes that "
                                    f"do: {TAP_RUNTIMES}", hint="use --draft lookup on this runtime")
        # a runner may expose taps and still not verify (an onnx InfLLM v2 graph): refuse now,
        # not when the first generation starts
        check_target(target, 1)
        check_tap_layers(head.config.tap_layers, target.layer_count, type(target).__name__)
        self.head, self.target, self.name = head, target, name
        from arkinfer.speculative.eagle3_native import native_step

        self.step = native_step(head)  # the chain's one-token steps in C; None: PyTorch
        self.cache = head.new_cache()
        self.done = 0  # head-cache positions built from the target's taps

    def reset(self) -> None:
        self.target.enable_taps(self.head.config.tap_layers)
        self.cache = self.head.new_cache()
        self.done = 0

    def finish(self) -> None:
        self.target.disable_taps()

    @torch.no_grad()
    def propose(self, context: list[int], k: int, temperature: float, top_p: float,
                gen: torch.Generator) -> Proposal:
        cached = len(context) - 1
        taps = self.target.taps
        if taps.length != cached or not self.done < cached:
            raise ArkError(f"the EAGLE-3 draft is out of step: the target holds taps of "
                           f"{taps.length} positions for a context of {len(context)} tokens",
                           hint="reset the draft whenever the target is reset")
        head = self.head
        self.cache.truncate(self.done)  # drop the pairs the last proposal drafted on its own
        features = head.fuse(taps.rows(self.done, cached))
        embeds = head.embed(torch.tensor(context[self.done + 1:cached + 1]))
        if self.step is not None and cached - self.done <= NATIVE_PAIRS:
            for j in range(cached - self.done):  # a few new pairs: one C step each
                hidden, row, _ = self.step(embeds[j], features[j], self.done + j, self.cache)
        else:
            hidden, logits = head(embeds, features, torch.arange(self.done, cached), self.cache)
            hidden, row = hidden[-1:], logits[-1]
        self.done = cached
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(k):
            if temperature <= 0:
                draft_id = int(torch.argmax(row))
            else:
                probs = sampling_probs(row, temperature, top_p)
                draft_id = int(torch.multinomial(probs, 1, generator=gen))
                rows.append(self._on_target(probs))
            tokens.append(int(head.to_target(torch.tensor([draft_id]))[0]))
            if i + 1 < k:
                embed = head.embed(torch.tensor(tokens[-1:]))
                if self.step is not None:
                    hidden, row, _ = self.step(embed, hidden, cached + i, self.cache)
                else:
                    hidden, logits = head(embed, hidden, torch.tensor([cached + i]), self.cache)
                    row = logits[-1]
        return Proposal(tokens, torch.stack(rows) if rows else None)

    def _on_target(self, probs: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary probabilities [Vd] -> the target's vocabulary [V] (zero elsewhere)."""
        q = torch.zeros(self.head.config.vocab_size, dtype=torch.float32)
        q[self.head.to_target(torch.arange(probs.shape[0]))] = probs
        return q
