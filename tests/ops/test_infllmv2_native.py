"""The optional C decode kernels (arkinfer/ops/infllmv2/decode_kernel.c) against plain torch
matmuls on the same gathered rows. Skipped, with the reason, where they cannot be built."""

from __future__ import annotations

import pytest
import torch

from arkinfer.ops.infllmv2.native import kernels, torch_only

native = kernels()
pytestmark = pytest.mark.skipif(native is None, reason="no C compiler or no AVX2/FMA CPU: the "
                                "decode path runs pure torch (tests/conformance covers it)")


def _rows(x: torch.Tensor, blocks: torch.Tensor, bs: int, tail0: int, n_tail: int) -> torch.Tensor:
    """The rows the kernels visit: each selected block, then the tail."""
    parts = [x[b * bs:(b + 1) * bs] for b in blocks.tolist()] + [x[tail0:tail0 + n_tail]]
    return torch.cat(parts)


@pytest.mark.parametrize("group,d,n_tail", [(16, 128, 37), (8, 64, 0), (16, 64, 3), (8, 128, 64)])
def test_scores_and_weighted_sum_match_torch(group, d, n_tail):
    g = torch.Generator().manual_seed(group + d + n_tail)
    bs, s = 64, 3000
    cache = torch.randn(2, s + 5, d, generator=g)[:, :s]     # row stride d, head stride (s+5)*d
    k, v = cache[0], cache[1]
    blocks = torch.randperm(s // bs - 2, generator=g)[:9]     # unsorted, as selection may give
    tail0 = s - n_tail
    q = torch.randn(group, d, generator=g)
    n = blocks.numel() * bs + n_tail
    scores = torch.full((group, n + 5), float("nan"))         # wider than needed: ns > n
    native.scores(q.T.contiguous(), k, blocks, bs, tail0, n_tail, scores)
    want = q @ _rows(k, blocks, bs, tail0, n_tail).T
    torch.testing.assert_close(scores[:, :n], want, rtol=1e-5, atol=1e-5)
    assert scores[:, n:].isnan().all()                         # nothing written past n

    probs = torch.softmax(want, -1)
    out = torch.full((group, d), float("nan"))
    native.pv(probs, v, blocks, bs, tail0, n_tail, out)
    torch.testing.assert_close(out, probs @ _rows(v, blocks, bs, tail0, n_tail),
                               rtol=1e-5, atol=1e-5)


def test_unsupported_shapes_are_left_to_torch():
    assert native.supports(16, 128, torch.zeros(4, 128))
    assert not native.supports(2, 128, torch.zeros(4, 128))            # group
    assert not native.supports(16, 72, torch.zeros(4, 72))             # head_dim
    assert not native.supports(16, 128, torch.zeros(4, 128, dtype=torch.bfloat16))
    assert not native.supports(16, 128, torch.zeros(128, 4).T)         # rows not contiguous
    with torch_only():
        assert kernels() is None
    assert kernels() is native
