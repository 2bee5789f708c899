"""extend / truncate against window_logits: the logits after a truncate and an extend equal the
logits of the same ids evaluated from an empty cache, on every runner that speculates (and a
runner that does not is refused by name)."""

from __future__ import annotations

import pytest
import torch
from spec_support import TEXT, built_demo

from arkinfer.backend import RunnerBase
from arkinfer.errors import ArkError, NotAvailableError
from arkinfer.pipeline.artifact import load_runner
from arkinfer.speculative import LookupDraft, speculative_generate

# float tolerance: one batched call and several shorter ones sum in other orders
ATOL = {"reference": 1e-4, "gguf": 1e-2, "onnx": 1e-3, "mlx": 1e-3}


def check_truncate_extend(runner, ids: list[int], atol: float) -> None:
    """prefill a, extend b (a draft), truncate back into b, extend the rest: rows == scratch.
    Every call stays on the same side of an InfLLM v2 dense_len as the whole window (a sparse
    model picks dense or sparse attention by the cache's total length)."""
    full = runner.window_logits(ids)
    a, b = len(ids) - 20, len(ids) - 14
    runner.reset()
    runner.prefill(ids[:a])
    rows = runner.extend(ids[a:b])
    assert rows.shape == (b - a, runner.vocab_size)
    torch.testing.assert_close(rows, full[a:b], atol=atol, rtol=0)
    runner.extend([7, 8, 9])           # a rejected draft
    runner.truncate(a + 2)
    rest = runner.extend(ids[a + 2:])
    torch.testing.assert_close(rest, full[a + 2:], atol=atol, rtol=0)
    runner.truncate(0)
    torch.testing.assert_close(runner.extend(ids[:4]), full[:4], atol=atol, rtol=0)
    with pytest.raises(ArkError, match="cannot truncate"):
        runner.truncate(5)


def test_reference_runner(reference_pair):
    runner, _ = reference_pair
    check_truncate_extend(runner, runner.tokenize(TEXT * 3), ATOL["reference"])


def test_reference_runner_past_dense_len(reference_pair):
    """InfLLM v2 past the demo's dense_len (1024): compressed keys are kept or recomputed."""
    runner, _ = reference_pair
    ids = (runner.tokenize(TEXT) * 200)[:1100]
    check_truncate_extend(runner, ids, ATOL["reference"])


def test_gguf_runner(gguf_pair):
    runner, _ = gguf_pair
    check_truncate_extend(runner, runner.tokenize(TEXT * 3), ATOL["gguf"])


def test_mlx_runner(tmp_path):
    runner = load_runner(built_demo("mlx", tmp_path / "mlx"))[1]
    check_truncate_extend(runner, runner.tokenize(TEXT * 3), ATOL["mlx"])


def test_onnx_runner(tmp_path, dense_demo):
    """The dense demo: an InfLLM v2 graph's compressed-key caches do not truncate (refused)."""
    runner = load_runner(built_demo("onnx", tmp_path / "onnx", source=str(dense_demo)))[1]
    assert runner.speculates
    check_truncate_extend(runner, runner.tokenize(TEXT * 3), ATOL["onnx"])


def test_gguf_timing_runner_extends_past_its_logits_buffer(demo_gguf, monkeypatch):
    """bench=True loads llama.cpp without all-position logits: extend reads the output buffer.
    Upstream llama.cpp in this process even where the InfLLM v2 build exists (its flash-attention
    path scores a 512-token ubatch and a 590 + 10 split up to 0.14 logits apart)."""
    monkeypatch.setenv("ARKINFER_LLAMACPP", "upstream")
    timing = load_runner(demo_gguf, bench=True)[1]
    exact = load_runner(demo_gguf)[1]
    ids = exact.tokenize(TEXT * 50)[:600]
    assert len(ids) == 600
    full = exact.window_logits(ids)
    timing.reset()
    timing.prefill(ids[:590])
    torch.testing.assert_close(timing.extend(ids[590:]), full[590:], atol=ATOL["gguf"], rtol=0)


class Plain(RunnerBase):
    vocab_size = 4


def test_a_runner_without_speculation_is_refused():
    with pytest.raises(NotAvailableError, match="Plain cannot extend"):
        Plain().extend([1])
    with pytest.raises(NotAvailableError, match="Plain cannot truncate"):
        Plain().truncate(0)
    with pytest.raises(NotAvailableError, match="cannot verify drafts"):
        next(speculative_generate(Plain(), LookupDraft(), [1, 2], 4))
