"""quant/formats/mlx.py against real MLX (`mlx[cpu]` runs on Linux): packing, group sizes, the
exact fp32 repack of GPTQ / AWQ codes, and the fp16 double rounding it avoids."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from arkinfer.quant import QuantizedWeight, quantize_rtn
from arkinfer.quant.formats import FormatError, get_format
from arkinfer.quant.formats.bitpack import unpack_bits

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'arkinfer[mlx]')")

MLX = get_format("mlx")


def _gptq_like(out: int, inp: int, bits: int, group: int, sym: bool, seed: int = 0
               ) -> QuantizedWeight:
    """Random codes with fp16-exact scales, as GPTQ / AWQ folders hold them (sym: zero 2^(b-1))."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 1 << bits, (out, inp))
    scales = (rng.random((out, inp // group)) * 0.05 + 1e-3).astype(np.float16).astype(np.float32)
    zeros = (np.full(scales.shape, 1 << (bits - 1)) if sym
             else rng.integers(0, 1 << bits, scales.shape))
    return QuantizedWeight(codes=codes, scales=scales, zeros=zeros, bits=bits, group_size=group,
                           sym=sym)


def _mx_dequantize(t: dict[str, np.ndarray], bits: int, group: int) -> np.ndarray:
    out = mx.dequantize(mx.array(t["weight"]), mx.array(t["scales"]), mx.array(t["biases"]),
                        group_size=group, bits=bits)
    return np.array(out.astype(mx.float32))


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_pack_bits_is_mx_quantize_layout(bits: int) -> None:
    """mx.quantize's uint32 words are ArkInfer's little-endian bit stream (LSB first)."""
    w = mx.random.normal((16, 256), key=mx.random.key(bits))
    q, s, b = mx.quantize(w, group_size=64, bits=bits)
    codes = unpack_bits(np.array(q), bits, 256, axis=1)
    qw = QuantizedWeight(codes=codes, scales=np.ones((16, 4), np.float32),
                         zeros=np.zeros((16, 4), np.int32), bits=bits, group_size=64, sym=False)
    assert np.array_equal(MLX.pack(qw)["weight"], np.array(q))
    expect = np.array(s).repeat(64, 1) * codes + np.array(b).repeat(64, 1)
    assert np.allclose(np.array(mx.dequantize(q, s, b, group_size=64, bits=bits)), expect,
                       atol=1e-6)


def test_group_sizes_are_mlx_affine_modes() -> None:
    """The format's group sizes are exactly the ones mx.quantize accepts."""
    w = mx.random.normal((4, 512))
    accepted = []
    for group in (16, 32, 64, 128, 256):
        try:
            mx.quantize(w, group_size=group, bits=4)
            accepted.append(group)
        except ValueError:
            pass
    assert tuple(accepted) == MLX.constraints.group_sizes


@pytest.mark.parametrize("bits,sym", [(4, True), (4, False), (8, True), (3, False), (2, True)])
def test_float32_pack_dequantises_exactly(bits: int, sym: bool) -> None:
    """GPTQ / AWQ codes in fp32 MLX affine: mx.dequantize == scale * (q - zero), bit for bit."""
    qw = _gptq_like(64, 256, bits, 64, sym)
    t = MLX.pack(qw, scale_dtype="float32")
    assert t["scales"].dtype == np.float32 and t["biases"].dtype == np.float32
    assert np.array_equal(_mx_dequantize(t, bits, 64), qw.dequantize().numpy())
    back = MLX.unpack(t, 64, 256, bits=bits, group_size=64, sym=sym)
    assert back.equals(qw)


def test_float16_pack_rounds_twice_in_mlx() -> None:
    """Why the calibrated path stores fp32: with fp16 scales and biases MLX's result is rounded
    (round16(round16(s*q) + b)), so most values differ from the canonical ones."""
    qw = _gptq_like(64, 256, 4, 64, sym=True)
    t = MLX.pack(qw)
    exact = qw.dequantize().numpy()
    got = _mx_dequantize(t, 4, 64)
    assert not np.array_equal(got, exact)
    assert np.abs(got - exact).max() <= np.abs(exact).max() * 2.0 ** -10


def test_quantized_matmul_on_float32_pack() -> None:
    qw = _gptq_like(96, 128, 4, 32, sym=False)
    t = MLX.pack(qw, scale_dtype="float32")
    x = np.random.default_rng(1).standard_normal((3, 128)).astype(np.float32)
    y = mx.quantized_matmul(mx.array(x), mx.array(t["weight"]), mx.array(t["scales"]),
                            mx.array(t["biases"]), transpose=True, group_size=32, bits=4)
    assert np.allclose(np.array(y), x @ qw.dequantize().numpy().T, atol=1e-4)


def test_dequantize_reads_mx_quantize_output_unpack_refuses_it() -> None:
    """mx.quantize's biases are group minima: no canonical zero point (unpack refuses), but
    `dequantize` (MLX's formula, the reference weights of an RTN artifact) reads them."""
    w = mx.random.normal((8, 128), key=mx.random.key(3)).astype(mx.float16)
    q, s, b = mx.quantize(w, group_size=64, bits=4)
    t = {"weight": np.array(q), "scales": np.array(s), "biases": np.array(b)}
    ours = MLX.dequantize(t, 8, 128, bits=4, group_size=64)
    theirs = np.array(mx.dequantize(q, s, b, group_size=64, bits=4).astype(mx.float32))
    assert np.abs(ours - theirs).max() <= np.abs(theirs).max() * 2.0 ** -10
    with pytest.raises(FormatError, match="no canonical form"):
        MLX.unpack(t, 8, 128, bits=4, group_size=64)


@pytest.mark.parametrize("scale_dtype", ["float16", "float32"])
def test_nbytes_is_what_pack_writes(scale_dtype: str) -> None:
    qw = quantize_rtn(torch.randn(48, 256), 4, 64, False, scale_dtype=torch.float16)
    packed = MLX.pack(qw, scale_dtype=scale_dtype)
    assert sum(a.nbytes for a in packed.values()) == MLX.nbytes(
        48, 256, bits=4, group_size=64, sym=False, scale_dtype=scale_dtype)


def test_bad_scale_dtype_is_refused() -> None:
    qw = _gptq_like(8, 64, 4, 32, sym=True)
    with pytest.raises(FormatError, match="scale_dtype='bfloat16'"):
        MLX.pack(qw, scale_dtype="bfloat16")
