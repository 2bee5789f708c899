"""Greedy decoding picks the same token whichever argmax computes it (arkinfer.generate)."""

from __future__ import annotations

import torch

from arkinfer.generate import sample_next


def test_greedy_is_torch_argmax_on_ties_nan_and_other_dtypes():
    gen = torch.Generator().manual_seed(0)
    cases = [torch.randn(49152, generator=gen),
             torch.tensor([1.0, 3.0, 3.0, -2.0]),                  # a tie: the first maximum
             torch.tensor([1.0, float("nan"), 5.0, float("nan")]),  # a NaN counts as the maximum
             torch.tensor([-float("inf"), -float("inf")]),
             torch.randn(300, generator=gen).bfloat16(),            # torch's own argmax
             torch.randn(300, generator=gen, requires_grad=True)]
    for logits in cases:
        assert sample_next(logits, 0.0, 1.0, gen) == int(torch.argmax(logits))
