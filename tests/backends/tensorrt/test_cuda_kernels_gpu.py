"""CUDA kernels against the references, on a CUDA GPU (skipped elsewhere with that reason):
W4A16 over Marlin bytes vs the numpy Marlin unpack x activations; InfLLM v2 decode (compression
full and incremental, selected blocks, output) vs arkinfer.ops.infllmv2.reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from arkinfer.backends.tensorrt.kernels import build
from arkinfer.quant.formats.marlin import MARLIN
from marlin_weights import random_marlin_weight

from arkinfer.ops.infllmv2 import reference
from arkinfer.ops.infllmv2.common import CompressedKeys
from arkinfer.ops.infllmv2.compress import compress_keys
from arkinfer.ops.infllmv2.config import SparseConfig

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"),
    pytest.mark.skipif(build.nvcc() is None, reason="nvcc not found"),
]


@pytest.fixture(scope="module")
def kernels():
    from arkinfer.backends.tensorrt.kernels.bindings import load
    return load()


@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize(("n", "k", "group_size"), [(512, 1024, 128), (256, 2048, -1),
                                                     (4096, 4096, 128)])
def test_marlin_gemm_equals_unpack_times_x(kernels, m, n, k, group_size):
    rng = np.random.default_rng(m * n + k)
    qw = random_marlin_weight(rng, n, k, group_size, 0.001, 0.02)
    packed = MARLIN.pack(qw)
    w = MARLIN.unpack(packed, n, k, group_size=group_size).dequantize().numpy()   # [n, k] fp32
    x = rng.standard_normal((m, k)).astype(np.float16)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    dev = "cuda"
    y = kernels.marlin_gemm(torch.from_numpy(x).to(dev),
                            torch.from_numpy(np.ascontiguousarray(packed["B"])).to(dev),
                            torch.from_numpy(np.ascontiguousarray(packed["s"])).to(dev),
                            group_size)
    got = y.float().cpu().numpy()
    # fp32 accumulation; the only rounding of note is the fp16 output (2^-11 relative)
    np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())


CONFIGS = {
    "small": SparseConfig(kernel_size=32, kernel_stride=16, block_size=64, init_blocks=1,
                          window_size=256, topk=8, dense_len=-1),
    "minicpm4.1": SparseConfig(dense_len=-1),
}


def _decode_inputs(hq, hkv, d, length, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, hq, 1, d, generator=g).to(dtype)
    k = torch.randn(1, hkv, length, d, generator=g).to(dtype)
    v = torch.randn(1, hkv, length, d, generator=g).to(dtype)
    return q, k, v


def _idx_sets(idx):
    return [sorted(int(b) for b in row if b >= 0) for row in idx]


def _assert_same_selection(idx, ref_idx, ranked):
    """Same block sets, except that blocks whose reference score is within 1e-4 (relative) of
    the cut may swap: the kernel's dot products and exp round differently from torch's."""
    for g, (got, want) in enumerate(zip(_idx_sets(idx), _idx_sets(ref_idx), strict=True)):
        assert len(got) == len(want)
        cut = min(float(ranked[g, b]) for b in want)
        for b in set(got) ^ set(want):
            assert abs(float(ranked[g, b]) - cut) <= 1e-4 * abs(cut), (g, b, got, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("name", "hq", "hkv", "d", "length"), [
    ("small", 8, 2, 64, 4099), ("small", 16, 1, 128, 3000), ("small", 32, 2, 128, 8192),
    ("minicpm4.1", 32, 2, 128, 20011)])
def test_infllmv2_decode_matches_reference(kernels, dtype, name, hq, hkv, d, length):
    cfg = CONFIGS[name]
    scale = 1.0 / math.sqrt(d)
    q, k, v = _decode_inputs(hq, hkv, d, length, dtype, seed=length + hq)
    dev = "cuda"
    qd, kd, vd = q[0, :, 0].contiguous().to(dev), k[0].contiguous().to(dev), v[0].contiguous().to(dev)

    # compression: full, and incremental over the last 70 keys, both equal the reference
    ref_keys = compress_keys(k.float(), cfg)
    fine, coarse = kernels.compress_all(kd, length, cfg)
    torch.testing.assert_close(fine.cpu(), ref_keys.fine[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(coarse.cpu(), ref_keys.coarse[0], rtol=1e-5, atol=1e-5)
    inc_fine, inc_coarse = kernels.compress_all(kd, length - 70, cfg)
    fine_buf = torch.zeros_like(fine)
    coarse_buf = torch.zeros_like(coarse)
    fine_buf[:, :inc_fine.shape[1]] = inc_fine
    coarse_buf[:, :inc_coarse.shape[1]] = inc_coarse
    for step in range(length - 69, length + 1):
        kernels.compress(kd, step - 1, step, cfg.kernel_size, cfg.kernel_stride, fine_buf)
        kernels.compress(kd, step - 1, step, cfg.coarse_kernel_size, cfg.coarse_kernel_stride,
                         coarse_buf)
    torch.testing.assert_close(fine_buf, fine, rtol=0, atol=0)
    torch.testing.assert_close(coarse_buf, coarse, rtol=0, atol=0)

    # selection: the reference's blocks (up to near-ties at the cut) on the same compressed keys
    ws = kernels.workspace(hq, hkv, d, length, cfg, torch.device(dev))
    idx = kernels.select(qd, fine.contiguous(), coarse.contiguous(), length, cfg, scale, ws)
    keys = CompressedKeys(fine=fine.cpu()[None], coarse=coarse.cpu()[None], length=length)
    ref_idx = reference.select_blocks(q, keys, config=cfg, scale=scale, cache_len=length - 1)
    scores = reference.block_scores(q, keys, config=cfg, scale=scale, cache_len=length - 1)
    ranked = reference.ranking_scores(scores, cfg, length - 1)[0, :, 0]
    _assert_same_selection(idx.cpu(), ref_idx[0, :, 0], ranked)

    # attention over the kernel's selected blocks
    out = kernels.sparse_decode(qd, kd, vd, idx, length, cfg, scale, ws)
    ref_out = reference.block_sparse_attention(q.float(), k.float(), v.float(),
                                               idx.cpu().long()[None, :, None], config=cfg,
                                               scale=scale, cache_len=length - 1)
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(out.float().cpu(), ref_out[0, :, 0], rtol=tol, atol=tol)


def test_infllmv2_needle_block_is_selected(kernels):
    """A key block aligned with the query far outside the window is selected (§6.4)."""
    cfg = CONFIGS["small"]
    hq, hkv, d, length = 16, 1, 128, 16384
    q, k, _ = _decode_inputs(hq, hkv, d, length, torch.float16, seed=7)
    needle = 40
    k[0, 0, needle * 64:(needle + 1) * 64] = (q[0, 0, 0] * 0.5).to(k.dtype)
    dev = "cuda"
    kd = k[0].contiguous().to(dev)
    fine, coarse = kernels.compress_all(kd, length, cfg)
    ws = kernels.workspace(hq, hkv, d, length, cfg, torch.device(dev))
    idx = kernels.select(q[0, :, 0].contiguous().to(dev), fine.contiguous(), coarse.contiguous(),
                         length, cfg, 1.0 / math.sqrt(d), ws)
    assert needle in _idx_sets(idx.cpu())[0]


def test_attention_adapter_prefill_and_decode_match_reference(kernels):
    """infllmv2_attention_cuda (per-query decode kernels) vs the reference: a 1500-token bf16
    prefill with the small config and dense_len -1, then one decode step with the carried state."""
    from arkinfer.backends.tensorrt.kernels.infllmv2_torch import (
        infllmv2_attention_cuda,
    )
    cfg = CONFIGS["small"]
    hq, hkv, d, length = 8, 2, 64, 1501
    _, k, v = _decode_inputs(hq, hkv, d, length, torch.bfloat16, seed=3)
    q = torch.randn(1, hq, length, d, generator=torch.Generator().manual_seed(4)).bfloat16()
    scale = 1.0 / math.sqrt(d)
    out, state, idx = infllmv2_attention_cuda(q[:, :, :1500], k[:, :, :1500], v[:, :, :1500],
                                              config=cfg, scale=scale, cache_len=0)
    ref_out, _, ref_idx = reference.infllmv2_attention(q[:, :, :1500], k[:, :, :1500],
                                                       v[:, :, :1500], config=cfg, scale=scale,
                                                       cache_len=0)
    assert (idx != ref_idx).float().mean() < 0.01      # near-ties at the cut only
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=2e-2, atol=2e-2)
    out1, state1, _ = infllmv2_attention_cuda(q[:, :, 1500:], k, v, config=cfg, scale=scale,
                                              cache_len=1500, state=state)
    ref1, ref_state1, _ = reference.infllmv2_attention(q[:, :, 1500:], k, v, config=cfg,
                                                       scale=scale, cache_len=1500)
    torch.testing.assert_close(state1.fine, ref_state1.fine, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out1.float(), ref1.float(), rtol=2e-2, atol=2e-2)
