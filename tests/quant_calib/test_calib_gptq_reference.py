"""GPTQ (blocked, lazy batch updates) equals a plain column-by-column transcription of
docs/quant.md §2 written here without blocks, and beats RTN on correlated inputs."""

from __future__ import annotations

import math

import pytest
import torch
from arkinfer.quant import quantize_rtn
from arkinfer.quant.calib.gptq import gptq_quantize
from arkinfer.quant.rtn import find_params, quantize_with


def plain_gptq(w, H, bits, group_size, sym, act_order, static_groups=False, damp=0.01,
               dtype=torch.float64, passes=1):
    """One column at a time: no blocks, no lazy updates. Returns (codes, scales, zeros, g_idx).
    passes > 1 (static groups): run again with every group's parameters taken from the weights
    as the previous pass left them just before each was rounded."""
    out, cols = w.shape
    W, H = w.to(dtype).clone(), H.to(dtype).clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    size = cols if group_size == -1 else group_size
    params = {}
    if group_size == -1 or static_groups:
        for g in range(cols // size):
            params[g] = find_params(W[:, g * size:(g + 1) * size], bits, sym, torch.float16)
    order = torch.argsort(torch.diag(H), descending=True, stable=True) if act_order \
        else torch.arange(cols)
    start, H = W[:, order], H[order][:, order]
    Hd = H.clone()
    Hd += damp * torch.mean(torch.diag(H)) * torch.eye(cols, dtype=dtype)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(Hd)), upper=True)
    codes = torch.zeros(out, cols, dtype=torch.uint8)
    scales = torch.zeros(out, cols // size)
    zeros = torch.zeros(out, cols // size)
    g_idx = torch.zeros(cols, dtype=torch.int32)
    fed = None
    for p in range(passes):
        if p:  # parameters from the previous pass's error-fed weights (natural column order)
            params = {g: find_params(fed[:, g * size:(g + 1) * size], bits, sym, torch.float16)
                      for g in range(cols // size)}
        W, fed = start.clone(), torch.zeros(out, cols, dtype=dtype)
        _plain_pass(W, U, order, params, codes, scales, zeros, g_idx, fed, bits, sym, size,
                    group_size == -1 or static_groups)
    return codes, scales, zeros.to(torch.int32), g_idx


def _plain_pass(W, U, order, params, codes, scales, zeros, g_idx, fed, bits, sym, size, static):
    """One column-by-column GPTQ pass over the permuted `W`, filling codes / scales / zeros /
    g_idx and `fed` (each column before rounding) in the original column order."""
    dtype, cols = W.dtype, W.shape[1]
    for c in range(cols):
        k = int(order[c])
        fed[:, k] = W[:, c]
        if static:
            g = k // size
            s, z = params[g]
        else:
            g = c // size
            if c % size == 0:
                params[g] = find_params(W[:, c:c + size], bits, sym, torch.float16)
            s, z = params[g]
        scales[:, g], zeros[:, g], g_idx[k] = s[:, 0], z[:, 0], g
        q = quantize_with(W[:, c:c + 1], s, z, bits)[:, 0]
        codes[:, k] = q
        deq = (s[:, 0] * (q.float() - z[:, 0])).to(dtype)
        err = (W[:, c] - deq) / U[c, c]
        W[:, c:] -= err[:, None] * U[c, c:][None, :]


def correlated(n_tokens: int, cols: int, seed: int, dead: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(cols, cols, generator=gen) / math.sqrt(cols)
    x = torch.randn(n_tokens, cols, generator=gen) @ (torch.eye(cols) + 2 * mix)
    x = x * torch.linspace(0.2, 3.0, cols)[torch.randperm(cols, generator=gen)]
    if dead:
        x[:, :dead] = 0
    return x


def hessian(x: torch.Tensor) -> torch.Tensor:
    return (2.0 / x.shape[0]) * (x.T.double() @ x.double()).float()


CASES = [(4, -1, True, False, False), (4, 32, True, False, False), (4, 128, False, False, False),
         (4, 32, False, True, False), (4, 128, True, True, False), (4, -1, False, True, False),
         (3, 64, True, True, True), (2, 32, False, False, False), (8, 32, True, True, False),
         (4, 96, False, True, False)]


@pytest.mark.parametrize("bits,group,sym,act,static", CASES)
def test_gptq_equals_plain_column_loop(bits, group, sym, act, static):
    cols = 384 if group == 96 else 256
    gen = torch.Generator().manual_seed(bits * 1000 + cols + max(group, 0))
    w = 0.05 * torch.randn(48, cols, generator=gen)
    H = hessian(correlated(2048, cols, seed=bits + max(group, 0), dead=3))
    ref_codes, ref_scales, ref_zeros, ref_gidx = plain_gptq(w, H, bits, group, sym, act, static)
    res = gptq_quantize(w, H, bits=bits, group_size=group, sym=sym, act_order=act,
                        static_groups=static, scale_dtype=torch.float16, dtype=torch.float64)
    qw = res.weight
    assert res.dead_columns == 3
    assert torch.equal(qw.codes, ref_codes)
    assert torch.equal(qw.scales, ref_scales)
    assert torch.equal(qw.zeros, ref_zeros)
    assert torch.equal(qw.group_index().to(torch.int32), ref_gidx)
    assert (qw.g_idx is not None) == (act and not static and group != -1)
    # float32 working precision (the default): the same codes up to rare rounding flips
    res32 = gptq_quantize(w, H, bits=bits, group_size=group, sym=sym, act_order=act,
                          static_groups=static, scale_dtype=torch.float16)
    same = (res32.weight.codes == ref_codes).float().mean().item()
    assert same > 0.995, same


@pytest.mark.parametrize("group,sym,act", [(32, True, True), (64, False, True), (-1, True, False)])
def test_static_passes_equal_plain_column_loop(group, sym, act):
    """static_passes=2: every group's parameters re-chosen from the first pass's error-fed
    weights, then GPTQ again; the same as the column-by-column transcription doing that."""
    gen = torch.Generator().manual_seed(7 + max(group, 0))
    w = 0.05 * torch.randn(40, 256, generator=gen)
    H = hessian(correlated(2048, 256, seed=11, dead=2))
    ref = plain_gptq(w, H, 4, group, sym, act, static_groups=True, passes=2)
    res = gptq_quantize(w, H, bits=4, group_size=group, sym=sym, act_order=act,
                        static_groups=True, scale_dtype=torch.float16, dtype=torch.float64,
                        static_passes=2)
    assert torch.equal(res.weight.codes, ref[0])
    assert torch.equal(res.weight.scales, ref[1])
    assert torch.equal(res.weight.zeros, ref[2])
    one = plain_gptq(w, H, 4, group, sym, act, static_groups=True)
    assert not torch.equal(one[1], ref[1])  # the second pass did change the scales


def snr_db(w, w_hat, x):
    ref = x @ w.T
    return 10 * math.log10(float((ref ** 2).sum()) / float(((ref - x @ w_hat.T) ** 2).sum()))


@pytest.mark.parametrize("group", [-1, 32, 128])
def test_gptq_output_snr_beats_rtn(group):
    cols = 256
    gen = torch.Generator().manual_seed(7)
    w = 0.05 * torch.randn(96, cols, generator=gen)
    x = correlated(4096, cols, seed=11)
    H = hessian(x)
    rtn = quantize_rtn(w, 4, group, sym=True, scale_dtype=torch.float16).dequantize()
    for act in (False, True):
        g = gptq_quantize(w, H, bits=4, group_size=group, sym=True, act_order=act,
                          scale_dtype=torch.float16).weight.dequantize()
        assert snr_db(w, g, x) > snr_db(w, rtn, x) + 1.0


def test_damping_retry_on_singular_hessian():
    # rank-deficient H with a negative eigen-direction: plain damping 0 fails, the retry works
    x = correlated(8, 64, seed=3)
    H = hessian(x)
    H[0, 1] = H[1, 0] = float(H[0, 0] + H[1, 1])  # makes H indefinite
    w = 0.05 * torch.randn(16, 64)
    res = gptq_quantize(w, H, bits=4, group_size=32, damp=0.0)
    assert res.damp > 0.0
    assert torch.isfinite(res.weight.dequantize()).all()


@pytest.mark.parametrize("act_order", [False, True], ids=["natural", "act-order"])
def test_stacked_linears_sharing_a_hessian_equal_each_alone(act_order):
    """GPTQ handles every output row alone given H, so q/k/v (or gate/up) quantised as one
    stacked weight (what GPTQCalibrator does: one factorisation, one column loop) give exactly
    the codes and scales of each linear quantised by itself."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 256, generator=g)
    h = 2 * x.T @ x / 2048
    weights = [torch.randn(rows, 256, generator=g) for rows in (256, 64, 64)]
    alone = [gptq_quantize(w, h, group_size=32, act_order=act_order).weight for w in weights]
    stacked = gptq_quantize(torch.cat(weights), h, group_size=32, act_order=act_order).weight
    assert torch.equal(stacked.codes, torch.cat([a.codes for a in alone]))
    assert torch.equal(stacked.scales, torch.cat([a.scales for a in alone]))
    assert torch.equal(stacked.zeros, torch.cat([a.zeros for a in alone]))
