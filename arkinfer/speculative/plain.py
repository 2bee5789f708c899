"""Plain generation over a Runner, the baseline speculative decoding is compared with token for
token under greedy decoding: `arkinfer.chat.generation.generate_tokens` (the loop `arkinfer run`
and `serve` use) with this package's argument conventions (a token budget of 0 allowed)."""

from __future__ import annotations

from collections.abc import Iterator

from arkinfer.backend import Runner
from arkinfer.chat.generation import GenerationSettings, generate_tokens
from arkinfer.errors import ArkError


def check_prompt(prompt_ids: list[int], max_new_tokens: int) -> None:
    """Raise ArkError for an empty prompt or a negative token budget."""
    if not prompt_ids:
        raise ArkError("the prompt is empty after tokenisation", hint="give a non-empty prompt")
    if max_new_tokens < 0:
        raise ArkError(f"max_new_tokens={max_new_tokens} is negative", hint="use 0 or more")


def plain_generate(runner: Runner, prompt_ids: list[int], max_new_tokens: int,
                   temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                   stop_ids: set[int] | frozenset = frozenset()) -> Iterator[int]:
    """Yield up to `max_new_tokens` ids from an empty cache; a stop id is yielded, then ends.
    NaN/inf logits raise NonFiniteError naming the runner."""
    check_prompt(prompt_ids, max_new_tokens)
    if max_new_tokens == 0:
        return iter(())
    settings = GenerationSettings(max_new_tokens, temperature, top_p, seed)
    return generate_tokens(runner, prompt_ids, settings, frozenset(stop_ids),
                           where=type(runner).__name__)
