"""Helpers shared by the IR tests (imported as `ir_helpers`; pytest puts tests/ir on sys.path)."""

from __future__ import annotations

import torch

from arkinfer import ir

# name -> (model_type, config overrides); minicpm's tiny config has LongRoPE with different long
# and short factors and original_max_position_embeddings 64, so prefill 64 + decode crosses it.
ARCHS = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "minicpm": ("minicpm", {}),
}
PROMPTS = (1, 7, 64)
DECODE_STEPS = 8


def check_parity(model, program, n: int, steps: int = DECODE_STEPS, seed: int = 0) -> float:
    """Prefill n tokens then `steps` decode steps on the eager model and on the IR; returns the
    worst max|a-b| / max|logits| over all calls and asserts it is <= 1e-5."""
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, n + steps), generator=torch.Generator().manual_seed(seed + n))
    worst = 0.0

    def compare(ref, got, what):
        nonlocal worst
        err = (ref - got).abs().max().item() / ref.abs().max().item()
        worst = max(worst, err)
        assert err <= 1e-5, f"{what}: max|eager - IR| = {err:.2e} x max|logits|"

    with torch.no_grad():
        ref, ref_cache = model(ids[:, :n], torch.arange(n), model.empty_cache(1))
    got, cache = ir.step(program, "prefill", ids[:, :n], torch.arange(n), ir.empty_cache(program))
    compare(ref, got, f"prefill of {n}")
    for i in range(n, n + steps):
        with torch.no_grad():
            ref, ref_cache = model(ids[:, i:i + 1], torch.arange(i, i + 1), ref_cache)
        got, cache = ir.step(program, "decode", ids[:, i:i + 1], torch.arange(i, i + 1), cache)
        compare(ref, got, f"decode step at position {i} after prefill of {n}")
    for (rk, rv), (k, v) in zip(ref_cache, cache):
        assert k.shape == rk.shape and (k - rk).abs().max() <= 1e-5 * rk.abs().max()
        assert (v - rv).abs().max() <= 1e-5 * rv.abs().max()
    return worst
