"""verify's speculative check: on a runner that speculates, greedy decoding with a prompt-lookup
draft must give exactly plain greedy decoding's tokens after each verify prompt
(docs/speculative.md); `bench --speculative` reports mismatches with the same wording."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# verify's speculative check: a short budget per prompt keeps verify fast, and 16 tokens are
# several verify steps of k = 4 (a rollback after a rejected draft included, where one happens).
SPEC_TOKENS = 16
SPEC_K = 4


def greedy_mismatch(plain: list[int], speculative: list[int]) -> str | None:
    """None when the two token lists are equal, else where they first differ: "at generated token
    i (plain 12, speculative 40)" ("end" for a list that stops there)."""
    if plain == speculative:
        return None
    at = next((i for i, (a, b) in enumerate(zip(plain, speculative)) if a != b),
              min(len(plain), len(speculative)))

    def token(ids: list[int]) -> str:
        return str(ids[at]) if at < len(ids) else "end"

    return f"at generated token {at} (plain {token(plain)}, speculative {token(speculative)})"


def speculative_check(runner, prompts: list[list[int]],
                      step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Greedy speculative decoding with a prompt-lookup draft (k = SPEC_K) against plain greedy
    decoding, SPEC_TOKENS tokens after each prompt that fits the runner's cache. Returns
    {"checked": True, "draft": "lookup", "k", "identical", "prompts", "tokens",
    "mean_accepted_length", "acceptance_rate"} (+ "failure" naming the prompt and the first
    differing token when not identical), or {"checked": False, "reason"} for a runner that does
    not speculate or a cache too small for any prompt."""
    from arkinfer.backend import runner_context
    from arkinfer.speculative import (
        LookupDraft,
        SpecStats,
        plain_generate,
        speculative_generate,
    )

    if not runner.speculates:
        return {"checked": False, "reason": f"{type(runner).__name__} cannot extend and truncate "
                "its KV cache, so this runtime does not speculate (docs/speculative.md)"}
    context = runner_context(runner, None)
    fits = [p for p in prompts if context is None or len(p) + SPEC_TOKENS <= context]
    if not fits:
        return {"checked": False, "reason": f"no verify prompt plus {SPEC_TOKENS} tokens fits "
                f"the runner's cache of {context} tokens"}
    draft, total, tokens = LookupDraft(), SpecStats(), 0
    out = {"checked": True, "draft": draft.name, "k": SPEC_K, "identical": True,
           "prompts": len(fits)}
    for i, ids in enumerate(fits):
        if step is not None:
            step(f"speculative check, prompt {i + 1}/{len(fits)}")
        plain = list(plain_generate(runner, ids, SPEC_TOKENS))
        stats = SpecStats()
        fast = list(speculative_generate(runner, draft, ids, SPEC_TOKENS, k=SPEC_K, stats=stats))
        mismatch = greedy_mismatch(plain, fast)
        if mismatch:
            out.update(identical=False, failure=(
                f"greedy speculative decoding ({draft.name}, k={SPEC_K}) differs from plain "
                f"greedy decoding on prompt {i + 1} of {len(fits)} {mismatch}"))
            break
        tokens += len(plain)
        total.steps += stats.steps
        total.drafted += stats.drafted
        total.accepted += stats.accepted
    out.update(tokens=tokens, mean_accepted_length=total.mean_accepted_length,
               acceptance_rate=total.acceptance_rate)
    return out
