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
    at = first_difference(plain, speculative)
    if at is None:
        return None

    def token(ids: list[int]) -> str:
        return str(ids[at]) if at < len(ids) else "end"

    return f"at generated token {at} (plain {token(plain)}, speculative {token(speculative)})"


#: The most two scorings of one position may differ by, as a fraction of its logits' range, and
#: still count as the same computation in another kernel: llama.cpp's CPU kernels for a batch of
#: ~100 tokens and for one token differ by 0.4-1.0 logits on SmolLM2-135M Q4_0 (1.5-3 % of a
#: range of ~35), none on the demo; a broken cache differs by the whole range.
KERNEL_NOISE = 0.1


def first_difference(plain: list[int], speculative: list[int]) -> int | None:
    """Index of the first generated token where the lists differ (None when equal)."""
    if plain == speculative:
        return None
    return next((i for i, (a, b) in enumerate(zip(plain, speculative)) if a != b),
                min(len(plain), len(speculative)))


def near_tie(runner, prompt: list[int], plain: list[int], speculative: list[int],
             at: int) -> dict[str, Any] | None:
    """Whether greedy speculative decoding's first different token `at` is a near tie that the
    runtime's kernels decide differently, not a bug. Plain decoding scored position `at` with
    single-token decode steps, a verify step scores it inside a multi-token batch; runtimes whose
    batched kernels sum in another order (llama.cpp's CPU matmuls) give logits that differ in the
    last bits. The position is re-scored both ways: it is a near tie when plain's margin of its
    token over the speculative one is no larger than the largest difference between the two
    scorings' logits there, and that difference is small (KERNEL_NOISE of the logits' range). Returns {"at", "logit_gap", "kernel_difference"} for a near tie,
    None otherwise (a real difference: a bug in extend/truncate or in the acceptance rule)."""
    if at >= min(len(plain), len(speculative)):
        return None  # one list stopped early: not a tie between two tokens
    runner.reset()
    single = runner.prefill(list(prompt))
    for token in plain[:at]:
        single = runner.decode(token)
    runner.reset()
    context = list(prompt) + plain[:at]
    if len(context) > 1:
        runner.prefill(context[:-1])
    # scored as a verify step scores it: in a batch of more than one token (any prompt length)
    batched = runner.extend([context[-1], plain[at]])[0]
    gap = float(single[plain[at]] - single[speculative[at]])
    noise = float((single - batched).abs().max())
    spread = float(single.max() - single.min())
    if gap <= noise <= KERNEL_NOISE * spread:
        return {"at": at, "logit_gap": gap, "kernel_difference": noise}
    return None


def speculative_check(runner, prompts: list[list[int]],
                      step: Callable[[str], None] | None = None,
                      draft_of: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Greedy speculative decoding with a prompt-lookup draft (or `draft_of(runner)`: the
    artifact's own draft, made once the runner is known to speculate; k = SPEC_K) against plain greedy
    decoding, SPEC_TOKENS tokens after each prompt that fits the runner's cache. Returns
    {"checked": True, "draft": its name, "k", "identical", "prompts", "tokens",
    "mean_accepted_length", "acceptance_rate"} (+ "failure" naming the prompt and the first
    differing token when not identical and not a near tie; + "near_ties": [{"prompt", "at",
    "logit_gap", "kernel_difference"}] for differences `near_tie` explains), or {"checked": False, "reason"} for a runner that does
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
    draft = draft_of(runner) if draft_of is not None else LookupDraft()
    total, tokens = SpecStats(), 0
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
            out["identical"] = False
            tie = near_tie(runner, ids, plain, fast, first_difference(plain, fast))
            if tie is None:
                out["failure"] = (f"greedy speculative decoding ({draft.name}, k={SPEC_K}) "
                                  f"differs from plain greedy decoding on prompt {i + 1} of "
                                  f"{len(fits)} {mismatch}")
                break
            out.setdefault("near_ties", []).append({"prompt": i + 1, **tie})
        tokens += len(plain)
        total.steps += stats.steps
        total.drafted += stats.drafted
        total.accepted += stats.accepted
    out.update(tokens=tokens, mean_accepted_length=total.mean_accepted_length,
               acceptance_rate=total.acceptance_rate)
    return out
