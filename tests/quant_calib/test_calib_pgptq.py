"""P-GPTQ differs from GPTQ only through the Hessian (the first positions of every sequence are
left out, or enter with a capped norm), and that helps when those positions carry outlier
activations — without wrecking the output of the outlier (attention-sink) token itself."""

from __future__ import annotations

import pytest
import torch
from arkinfer.quant import get_format
from arkinfer.quant.calib import (
    BlockRunner,
    CalibContext,
    GPTQCalibrator,
    GPTQConfig,
    HessianAccumulator,
    PGPTQCalibrator,
    PGPTQConfig,
    gptq_quantize,
    prefix_mask,
    prefix_split,
)
from arkinfer.quant.rtn import quantize_rtn

from arkinfer.frontend.checkpoint import load_model, open_checkpoint


def outlier_inputs(n=16, t=24, cols=128, prefix=4, factor=30.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, t, cols, generator=gen) @ (torch.eye(cols) + 0.3 * torch.randn(
        cols, cols, generator=gen) / cols ** 0.5)
    x[:, :prefix] *= factor * torch.rand(cols, generator=gen)  # sink tokens: large, skewed
    return x


def test_prefix_mask_and_masked_hessian():
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[2, 8:] = False  # padding
    keep = prefix_mask(mask, 4)
    assert keep[:, :4].sum() == 0 and torch.equal(keep[:, 4:], mask[:, 4:])
    assert prefix_mask(mask, 0) is mask
    x = torch.randn(3, 10, 16)
    acc = HessianAccumulator(16)
    acc.add(x[:2], keep[:2])
    acc.add(x[2:], keep[2:])
    rows = x[keep]
    expected = 2.0 / rows.shape[0] * rows.T.double() @ rows.double()
    assert acc.count == rows.shape[0] == 2 * 6 + 4
    assert torch.allclose(acc.hessian().double(), expected, rtol=1e-5, atol=1e-6)


def test_pgptq_is_gptq_with_the_prefix_masked(tiny_checkpoint, calib_ids):
    """Same block, same inputs: P-GPTQ with prefix_cap=0 == GPTQ whose token mask already drops
    the prefix; P-GPTQ with prefix_skip=0 == GPTQ bit for bit."""
    ckpt = open_checkpoint(tiny_checkpoint("llama"), with_tokenizer=False)
    model = load_model(ckpt)
    calib = calib_ids(8, 16)
    x = model.model.embed_tokens(calib.ids).detach()
    x[:, :4] *= 20.0
    rope = model.config.inv_freq(16)
    ctx = CalibContext(get_format("gptq"))

    def run(handler, mask):
        layer = load_model(ckpt).model.layers[0]
        return handler.quantize_block(BlockRunner(layer, "l.", x, mask, rope, 4), ctx).quantized

    p = run(PGPTQCalibrator(PGPTQConfig(group_size=32, prefix_cap=0.0)), calib.mask)
    g = run(GPTQCalibrator(GPTQConfig(group_size=32)), prefix_mask(calib.mask, 4))
    plain = run(GPTQCalibrator(GPTQConfig(group_size=32)), calib.mask)
    p0 = run(PGPTQCalibrator(PGPTQConfig(group_size=32, prefix_skip=0)), calib.mask)
    capped = run(PGPTQCalibrator(PGPTQConfig(group_size=32)), calib.mask)
    assert set(p) == set(g) == set(plain) == set(p0) == set(capped)
    assert all(p[n].equals(g[n]) for n in p)
    assert all(p0[n].equals(plain[n]) for n in p)
    assert not all(p[n].equals(plain[n]) for n in p)
    assert not all(capped[n].equals(p[n]) for n in p)


