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


def test_gguf_streams_without_an_import(tmp_path, monkeypatch):
    """A GGUF (the quantised reference of a gguf artifact) is read tensor by tensor: the same
    logits as the whole model over its import, and nothing is imported on the way."""
    from arkinfer.frontend import cache
    from arkinfer.pipeline.build import build
    from arkinfer.pipeline.plan import resolve_plan

    artifact = build(resolve_plan("demo", target="host", quant="q4_0", out=tmp_path / "a")).path
    gguf = next(artifact.glob("*.gguf"))
    prompts = _prompts([40, 9], 2048)
    want = [ReferenceRunner(gguf, dense=True).window_logits(p) for p in prompts]

    def no_import(path):
        raise AssertionError(f"{path} was imported")

    monkeypatch.setattr(cache, "cached_import", no_import)
    assert streamed_reference.fits_in_memory(gguf)
    for got, ref in zip(streamed_window_logits(gguf, prompts, dense=True), want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)


def test_build_verifies_the_same_when_streamed(tmp_path, monkeypatch):
    """A build whose float and quantised references do not fit in memory (forced here) records
    the same verify and fidelity figures as one that loads them whole."""
    from arkinfer.pipeline.build import build
    from arkinfer.pipeline.plan import resolve_plan

    whole = build(resolve_plan("demo", target="host", quant="q4_0", out=tmp_path / "a"))
    monkeypatch.setattr(streamed_reference, "fits_in_memory", lambda source, share=0.8: False)
    streamed = build(resolve_plan("demo", target="host", quant="q4_0", out=tmp_path / "b"))
    a, b = whole.manifest["verification"], streamed.manifest["verification"]
    for key in ("top1_agreement", "mean_kl", "ppl_reference", "ppl_artifact"):
        assert b["metrics"][key] == pytest.approx(a["metrics"][key], rel=1e-6, abs=1e-9), key
    for key in ("top1_agreement", "mean_kl"):
        assert b["fidelity"][key] == pytest.approx(a["fidelity"][key], rel=1e-6, abs=1e-9), key
        assert b["fidelity"]["quantisation"][key] == pytest.approx(
            a["fidelity"]["quantisation"][key], rel=1e-6, abs=1e-9), key
