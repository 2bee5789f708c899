"""The optional C decode kernels (arkinfer/ops/infllmv2/decode_kernel.c) against plain torch
matmuls on the same gathered rows. Skipped, with the reason, where they cannot be built."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from arkinfer.ops.infllmv2.native import kernels, torch_only

native = kernels()
needs_native = pytest.mark.skipif(native is None, reason="no C compiler or no AVX2/FMA CPU: the "
                                  "decode path runs pure torch (tests/conformance covers it)")


def _rows(x: torch.Tensor, blocks: torch.Tensor, bs: int, tail0: int, n_tail: int) -> torch.Tensor:
    """The rows the kernels visit: each selected block, then the tail."""
    parts = [x[b * bs:(b + 1) * bs] for b in blocks.tolist()] + [x[tail0:tail0 + n_tail]]
    return torch.cat(parts)


@needs_native
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


@needs_native
def test_unsupported_shapes_are_left_to_torch():
    assert native.supports(16, 128, torch.zeros(4, 128))
    assert not native.supports(2, 128, torch.zeros(4, 128))            # group
    assert not native.supports(16, 72, torch.zeros(4, 72))             # head_dim
    assert not native.supports(16, 128, torch.zeros(4, 128, dtype=torch.bfloat16))
    assert not native.supports(16, 128, torch.zeros(128, 4).T)         # rows not contiguous
    with torch_only():
        assert kernels() is None
    assert kernels() is native


_FALLBACK = """
import warnings, torch
from dataclasses import replace
from arkinfer.ops.infllmv2 import SparseConfig, infllmv2_attention
from arkinfer.ops.infllmv2 import reference
from arkinfer.ops.infllmv2.native import kernels
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert kernels() is None
if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):  # else no build is tried
    assert any("torch path" in str(w.message) for w in caught), [str(w.message) for w in caught]
cfg = replace(SparseConfig(kernel_size=8, kernel_stride=4, block_size=16, window_size=32, topk=4),
              dense_len=-1)
g = torch.Generator().manual_seed(0)
q = torch.randn(1, 16, 1, 64, generator=g)
k, v = torch.randn(2, 1, 1, 300, 64, generator=g)
out, _, idx = infllmv2_attention(q, k, v, config=cfg, scale=0.125, cache_len=299)
r_out, _, r_idx = reference.infllmv2_attention(q, k, v, config=cfg, scale=0.125, cache_len=299)
assert torch.equal(idx, r_idx) and torch.allclose(out, r_out, atol=1e-5)
"""


def test_a_failed_build_falls_back_to_torch(tmp_path):
    """No working compiler (CC=false) on a fresh cache: a warning, then the torch path, correct."""
    env = {**os.environ, "CC": "false", "XDG_CACHE_HOME": str(tmp_path), "ARKINFER_NATIVE": "1"}
    result = subprocess.run([sys.executable, "-c", _FALLBACK], env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
