"""The streamed float reference (one block in memory) gives the whole model's logits."""

from __future__ import annotations

import pytest
import torch

from arkinfer.frontend.demo import demo_model_path
from arkinfer.pipeline import streamed_reference
from arkinfer.pipeline.reference_runner import ReferenceRunner
from arkinfer.pipeline.streamed_reference import streamed_window_logits


def _prompts(n_tokens: list[int], vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (t,), generator=gen).tolist() for t in n_tokens]


@pytest.mark.parametrize("dense", [False, True])
def test_demo_equals_whole_model(dense):
    """The demo has InfLLM v2's sparse_config: the longer prompt runs past its dense_len."""
    import json

    config = json.loads((demo_model_path() / "config.json").read_text())
    dense_len = config["sparse_config"]["dense_len"]
    prompts = _prompts([37, dense_len + 70], 2048)
    whole = ReferenceRunner(demo_model_path(), dense=dense)
    streamed = streamed_window_logits(demo_model_path(), prompts, dense=dense)
    for ids, got in zip(prompts, streamed):
        want = whole.window_logits(ids)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_tied_llama_equals_whole_model(tiny_checkpoint):
    folder = tiny_checkpoint("llama", num_hidden_layers=3, tie_word_embeddings=True)
    prompts = _prompts([5, 19], 256)
    runner = ReferenceRunner(folder)
    for ids, got in zip(prompts, streamed_window_logits(folder, prompts)):
        torch.testing.assert_close(got, runner.window_logits(ids), rtol=1e-5, atol=1e-4)


def test_float_reference_streams_when_the_model_does_not_fit(monkeypatch):
    from arkinfer.pipeline.verify import float_reference

    whole = float_reference(demo_model_path())
    monkeypatch.setattr(streamed_reference, "fits_in_memory", lambda source, share=0.8: False)
    steps = []
    streamed = float_reference(demo_model_path(), step=steps.append)
    assert any("streamed block by block" in s for s in steps)
    assert streamed.prompts == whole.prompts and streamed.tokenizer is not None
    for ids in whole.prompts:
        torch.testing.assert_close(streamed.window_logits(ids), whole.window_logits(ids),
                                   rtol=1e-5, atol=1e-4)