@pytest.mark.parametrize("act_order", [False, True])
def test_pgptq_lowers_error_on_ordinary_tokens(act_order):
    x = outlier_inputs()
    cols = x.shape[-1]
    w = 0.05 * torch.randn(64, cols, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(x.shape[:2], dtype=torch.bool)
    hs = {}
    for skip in (0, 4):
        acc = HessianAccumulator(cols)
        acc.add(x, prefix_mask(mask, skip))
        hs[skip] = acc.hessian()
    body = x[:, 4:].reshape(-1, cols)

    def err(h):
        q = gptq_quantize(w, h, bits=4, group_size=32, act_order=act_order,
                          scale_dtype=torch.float16).weight.dequantize()
        return float(((body @ (w - q).T) ** 2).mean())

    assert err(hs[4]) < 0.9 * err(hs[0])


def test_capped_prefix_hessian_equals_direct_reference():
    """H from the accumulator (batches, padding, prefix kept aside) == H computed at once in
    float64 from the rows: body rows as they are, prefix rows rescaled to <= cap x body RMS."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 12, 24, generator=gen)
    x[:, 0] *= 40.0
    x[:, 1] *= 3.0
    mask = torch.ones(5, 12, dtype=torch.bool)
    mask[4, 9:] = False  # padding
    mask[3, 2:] = False  # a sequence with only 2 real tokens: all prefix
    body, prefix = prefix_split(mask, 4)
    assert not (body & prefix).any() and torch.equal(body | prefix, mask)
    cap = 5.0
    acc = HessianAccumulator(24, prefix_cap=cap)
    for b in range(0, 5, 2):
        acc.add(x[b:b + 2], body[b:b + 2])
        acc.add_prefix(x[b:b + 2], prefix[b:b + 2])
    rows_b, rows_p = x[body].double(), x[prefix].double()
    rms = rows_b.pow(2).sum(1).mean().sqrt()
    scaled = rows_p * torch.clamp(cap * rms / rows_p.norm(dim=1), max=1.0)[:, None]
    assert (rows_p.norm(dim=1) > cap * rms).any() and (rows_p.norm(dim=1) < cap * rms).any()
    n = rows_b.shape[0] + rows_p.shape[0]
    expected = 2.0 / n * (rows_b.T @ rows_b + scaled.T @ scaled)
    assert acc.count == rows_b.shape[0]  # prefix rows are folded in by hessian()
    got = acc.hessian().double()
    assert acc.count == n
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
    dropped = HessianAccumulator(24, prefix_cap=0.0)
    dropped.add(x, body)
    dropped.add_prefix(x, prefix)
    assert torch.allclose(dropped.hessian().double(), 2.0 / rows_b.shape[0] * rows_b.T @ rows_b,
                          rtol=1e-5, atol=1e-5)


def sink_inputs(n=16, t=32, cols=128, seed=0):
    """Ordinary tokens, except position 0: an attention sink whose input is ~300 in two channels
    that ordinary tokens barely use (SmolLM2's block-11 down_proj input has ~3000 there)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, t, cols, generator=gen) @ (torch.eye(cols) + 0.3 * torch.randn(
        cols, cols, generator=gen) / cols ** 0.5)
    x[..., :2] *= 0.05
    x[:, 0] *= 0.2
    x[:, 0, :2] = 300.0 * (1 + 0.01 * torch.randn(n, 2, generator=gen))
    return x


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_pgptq_keeps_the_sink_token_and_helps_ordinary_tokens(act_order, seed):
    """The bug this guards: dropping the sink from H let GPTQ park error on the columns only the
    sink uses, so the sink's output error exceeded even RTN's (SmolLM2 ppl 30.8 -> 69.5). The
    capped prefix keeps the sink at GPTQ's error and ordinary tokens below GPTQ's."""
    x = sink_inputs(seed=seed)
    cols = x.shape[-1]
    w = 0.05 * torch.randn(64, cols, generator=torch.Generator().manual_seed(seed + 1))
    mask = torch.ones(x.shape[:2], dtype=torch.bool)
    body, prefix = prefix_split(mask, 4)
    sink, ordinary = x[:, 0], x[:, 4:].reshape(-1, cols)

    def errors(q):
        d = w - q
        return (float((sink @ d.T).norm() / (sink @ w.T).norm()),
                float((ordinary @ d.T).norm() / (ordinary @ w.T).norm()))

    def gptq_with(acc):
        return errors(gptq_quantize(w, acc.hessian(), bits=4, group_size=32,
                                    act_order=act_order).weight.dequantize())

    full = HessianAccumulator(cols)
    full.add(x, mask)
    capped, dropped = HessianAccumulator(cols, prefix_cap=10.0), HessianAccumulator(cols)
    for acc in (capped, dropped):
        acc.add(x, body)
        acc.add_prefix(x, prefix)
    rtn_sink, _ = errors(quantize_rtn(w, 4, 32, True).dequantize())
    g_sink, g_ord = gptq_with(full)
    c_sink, c_ord = gptq_with(capped)
    d_sink, _ = gptq_with(dropped)
    assert c_sink < 1.05 * g_sink and c_sink < 0.9 * rtn_sink
    assert c_ord < 0.98 * g_ord
    assert d_sink > 1.05 * g_sink  # the literal "drop the prefix" rule: the sink pays


@pytest.mark.parametrize("features", [100, 576, 1536])
def test_gram_from_the_upper_triangle_equals_the_full_product(features):
    """hessian.gram computes xᵀx band by band above the diagonal and mirrors it: the same values
    as the full float32 product (within float32 rounding of a differently split matmul), and
    exactly symmetric."""
    from arkinfer.quant.calib.hessian import gram

    x = torch.randn(700, features, generator=torch.Generator().manual_seed(features))
    got = gram(x)
    assert torch.equal(got, got.T)
    torch.testing.assert_close(got, x.T @ x, rtol=1e-5, atol=1e-3)
