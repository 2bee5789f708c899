"""Packed layouts the backends store, stated by the registered formats: MLX's tensor shapes
(`MLX.packed_shapes`, read by backends/mlx/weights.py) and TVM's int4 words (`tvm-q4`, written by
backends/tvm/weights.py). The generic round trip, sizes and refusals of every registered format
are tests/quant/test_quant_formats_roundtrip.py and tests/test_latency_storage.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from arkinfer.quant import QuantizedWeight, quantize_rtn
from arkinfer.quant.formats import FormatError, get_format
from arkinfer.quant.formats.mlx import MLX
from arkinfer.quant.formats.scale_storage import exact_scale_dtype
from arkinfer.quant.formats.tvm_q4 import TVM_Q4
from arkinfer.testing.synthetic import random_q4_weight

LAYER = "model.layers.0.mlp.up_proj"


@pytest.mark.parametrize("bits", MLX.constraints.bits)
@pytest.mark.parametrize("group", MLX.constraints.group_sizes)
def test_mlx_packed_shapes_are_what_pack_writes(bits: int, group: int) -> None:
    torch.manual_seed(bits)
    qw = quantize_rtn(torch.randn(24, 256), bits, group, False, scale_dtype=torch.float16)
    packed = MLX.pack(qw)
    assert {k: a.shape for k, a in packed.items()} == MLX.packed_shapes(24, 256, bits=bits,
                                                                        group_size=group)
    assert packed["weight"].dtype == np.uint32


def test_mlx_packed_shapes_cover_widths_the_format_does_not_write() -> None:
    """mlx-lm's 5- and 6-bit folders are read with the same rule (K*bits/32 words per row)."""
    assert MLX.packed_shapes(8, 128, bits=6, group_size=64) == {
        "weight": (8, 24), "scales": (8, 2), "biases": (8, 2)}
    assert MLX.shape_refusal(8, 100, bits=5, group_size=32) is not None


@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
def test_tvm_q4_words_are_mlx_4bit_words(sym: bool) -> None:
    """Column 8w+i of row n sits in bits 4i..4i+3 of word w: the words MLX's 4-bit `weight`
    holds for the same codes; zero points are stored only for asymmetric weights."""
    qw = random_q4_weight(16, 64, 32, sym)
    packed = TVM_Q4.pack(qw)
    assert packed["q4_codes"].dtype == np.uint32 and packed["q4_codes"].shape == (16, 8)
    codes = qw.codes.numpy()
    assert (packed["q4_codes"][5, 3] >> 8) & 15 == codes[5, 8 * 3 + 2]
    assert np.array_equal(packed["q4_codes"], MLX.pack(qw)["weight"])
    assert packed["q4_scales"].dtype == np.float16 and packed["q4_scales"].shape == (16, 2)
    assert ("q4_zeros" in packed) == (not sym)
    assert sum(a.nbytes for a in packed.values()) == TVM_Q4.nbytes(16, 64, bits=4, group_size=32,
                                                                   sym=sym)
    assert TVM_Q4.unpack(packed, 16, 64, group_size=32, sym=sym).equals(qw)
    assert np.array_equal(TVM_Q4.dequantize(packed, 16, 64, group_size=32),
                          qw.dequantize().numpy())


def test_tvm_q4_keeps_scales_fp16_cannot_hold_in_fp32() -> None:
    qw = random_q4_weight(8, 32, 32, True)
    assert exact_scale_dtype(qw.scales.numpy()) == "float16"
    wide = QuantizedWeight(qw.codes, qw.scales + 1e-6, qw.zeros, bits=4, group_size=32, sym=True,
                           name=LAYER)
    assert exact_scale_dtype(wide.scales.numpy()) == "float32"
    with pytest.raises(FormatError, match=r"'tvm-q4' cannot store .*not exactly representable"):
        TVM_Q4.pack(wide)
    packed = TVM_Q4.pack(wide, "float32")
    assert packed["q4_scales"].dtype == np.float32
    assert sum(a.nbytes for a in packed.values()) == TVM_Q4.nbytes(
        8, 32, bits=4, group_size=32, sym=True, scale_dtype="float32")
    assert TVM_Q4.unpack(packed, 8, 32, group_size=32).equals(wide)
    with pytest.raises(FormatError, match=r"scale_dtype='bfloat16'"):
        TVM_Q4.pack(qw, "bfloat16")  # type: ignore[arg-type]


def test_tvm_q4_groups_hold_whole_words() -> None:
    assert get_format("tvm-q4") is TVM_Q4
    assert TVM_Q4.shape_refusal(8, 96, bits=4, group_size=12) == \
        "group_size=12 is not a multiple of 8"
    assert TVM_Q4.shape_refusal(8, 100, bits=4, group_size=-1) == \
        "in_features=100 is not a multiple of 8"
    assert TVM_Q4.shape_refusal(8, 96, bits=4, group_size=-1) is None
    qw = random_q4_weight(8, 96, 12, True)
    with pytest.raises(FormatError, match=r"group_size=12 is not a multiple of 8"):
        TVM_Q4.pack(qw)
    with pytest.raises(FormatError, match=r"bits=8 is not supported"):
        TVM_Q4.pack(quantize_rtn(torch.randn(8, 64), 8, 32, True, scale_dtype=torch.float16))
