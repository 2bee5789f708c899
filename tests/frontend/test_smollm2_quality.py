"""The imported SmolLM2-135M reference model agrees with llama.cpp on the original GGUF."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the [gguf] extra) is not installed")

from arkinfer.backends.gguf.runner import LlamaCppRunner  # noqa: E402
from arkinfer.frontend.checkpoint import load  # noqa: E402
from arkinfer.testing.smollm2 import smollm2_gguf_path, smollm2_hf_dir  # noqa: E402
from arkinfer.generate import generate, model_logits_fn, perplexity  # noqa: E402

EVAL_TEXT = Path(__file__).resolve().parents[2] / "arkinfer" / "data" / "corpus_eval.txt"
pytestmark = pytest.mark.llamacpp


@pytest.fixture(scope="module")
def smollm2():
    return load(smollm2_hf_dir())


def test_perplexity_within_2_percent_of_llama_cpp(smollm2):
    """Two 512-token windows here; benchmarks/smollm2_reference_vs_llamacpp.py runs the whole text."""
    ckpt, model = smollm2
    text = EVAL_TEXT.read_text(encoding="utf-8")
    runner = LlamaCppRunner(smollm2_gguf_path(), n_ctx=512)
    ids = ckpt.tokenizer.encode(text, add_special_tokens=False)[:1024]
    assert ids == runner.tokenize(text, add_bos=False, special=False)[:1024]
    ours = perplexity(model_logits_fn(model), ids, 512)
    theirs = perplexity(runner.window_logits, ids, 512)
    assert ours.tokens == theirs.tokens == 2 * 511
    assert abs(ours.ppl - theirs.ppl) / theirs.ppl < 0.02


def test_chat_answers_a_simple_question(smollm2):
    ckpt, model = smollm2
    ids = ckpt.tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    reply = ckpt.tokenizer.decode(list(generate(model, ids, 16, stop_ids=ckpt.tokenizer.stop_ids)),
                                  skip_special_tokens=True)
    assert "Paris" in reply
