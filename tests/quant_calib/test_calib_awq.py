"""AWQ: the scale search beats RTN on a layer with outlier input channels; the clip search never
hurts; inside a block the preceding op absorbs 1/s exactly (8-bit AWQ ~ float)."""

from __future__ import annotations

import torch
from arkinfer.quant import get_format, quantize_rtn
from arkinfer.quant.calib import (
    AWQCalibrator,
    AWQConfig,
    BlockRunner,
    CalibContext,
    RTNCalibrator,
    RTNConfig,
    search_clip,
    search_scale,
)
from arkinfer.quant.calib.awq import apply_clip
from arkinfer.quant.calib.base import output_snr_db

from arkinfer.frontend.checkpoint import load_model, open_checkpoint

CFG = AWQConfig(bits=4, group_size=32, sym=False)


def outlier_layer(seed=0, n=2048, cols=128, out=96):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, cols, generator=gen)
    hot = torch.randperm(cols, generator=gen)[:4]
    x[:, hot] *= 25.0  # a few salient input channels
    w = 0.05 * torch.randn(out, cols, generator=gen)
    return x, w


def mse(x, w, w_hat):
    return float(((x @ w.T - x @ w_hat.T) ** 2).mean())


def rtn(w, c=CFG):
    return quantize_rtn(w, c.bits, c.group_size, c.sym, scale_dtype=torch.float16).dequantize()


def test_scale_search_beats_rtn_on_outlier_channels():
    x, w = outlier_layer()
    x_mean = x.abs().mean(0)
    ref = x @ w.T

    def run(hats):
        return x @ hats[0].T

    s, alpha, loss = search_scale(x_mean, [w], run, ref, CFG, torch.float16)
    assert alpha is not None and 0 < alpha < 1  # a real AWQ scale won, not the identity
    w_awq = rtn(w * s) / s
    assert loss == mse(x, w, w_awq) or abs(loss - mse(x, w, w_awq)) < 1e-9
    assert mse(x, w, w_awq) < 0.7 * mse(x, w, rtn(w))


def test_clip_search_never_hurts():
    x, w = outlier_layer(seed=3)
    max_val = search_clip(w, x[::4], CFG, torch.float16)
    assert max_val.shape == (w.shape[0], w.shape[1] // CFG.group_size)
    clipped = rtn(apply_clip(w, max_val, CFG.group_size))
    assert mse(x[::4], w, clipped) <= mse(x[::4], w, rtn(w)) * (1 + 1e-6)


def _block_snr(handler, ckpt, calib_ids, fmt):
    model = load_model(ckpt)
    calib = calib_ids(8, 32)
    x = model.model.embed_tokens(calib.ids).detach()
    layer = model.model.layers[0]
    runner = BlockRunner(layer, "model.layers.0.", x, calib.mask, model.config.inv_freq(32), 4)
    result = handler.quantize_block(runner, CalibContext(get_format(fmt)))
    out = runner.run()
    return output_snr_db(runner.reference, x, out, calib.mask), result, layer


def test_awq_block_absorbs_scales_exactly(tiny_checkpoint, calib_ids):
    """8-bit AWQ: any error in moving 1/s into the norms and v/up rows would dominate."""
    ckpt = open_checkpoint(tiny_checkpoint("llama", num_attention_heads=4, num_key_value_heads=4),
                           with_tokenizer=False)
    snr, result, layer = _block_snr(AWQCalibrator(AWQConfig(bits=8, group_size=32)), ckpt,
                                    calib_ids, "gptq")
    assert snr > 35.0
    norms = {n for n in result.floats}
    assert norms == {"model.layers.0.input_layernorm.weight",
                     "model.layers.0.post_attention_layernorm.weight"}
    assert torch.equal(result.floats["model.layers.0.input_layernorm.weight"],
                       layer.input_layernorm.weight)
    assert len(result.quantized) == 7


def test_awq_block_beats_rtn(tiny_checkpoint, calib_ids):
    ckpt = open_checkpoint(tiny_checkpoint("llama"), with_tokenizer=False)
    cfg = AWQConfig(bits=4, group_size=32, search_samples=8)
    awq, _, _ = _block_snr(AWQCalibrator(cfg), ckpt, calib_ids, "awq")
    plain, _, _ = _block_snr(RTNCalibrator(RTNConfig(4, 32, sym=False)), ckpt, calib_ids, "awq")
    assert awq > plain
