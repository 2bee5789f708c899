"""Helpers over the Runner protocol (arkinfer.backend.Runner) for tests and benchmarks."""

from __future__ import annotations


def greedy_tokens(runner, prompt: list[int], n: int) -> list[int]:
    """The `n` tokens `runner` generates greedily after `prompt`, from an empty cache."""
    runner.reset()
    logits, out = runner.prefill(prompt), []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = runner.decode(out[-1])
    return out
