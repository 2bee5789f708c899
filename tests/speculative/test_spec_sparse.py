"""Speculative decoding and InfLLM v2 together: the demo (MiniCPM4.1-shaped, sparse_config with
dense_len 1024) decoding past dense_len, where every verify step's queries attend sparsely, gives
plain decoding's greedy tokens on the runtimes that run InfLLM v2 and speculate (the reference
model, ArkInfer's MLX runtime; the onnx runtime's InfLLM v2 graph is in test_spec_onnx.py); the
demo's EAGLE-3 head drafts from sparse-attention taps.

llama.cpp's InfLLM v2 build (`arkinfer doctor --build-llamacpp`) speculates too: it cuts its cache
back exactly, and past dense_len a position scored in a multi-token step has bit-for-bit the
logits of its one-token step. Its decode path once gathered the selected blocks in top-k (score)
order, so flash attention summed the same keys in another order than the batched path's masked
attention; the rounding differences then moved near-tied block choices in later layers (one
position of the demo came out 3 logits away). The tests below pin the equality."""

from __future__ import annotations

import pytest
import torch
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


@pytest.fixture(scope="module")
def infllmv2_gguf(tmp_path_factory):
    """The demo as a q4_0 gguf artifact, run by the InfLLM v2 build of llama.cpp."""
    from arkinfer.backends.gguf.llamacpp_runtime import infllmv2_built

    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("ARKINFER_LLAMACPP", raising=False)  # conftest.py pins upstream elsewhere
        if not infllmv2_built():
            pytest.skip("the InfLLM v2 build of llama.cpp is not built (arkinfer doctor "
                        "--build-llamacpp)")
        return load_runner(built_demo("gguf", tmp_path_factory.mktemp("gguf") / "gguf",
                                      quant="q4_0"))[1]


def test_infllmv2_llamacpp_speculates_past_dense_len(infllmv2_gguf, monkeypatch):
    """Greedy speculative decoding on llama.cpp's InfLLM v2 build, every verify step past
    dense_len, gives plain decoding's tokens: with prompt lookup (drafts rejected: the quantised
    demo does not repeat the text, so the cache is cut back after each), and with the artifact
    itself as its draft model (every draft token accepted: 4-token verify steps reproduce the
    draft's one-token steps exactly)."""
    target = infllmv2_gguf
    assert type(target).__name__ == "SubprocessLlamaCppRunner" and target.speculates
    prompt = long_prompt(target)
    lookup = greedy_equal(target, "lookup", prompt)
    assert lookup.drafted > 0
    monkeypatch.delenv("ARKINFER_LLAMACPP", raising=False)  # the draft on the InfLLM v2 build too
    itself = greedy_equal(target, str(target.path.parent), prompt)
    assert itself.accepted == itself.drafted > 0


def scored_both_ways(runner, ids: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [len(ids) - start, V] of positions start.. scored in one-token steps, and in
    extend steps of 4 tokens (as verify steps score them), each after a prefill of ids[:start]."""
    runner.reset()
    runner.prefill(ids[:start])
    single = torch.stack([runner.decode(t) for t in ids[start:]])
    runner.reset()
    runner.prefill(ids[:start])
    batched = torch.cat([runner.extend(ids[i:i + 4]) for i in range(start, len(ids), 4)])
    return single, batched


def test_infllmv2_llamacpp_batched_steps_equal_one_token_steps(infllmv2_gguf):
    """Over 96 positions past dense_len, every position scored in a 4-token extend step has
    exactly the logits of its one-token step (before the decode path gathered its blocks in
    ascending order, one of them came out 3 logits away); and they stay within quantised-kernel
    rounding of the reference model (the same quantised weights, dequantised), which also
    scores them the same both ways."""
    target = infllmv2_gguf
    ids = (target.tokenize(TEXT) * 200)[:DENSE_LEN + 160]
    start = DENSE_LEN + 64
    single, batched = scored_both_ways(target, ids, start)
    assert (single - batched).abs().max().item() == 0.0
    ref_single, ref_batched = scored_both_ways(ReferenceRunner(target.path), ids, start)
    assert (ref_single - ref_batched).abs().max() < 1e-3
    assert (single.argmax(-1) == ref_single.argmax(-1)).float().mean() >= 0.95


def test_infllmv2_llamacpp_truncate_is_exact(infllmv2_gguf):
    """A draft appended and cut back past dense_len leaves the cache (KV cells and the indexer
    rows of InfLLM v2's compressed keys) as it was: the next step's logits are bit-identical."""
    target = infllmv2_gguf
    ids = long_prompt(target)
    target.reset()
    target.prefill(ids[:-1])
    alone = target.decode(ids[-1])
    target.reset()
    target.prefill(ids[:-1])
    target.extend([5, 6, 7, 8, 9])
    target.truncate(len(ids) - 1)
    assert (target.decode(ids[-1]) - alone).abs().max().item() == 0.0
