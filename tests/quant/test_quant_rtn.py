"""The uniform RTN quantiser against a plain loop transcription of docs/quant.md §1, and the
canonical weight's validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from arkinfer.quant import (
    QuantError,
    QuantizedWeight,
    find_params,
    quantize_rtn,
    quantize_with,
)

f32 = np.float32


def loop_rtn(w: np.ndarray, bits: int, group: int, sym: bool):
    """docs/quant.md §1, one scalar at a time in float32 (dead groups as the GPTQ reference)."""
    out, inp = w.shape
    size = inp if group == -1 else group
    maxq = (1 << bits) - 1
    codes = np.zeros((out, inp), np.uint8)
    scales = np.zeros((out, inp // size), np.float32)
    zeros = np.zeros((out, inp // size), np.int32)
    for o in range(out):
        for g in range(inp // size):
            vals = [f32(v) for v in w[o, g * size:(g + 1) * size]]
            xmin, xmax = min(min(vals), f32(0)), max(max(vals), f32(0))
            if sym:
                xmax = max(abs(xmin), xmax)
                xmin = -xmax
            if xmin == 0 and xmax == 0:
                xmin, xmax = f32(-1), f32(1)
            scale = f32(f32(xmax - xmin) / f32(maxq))
            zero = f32(1 << (bits - 1)) if sym else min(max(np.round(f32(-xmin / scale)), 0), maxq)
            scales[o, g], zeros[o, g] = scale, int(zero)
            for j, v in enumerate(vals):
                q = np.round(f32(v / scale)) + zero  # np.round: half to even, like torch.round
                codes[o, g * size + j] = int(min(max(q, 0), maxq))
    return codes, scales, zeros


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("group", [-1, 16])
def test_rtn_matches_loop(bits: int, sym: bool, group: int) -> None:
    gen = torch.Generator().manual_seed(bits * 10 + sym + group)
    w = torch.randn(6, 48, generator=gen)
    w[0, :16] = 0.0                                  # a dead group
    w[1] = w[1].abs()                                # a row without negative weights
    w[2, :] = torch.round(w[2] * 4) / 4              # exact ties
    if group == 16 and not sym:
        w[3, 16:32] = -w[3, 16:32].abs()             # a group without positive weights
    qw = quantize_rtn(w, bits, group, sym)
    codes, scales, zeros = loop_rtn(w.numpy(), bits, group if group != -1 else -1, sym)
    assert np.array_equal(qw.codes.numpy(), codes)
    assert np.array_equal(qw.scales.numpy(), scales)
    assert np.array_equal(qw.zeros.numpy(), zeros)
    assert qw.g_idx is None and qw.bits == bits and qw.sym == sym


def test_symmetric_clips_the_positive_extreme() -> None:
    w = torch.tensor([[-1.0, 0.5, 1.0, 0.0]])
    qw = quantize_rtn(w, 4, -1, True)
    assert float(qw.scales) == pytest.approx(2 / 15)
    deq = qw.dequantize()[0]
    assert deq[2] == pytest.approx(7 / 7.5)  # +absmax -> 7 steps of absmax / 7.5


def test_asym_range_contains_zero_and_zero_is_exact() -> None:
    w = torch.rand(4, 64) + 1.0  # all positive: xmin clamps to 0, zero point 0
    qw = quantize_rtn(w, 4, 32, False)
    assert (qw.zeros == 0).all()
    assert torch.all(quantize_rtn(torch.zeros(2, 32), 4, 32, False).dequantize() == 0)


def test_scale_dtype_rounds_before_codes() -> None:
    w = torch.randn(8, 128)
    qw = quantize_rtn(w, 4, 32, False, scale_dtype=torch.float16)
    assert torch.equal(qw.scales.half().float(), qw.scales)
    scale, zero = find_params(w.reshape(-1, 32), 4, False, torch.float16)
    assert torch.equal(quantize_with(w.reshape(-1, 32), scale, zero, 4).reshape(8, 128), qw.codes)
    err = (qw.dequantize() - w).abs().max()
    assert err <= qw.scales.max() * 0.51  # round-to-nearest within half a step (+ fp16 scale)


def test_find_params_shapes_for_gptq_columns() -> None:
    w = torch.randn(5, 128)
    scale, zero = find_params(w, 4, True)
    assert scale.shape == (5, 1) and zero.shape == (5, 1)
    col = quantize_with(w[:, :1], scale, zero, 4)
    assert col.shape == (5, 1) and col.dtype == torch.uint8


def test_rtn_refuses_bad_arguments() -> None:
    message = (r"group_size=80 does not divide in_features=576 of 'model.*down_proj'"
               r"\nhint: .*\[32, 64\]")
    with pytest.raises(QuantError, match=message):
        quantize_rtn(torch.randn(4, 576), 4, 80, name="model.layers.3.mlp.down_proj")
    with pytest.raises(QuantError, match=r"bits=7"):
        quantize_rtn(torch.randn(4, 64), 7, 32)
    with pytest.raises(QuantError, match=r"2-D"):
        quantize_rtn(torch.randn(64), 4, 32)


def _qw(**kw):
    base = {"codes": np.zeros((4, 64), np.uint8), "scales": np.ones((4, 2), np.float32),
                "zeros": np.full((4, 2), 8, np.int32), "bits": 4, "group_size": 32, "sym": True}
    return QuantizedWeight(**{**base, **kw}, name="model.layers.1.self_attn.q_proj")


@pytest.mark.parametrize("kw, message", [
    ({"bits": 7}, r"bits=7 .*allowed \(2, 3, 4, 5, 6, 8\)"),
    ({"group_size": 48}, r"group_size=48 does not divide in_features=64 .*q_proj"),
    ({"scales": np.ones((4, 3), np.float32)}, r"scales .*shape \(4, 3\).*\[4, 2\]"),
    ({"codes": np.full((4, 64), 16, np.uint8)}, r"codes .*reach 16"),
    ({"zeros": np.full((4, 2), 7, np.int32)}, r"symmetric but zeros span 7..7"),
    ({"scales": np.full((4, 2), np.inf, np.float32)}, r"inf or nan"),
    ({"g_idx": np.full(64, 2, np.int32)}, r"g_idx .*spans 2..2; allowed 0..1"),
    ({"codes": np.zeros((4, 64), np.float32)}, r"integer dtype"),
    ({"kind": "binary"}, r"kind='binary' .*unknown; allowed \['uniform', 'ternary', 'codebook'\]"),
])
def test_weight_validation_names_the_bad_value(kw: dict, message: str) -> None:
    with pytest.raises(QuantError, match=message):
        _qw(**kw)


def test_static_g_idx_is_normalised_and_act_order_dequantises_by_group() -> None:
    assert _qw(g_idx=(np.arange(64) // 32).astype(np.int32)).g_idx is None
    g_idx = (np.arange(64) % 2).astype(np.int32)
    codes = np.tile(np.arange(64, dtype=np.uint8) % 16, (4, 1))
    qw = _qw(codes=codes, scales=np.array([[1.0, 2.0]] * 4, np.float32), g_idx=g_idx)
    assert qw.act_order
    expect = np.where(g_idx == 0, 1.0, 2.0) * (codes.astype(np.float32) - 8)
    assert np.array_equal(qw.dequantize().numpy(), expect)
