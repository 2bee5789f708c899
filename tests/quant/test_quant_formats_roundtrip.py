"""Every registered storage format: pack -> unpack is the identity on canonical weights.

Cases are drawn from each format's own constraint data (bits, group sizes, sym, act-order, shape
steps), so a new format is covered by registering it. Codes, scales, zeros and g_idx must come
back bit-exact and the dequantised values equal; the format's native dequantisation (what the
runtime computes) equals the canonical one bit for bit, except MLX and GGUF Q4_1 whose bias
`fp16(-scale * zero)` is rounded (bounded here by half an fp16 ulp).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from arkinfer.quant import Kind, QuantizedWeight, quantize_rtn, quantize_ternary
from arkinfer.quant.formats import Format, all_formats
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FORMATS = all_formats()
ROUNDED_BIAS = {"mlx", "gguf-q4_1", "gguf-q5_1"}  # native value = scale*q + fp16(-scale*zero)


def _group_choices(fmt: Format) -> list[int]:
    c = fmt.constraints
    return list(c.group_sizes) if c.group_sizes is not None else [-1, 32, 64, 128, 256]


@st.composite
def canonical_weights(draw: st.DrawFn, fmt: Format) -> QuantizedWeight:
    """A random canonical weight the format can represent, drawn from its constraints."""
    c = fmt.constraints
    kind = draw(st.sampled_from(c.kinds))
    bits = draw(st.sampled_from(c.bits))
    group = draw(st.sampled_from(_group_choices(fmt)))
    sym = True if kind is Kind.TERNARY else draw(st.sampled_from(c.sym))
    step_in, step_out = c.in_step(bits, group), c.out_step(bits)
    inp = step_in * draw(st.integers(1, max(1, 512 // step_in)))
    out = step_out * draw(st.integers(1, max(1, 96 // step_out)))
    if kind is Kind.TERNARY and c.shared_scale_block:
        group = draw(st.sampled_from([-1] + [g for g in (256, 512) if inp % g == 0]))
    n_groups = 1 if group == -1 else inp // group
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    maxq = 2 if kind is Kind.TERNARY else (1 << bits) - 1
    codes = rng.integers(0, maxq + 1, (out, inp), dtype=np.uint8)
    scales = rng.uniform(1e-3, 0.5, (out, n_groups)).astype(np.float32)
    if c.scale_dtype == "float16":
        scales = scales.astype(np.float16).astype(np.float32)
    if kind is Kind.TERNARY:
        zeros = np.ones((out, n_groups), np.int32)
    elif sym:
        zeros = np.full((out, n_groups), 1 << (bits - 1), np.int32)
    else:
        zeros = rng.integers(max(c.min_zero, 0), maxq + 1, (out, n_groups)).astype(np.int32)
    mins = None
    if c.float_mins:  # K-quants: value = scale*code - min, zeros unused
        mins = rng.uniform(0, 2, (out, n_groups)).astype(np.float32)
        zeros = np.zeros((out, n_groups), np.int32)
    scales, mins = fmt.snap_params(scales, mins)  # representable (identity for most formats)
    g_idx = None
    if c.act_order and group != -1 and n_groups > 1 and draw(st.booleans()):
        g_idx = (np.arange(inp) // group)[rng.permutation(inp)].astype(np.int32)
    levels = None if c.levels is None else np.asarray(c.levels, np.float32)  # codebook (IQ4_NL)
    return QuantizedWeight(codes, scales, zeros, bits, group, sym, g_idx, kind, mins=mins,
                           levels=levels)


def _roundtrip(fmt: Format, qw: QuantizedWeight) -> None:
    fmt.check(qw, "layer")
    tensors = fmt.pack(qw)
    assert all(isinstance(v, np.ndarray) for v in tensors.values())
    params = {"bits": qw.bits, "group_size": qw.group_size, "sym": qw.sym}
    back = fmt.unpack(tensors, qw.out_features, qw.in_features, **params)
    assert back.equals(qw), f"{fmt.name}: {back} != {qw}"
    ref = qw.dequantize()
    assert torch.equal(back.dequantize(), ref)
    native = fmt.dequantize(tensors, qw.out_features, qw.in_features, **params)
    if fmt.name in ROUNDED_BIAS:
        bias = (qw.scales * qw.zeros.float())[:, qw.group_index()]
        tol = np.abs(bias.numpy()) * 2.0**-11 + 1e-7
        assert (np.abs(native - ref.numpy()) <= tol).all()
    else:
        assert np.array_equal(native, ref.numpy()), f"{fmt.name}: native dequantisation differs"


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_roundtrip_property(fmt: Format, data: st.DataObject) -> None:
    _roundtrip(fmt, data.draw(canonical_weights(fmt)))


def _realistic(fmt: Format) -> QuantizedWeight:
    """A weight from the real quantisers with the format's first allowed settings."""
    c = fmt.constraints
    torch.manual_seed(0)
    if Kind.TERNARY in c.kinds:
        return quantize_ternary(torch.randn(64, 512), "row", scale_dtype=torch.float16)
    bits, sym = c.bits[-1 if 4 not in c.bits else c.bits.index(4)], c.sym[-1]
    group = 128 if c.group_sizes is None or 128 in c.group_sizes else c.group_sizes[0]
    w = torch.randn(128, 512) * 0.02
    dtype = torch.float16 if c.scale_dtype == "float16" else None
    return quantize_rtn(w, bits, group, sym, scale_dtype=dtype, name="model.layers.0.mlp.up_proj",
                        fmt=fmt)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_roundtrip_realistic(fmt: Format) -> None:
    qw = _realistic(fmt)
    _roundtrip(fmt, qw)
    assert isinstance(fmt.config(qw), dict)
