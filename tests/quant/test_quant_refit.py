"""Scales refitted to GPTQ's codes (quant/calib/refit.py): for every row the refitted scales give
a layer-output error on the calibration inputs no larger than GPTQ's own scales, the codes are
unchanged, and on fresh inputs from the same distribution the error is lower overall."""

from __future__ import annotations

import pytest
import torch
from arkinfer.quant.calib.gptq import gptq_quantize
from arkinfer.quant.calib.refit import refit_scales, refittable
from arkinfer.quant.formats import get_format


def _inputs(n: int, cols: int, seed: int) -> torch.Tensor:
    """Correlated inputs with a few strong channels, as a decoder's activations."""
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(cols, cols, generator=torch.Generator().manual_seed(7)) / cols ** 0.5
    x = torch.randn(n, cols, generator=gen) @ (torch.eye(cols) + mix)
    return x * (1 + 4 * (torch.arange(cols) % 17 == 0))


def _row_error(w, qw, x):
    return (((w - qw.dequantize()) @ x.T) ** 2).sum(1)


@pytest.mark.parametrize("fmt,bits,sym,act_order,static", [
    ("gguf-iq4_nl", 4, True, True, True),
    ("gguf-q4_0", 4, True, True, True),
    ("gguf-q5_0", 5, True, False, False),
    (None, 4, False, True, False),  # asymmetric with a permuting g_idx (GPTQ checkpoint)
])
def test_refit_never_worsens_a_row_and_helps_on_fresh_inputs(fmt, bits, sym, act_order, static):
    torch.manual_seed(0)
    cols, out = 128, 48
    w = torch.randn(out, cols) * (1 + (torch.rand(out, cols) < 0.02) * 5)
    x = _inputs(2048, cols, 1)
    h = 2 * x.T @ x / x.shape[0]
    kw = {"bits": bits, "group_size": 32, "sym": sym, "act_order": act_order,
          "static_groups": static, "scale_dtype": torch.float16, "grid": "mse", "fmt": fmt,
          "dtype": torch.float64}
    plain = gptq_quantize(w, h, **kw).weight
    refit = gptq_quantize(w, h, refit=True, **kw).weight
    assert refittable(plain, get_format(fmt) if fmt else None)
    assert torch.equal(plain.codes, refit.codes)
    assert not torch.equal(plain.scales, refit.scales)
    assert torch.equal(refit.scales, refit.scales.half().float())  # stored as fp16
    err_plain = _row_error(w, plain, x) + 0.01 * h.diagonal().mean() * x.shape[0] / 2 * (
        (w - plain.dequantize()) ** 2).sum(1)
    err_refit = _row_error(w, refit, x) + 0.01 * h.diagonal().mean() * x.shape[0] / 2 * (
        (w - refit.dequantize()) ** 2).sum(1)
    assert bool((err_refit <= err_plain * (1 + 1e-6)).all())
    fresh = _inputs(2048, cols, 2)
    assert float(_row_error(w, refit, fresh).sum()) < float(_row_error(w, plain, fresh).sum())
    _, changed = refit_scales(refit, w, h, torch.float16, damp=0.01)
    assert changed <= 0.1  # a fixed point, up to fp16 rounding


def test_k_quants_and_ternary_are_left_alone():
    from arkinfer.quant.ternary import quantize_ternary

    assert not refittable(quantize_ternary(torch.randn(8, 64), group_size=-1))
    assert not refittable(gptq_quantize(torch.randn(8, 256), torch.eye(256), bits=4,
                                        group_size=32, sym=False, static_groups=True,
                                        fmt="gguf-q4_k").weight, get_format("gguf-q4_k"))
