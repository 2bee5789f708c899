"""Token generation and perplexity on a reference model (or any model with the same call shape).

A "model" here is anything with `forward(ids [B, T], positions [T], cache) -> (logits [B, T, V],
cache)` and `empty_cache(batch)`: the PyTorch reference models today, backend Runners later.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from arkinfer.errors import ArkError


def sample_next(logits: Tensor, temperature: float, top_p: float, gen: torch.Generator) -> int:
    """One token id from logits [V]: greedy when temperature <= 0, else nucleus sampling."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p  # always keeps the top one
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs / probs.sum(), 1, generator=gen))


@torch.no_grad()
def generate(model, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
             top_p: float = 1.0, seed: int = 0, stop_ids: set[int] | frozenset = frozenset()
             ) -> Iterator[int]:
    """Yield generated token ids one at a time (prefill once, then one decode step per token)."""
    if not prompt_ids:
        raise ArkError("the prompt is empty after tokenisation", hint="give a non-empty prompt")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    logits, cache = model(ids, torch.arange(len(prompt_ids)), model.empty_cache(1))
    pos = len(prompt_ids)
    for _ in range(max_new_tokens):
        token = sample_next(logits[0, -1], temperature, top_p, gen)
        yield token
        if token in stop_ids:
            return
        logits, cache = model(torch.tensor([[token]]), torch.tensor([pos]), cache)
        pos += 1


@dataclass(frozen=True)
class Perplexity:
    ppl: float
    tokens: int  # number of scored tokens
    windows: int
    ctx: int

    def as_dict(self) -> dict[str, float | int]:
        return {"ppl": self.ppl, "tokens": self.tokens, "windows": self.windows, "ctx": self.ctx}


def window_nll(logits: Tensor, window: Tensor) -> tuple[float, int]:
    """Sum of NLL of window[1:] given logits [T, V] of window[:-1] positions, and the count."""
    logp = torch.log_softmax(logits[:-1].double(), dim=-1)
    nll = -logp.gather(1, window[1:, None]).sum()
    return float(nll), int(window.shape[0] - 1)


def windows_of(ids: list[int], ctx: int) -> list[list[int]]:
    """Consecutive non-overlapping windows of `ctx` tokens; a trailing partial window is dropped
    (one shorter window when the whole text is under ctx), the same chunking as llama-perplexity."""
    if ctx < 2:
        raise ArkError(f"--ctx {ctx} is too small", hint="use a context of at least 2 tokens")
    if len(ids) < 2:
        raise ArkError(f"the text has only {len(ids)} token(s)", hint="give a longer text")
    if len(ids) < ctx:
        return [ids]
    return [ids[i:i + ctx] for i in range(0, len(ids) - ctx + 1, ctx)]


@torch.no_grad()
def perplexity(logits_fn: Callable[[list[int]], Tensor], ids: list[int], ctx: int,
               progress: Callable[[int, int], None] | None = None) -> Perplexity:
    """exp(mean NLL) with the ArkInfer protocol: each window evaluated from an empty cache, every
    token of a window scored except its first. `logits_fn(window) -> [T, V]`."""
    windows = windows_of(ids, ctx)
    total_nll, total = 0.0, 0
    for i, window in enumerate(windows):
        nll, count = window_nll(logits_fn(window), torch.tensor(window))
        total_nll, total = total_nll + nll, total + count
        if progress:
            progress(i + 1, len(windows))
    return Perplexity(math.exp(total_nll / total), total, len(windows), ctx)


def model_logits_fn(model) -> Callable[[list[int]], Tensor]:
    """Adapter: a reference model as `window -> logits [T, V]` (prefill from an empty cache)."""

    def run(window: list[int]) -> Tensor:
        logits, _ = model(torch.tensor([window]), torch.arange(len(window)), model.empty_cache(1))
        return logits[0]

    return run
