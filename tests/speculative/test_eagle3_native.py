"""The EAGLE-3 head's one-token step in C against `Eagle3Head.forward` (PyTorch): the same
hidden state, logits and argmax step after step, PyTorch and C steps sharing one cache."""

from __future__ import annotations

import pytest
import torch

from arkinfer.frontend.demo import demo_eagle3_path
from arkinfer.speculative.eagle3_head import load_eagle3
from arkinfer.speculative.eagle3_native import native_step


@pytest.fixture(scope="module")
def head():
    return load_eagle3(demo_eagle3_path())


@pytest.fixture(scope="module")
def step(head):
    from arkinfer import native_build

    if not native_build.available():
        pytest.skip("no native kernels here (arkinfer.native_build.available(): needs x86-64 "
                    "with AVX2/FMA and a C compiler, and ARKINFER_NATIVE not 0)")
    made = native_step(head)
    assert made is not None  # the demo head's shapes fit the C step
    return made


@torch.no_grad()
def test_native_steps_equal_pytorch_steps(head, step):
    """300 one-token steps after a 40-position prefix (past the cache's first 256-row buffer):
    hidden within 2e-4, logits within 1e-4, the same argmax; the two caches hold the same rows.
    Both paths take PyTorch's previous hidden state as input at every step (teacher-forced), so
    a step's rounding difference (FMA order: AVX2 and AVX-512 differ) is checked alone instead
    of compounding over 300 chained steps."""
    h = head.config.hidden_size
    gen = torch.Generator().manual_seed(0)
    ours, theirs = head.new_cache(), head.new_cache()
    embeds = head.embed(torch.arange(40))
    features = head.fuse(torch.randn(40, 3 * h, generator=gen))
    a, _ = head(embeds, features, torch.arange(40), ours)
    b, _ = head(embeds, features, torch.arange(40), theirs)
    a, b = a[-1:], b[-1:]
    for i in range(300):
        embed = head.embed(torch.tensor([(7 * i) % head.config.vocab_size]))
        prev = a
        a, logits = head(embed, prev, torch.tensor([40 + i]), ours)
        b, row, best = step(embed, prev, 40 + i, theirs)
        torch.testing.assert_close(b, a, atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(row, logits[-1], atol=1e-4, rtol=1e-4)
        assert best == int(torch.argmax(row))
    assert ours.length == theirs.length == 340
    torch.testing.assert_close(theirs.k, ours.k, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(theirs.v, ours.v, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_mixed_steps_after_a_truncation(head, step):
    """A C step, a truncation back over it, then a PyTorch step: the cache row is overwritten,
    as the draft does between proposals."""
    h = head.config.hidden_size
    cache, fresh = head.new_cache(), head.new_cache()
    embeds, hidden = head.embed(torch.arange(10)), torch.randn(10, h)
    out, _ = head(embeds, hidden, torch.arange(10), cache)
    head(embeds, hidden, torch.arange(10), fresh)
    step(head.embed(torch.tensor([3])), out[-1:], 10, cache)
    cache.truncate(10)
    a, la = head(head.embed(torch.tensor([5])), out[-1:], torch.tensor([10]), cache)
    b, lb = head(head.embed(torch.tensor([5])), out[-1:], torch.tensor([10]), fresh)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(la, lb)
