"""Speculative decoding and InfLLM v2 together: the demo (MiniCPM4.1-shaped, sparse_config with
dense_len 1024) decoding past dense_len, where every verify step's queries attend sparsely, gives
plain decoding's greedy tokens on the runtimes that run InfLLM v2 and speculate (the reference
model and ArkInfer's MLX runtime); the demo's EAGLE-3 head drafts from sparse-attention taps."""

from __future__ import annotations

from spec_support import TEXT, built_demo

from arkinfer.frontend.demo import demo_model_path
from arkinfer.pipeline.artifact import load_runner
from arkinfer.pipeline.draft import parse_draft
from arkinfer.pipeline.reference_runner import ReferenceRunner
from arkinfer.speculative import SpecStats, plain_generate, speculative_generate

DENSE_LEN = 1024  # the demo's sparse_config.dense_len
NEW = 24


def long_prompt(runner) -> list[int]:
    """TEXT repeated past dense_len (+ 16 tokens): every call after the prefill is sparse."""
    return (runner.tokenize(TEXT) * 200)[:DENSE_LEN + 16]


def greedy_equal(target, spec: str, prompt: list[int]) -> SpecStats:
    plain = list(plain_generate(target, prompt, NEW))
    stats = SpecStats()
    fast = list(speculative_generate(target, parse_draft(spec, target), prompt, NEW, k=4,
                                     stats=stats))
    assert fast == plain
    return stats


def test_sparse_attention_is_what_runs():
    """Past dense_len the reference model's sparse logits differ from its dense ones (so the
    tests below exercise InfLLM v2, not a dense fallback)."""
    sparse = ReferenceRunner(demo_model_path())
    dense = ReferenceRunner(demo_model_path(), dense=True)
    ids = long_prompt(sparse)
    gap = (sparse.window_logits(ids)[-1] - dense.window_logits(ids)[-1]).abs().max()
    assert gap > 1e-3


def test_reference_lookup_and_eagle3_past_dense_len():
    target = ReferenceRunner(demo_model_path())
    prompt = long_prompt(target)
    assert greedy_equal(target, "lookup", prompt).accepted > 0  # the text repeats
    greedy_equal(target, "eagle3:demo", prompt)


def test_mlx_lookup_past_dense_len(tmp_path):
    target = load_runner(built_demo("mlx", tmp_path / "mlx"))[1]
    prompt = long_prompt(target)
    assert greedy_equal(target, "lookup", prompt).accepted > 0
