"""P-GPTQ differs from GPTQ only through the Hessian (the first positions of every sequence are
left out), and that helps when those positions carry outlier activations."""

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
)

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
    """Same block, same inputs: P-GPTQ == GPTQ whose token mask already drops the prefix."""
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

    p = run(PGPTQCalibrator(PGPTQConfig(group_size=32)), calib.mask)
    g = run(GPTQCalibrator(GPTQConfig(group_size=32)), prefix_mask(calib.mask, 4))
    plain = run(GPTQCalibrator(GPTQConfig(group_size=32)), calib.mask)
    assert set(p) == set(g) == set(plain)
    assert all(p[n].equals(g[n]) for n in p)
    assert not all(p[n].equals(plain[n]) for n in p)


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
