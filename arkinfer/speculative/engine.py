"""Chain speculative decoding: each step the draft proposes up to k tokens, the target scores the
last accepted token and the draft in one `extend` (k + 1 positions), keeps the prefix the
acceptance rule accepts (rejection.py), adds its own next token and truncates its cache back
past a rejected token.

The target's cache holds every emitted token but the last: a step extends it by
[last] + draft, so row 0 of the verify logits is the distribution after `last`, row i that after
draft token i. Stop ids and max_new_tokens end the output exactly where plain decoding ends it:
accepted tokens are yielded one by one and the checks run after each.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from time import perf_counter

import torch

from arkinfer.backend import Runner
from arkinfer.errors import ArkError, NotAvailableError
from arkinfer.generate import check_sampling, require_finite, sample_next
from arkinfer.speculative.draft import Draft, Proposal
from arkinfer.speculative.plain import check_prompt
from arkinfer.speculative.rejection import sampling_probs, verify_greedy, verify_sampled
from arkinfer.speculative.stats import SpecStats
from arkinfer.torch_threads import one_torch_thread


def check_target(target: Runner, k: int) -> None:
    """Raise unless `target` speculates (extend + truncate) and k >= 1."""
    if not getattr(target, "speculates", False):
        raise NotAvailableError(f"{type(target).__name__} cannot extend and truncate its KV "
                                "cache, so it cannot verify drafts", hint="decode without a "
                                "draft, or use a runtime that speculates (docs/speculative.md)")
    if k < 1:
        raise ArkError(f"draft length k={k} is below 1", hint="use e.g. k=4")


@contextmanager
def torch_threads_beside(target: Runner) -> Iterator[None]:
    """torch on one thread while `target` decodes on threads of its own (onnxruntime,
    llama.cpp, MLX, TVM): the draft's torch work between two target steps (an EAGLE-3 head's
    fc, its tap rows) otherwise wakes torch's OpenMP pool, whose workers then spin on the cores
    the target's next step runs on (the demo's EAGLE-3 on onnx, 2 threads: 0.18x plain decoding
    before, 0.70x after; BENCHMARKS.md). The reference runner computes in torch
    (`computes_in_torch`) and keeps its threads."""
    if getattr(target, "computes_in_torch", False):
        yield
        return
    with one_torch_thread():
        yield


@torch.no_grad()
def speculative_generate(target: Runner, draft: Draft, prompt_ids: list[int],
                         max_new_tokens: int, *, k: int = 4, temperature: float = 0.0,
                         top_p: float = 1.0, seed: int = 0,
                         stop_ids: set[int] | frozenset = frozenset(),
                         stats: SpecStats | None = None) -> Iterator[int]:
    """Yield up to `max_new_tokens` ids, the same as `plain_generate` under greedy decoding and
    with its distribution under sampling; `stats` (when given) is filled in as it goes."""
    check_sampling(temperature, top_p)
    check_prompt(prompt_ids, max_new_tokens)
    check_target(target, k)
    stats = stats if stats is not None else SpecStats()
    gen = torch.Generator().manual_seed(seed)
    with torch_threads_beside(target):
        yield from _speculate(target, draft, prompt_ids, max_new_tokens, k, temperature, top_p,
                              stop_ids, stats, gen)


def _speculate(target: Runner, draft: Draft, prompt_ids: list[int], max_new_tokens: int, k: int,
               temperature: float, top_p: float, stop_ids, stats: SpecStats,
               gen: torch.Generator) -> Iterator[int]:
    """speculative_generate's loop (its arguments checked)."""
    try:
        target.reset()
        draft.reset()
        start = perf_counter()
        where = type(target).__name__
        logits = target.prefill(list(prompt_ids))
        require_finite(logits, where)
        stats.prefill_s += perf_counter() - start
        if max_new_tokens == 0:
            return
        token = sample_next(logits, temperature, top_p, gen)
        context = [*prompt_ids, token]
        stats.emitted = 1
        yield token
        if token in stop_ids or stats.emitted == max_new_tokens:
            return
        cached = len(prompt_ids)  # the target's cache: context[:-1]
        while True:
            # more than `left - 1` draft tokens could never be emitted (the target adds one)
            room = min(k, max_new_tokens - stats.emitted - 1)
            start = perf_counter()
            proposal = draft.propose(context, room, temperature, top_p, gen) if room else Proposal([])
            stats.draft_s += perf_counter() - start
            start = perf_counter()
            rows = target.extend([context[-1], *proposal.tokens])
            require_finite(rows, where)
            if temperature <= 0:
                accepted, nxt = verify_greedy(rows, proposal.tokens)
            else:
                accepted, nxt = verify_sampled(sampling_probs(rows, temperature, top_p),
                                               proposal.tokens, proposal.q, gen)
            if accepted < len(proposal.tokens):
                target.truncate(cached + 1 + accepted)
            cached += 1 + accepted
            stats.verify_s += perf_counter() - start
            stats.steps += 1
            stats.drafted += len(proposal.tokens)
            stats.accepted += accepted
            for token in [*proposal.tokens[:accepted], nxt]:
                context.append(token)
                stats.emitted += 1
                yield token
                if token in stop_ids or stats.emitted == max_new_tokens:
                    return
    finally:  # a draft that changed the target (EAGLE-3 taps) puts it back
        finish = getattr(draft, "finish", None)
        if finish is not None:
            finish()
