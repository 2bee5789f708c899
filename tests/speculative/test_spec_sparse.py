"""Speculative decoding and InfLLM v2 together: the demo (MiniCPM4.1-shaped, sparse_config with
dense_len 1024) decoding past dense_len, where every verify step's queries attend sparsely, gives
plain decoding's greedy tokens on the runtimes that run InfLLM v2 and speculate (the reference
model, ArkInfer's MLX runtime, and llama.cpp with ArkInfer's InfLLM v2 patch set when
`arkinfer doctor --build-llamacpp` has built it; the onnx runtime's InfLLM v2 graph is in
test_spec_onnx.py); the demo's EAGLE-3 head drafts from sparse-attention taps.

llama.cpp scores a verify step's positions in a batch and plain decoding's one token at a time,
with kernels that sum in another order (docs/speculative.md): on the demo past dense_len the two
scorings of one position differ by up to ~0.09 logits. Its greedy outputs are therefore equal or
part at a near tie (`near_tie`: plain's margin below that difference), as verify accepts them."""

from __future__ import annotations

import pytest
from spec_support import TEXT, built_demo

from arkinfer.frontend.demo import demo_model_path
from arkinfer.pipeline.artifact import load_runner
from arkinfer.pipeline.draft import parse_draft
from arkinfer.pipeline.reference_runner import ReferenceRunner
from arkinfer.pipeline.verify_speculative import first_difference, near_tie
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

    if not infllmv2_built():
        pytest.skip("the InfLLM v2 build of llama.cpp is not built (arkinfer doctor "
                    "--build-llamacpp)")
    return load_runner(built_demo("gguf", tmp_path_factory.mktemp("gguf") / "gguf",
                                  quant="q4_0"))[1]


@pytest.mark.parametrize("spec", ["lookup", "self:2", "eagle3:demo"])
def test_infllmv2_llamacpp_speculates_past_dense_len(infllmv2_gguf, spec):
    target = infllmv2_gguf
    assert type(target).__name__ == "SubprocessLlamaCppRunner" and target.speculates
    prompt = long_prompt(target)
    plain = list(plain_generate(target, prompt, NEW))
    fast = list(speculative_generate(target, parse_draft(spec, target), prompt, NEW, k=4))
    at = first_difference(plain, fast)
    assert at is None or near_tie(target, prompt, plain, fast, at), (spec, at)


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
