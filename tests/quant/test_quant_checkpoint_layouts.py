"""Packed layouts against loop transcriptions of the upstream packers / documented layouts:
AutoGPTQ v1 `QuantLinear.pack` (incl. 3-bit across int32 words), AutoAWQ `WQLinear_GEMM`,
ONNX Runtime MatMulNBits, ONNX INT4 raw data, MLX affine."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from arkinfer.quant import QuantizedWeight, quantize_rtn
from arkinfer.quant.formats import get_format


def autogptq_pack(intweight: np.ndarray, zeros: np.ndarray, bits: int):
    """AutoGPTQ v1: intweight uint32 [in, out], zeros [groups, out] -> (qweight, qzeros)."""
    def pack_rows(src: np.ndarray, out_rows: int) -> np.ndarray:
        q = np.zeros((out_rows, src.shape[1]), dtype=np.uint32)
        i = row = 0
        while row < out_rows:
            if bits in (2, 4, 8):
                for j in range(i, i + 32 // bits):
                    q[row] |= src[j] << (bits * (j - i))
                i += 32 // bits
                row += 1
            else:  # bits == 3: 32 values in 3 words
                for j in range(i, i + 10):
                    q[row] |= src[j] << (3 * (j - i))
                i += 10
                q[row] |= src[i] << 30
                row += 1
                q[row] |= (src[i] >> 2) & 1
                i += 1
                for j in range(i, i + 10):
                    q[row] |= src[j] << (3 * (j - i) + 1)
                i += 10
                q[row] |= src[i] << 31
                row += 1
                q[row] |= (src[i] >> 1) & 0x3
                i += 1
                for j in range(i, i + 10):
                    q[row] |= src[j] << (3 * (j - i) + 2)
                i += 10
                row += 1
        return q

    qweight = pack_rows(intweight.astype(np.uint32), intweight.shape[0] // 32 * bits)
    z = (zeros - 1).astype(np.uint32)  # v1 stores zero - 1 (zero >= 1 here)
    qzeros = pack_rows(z.T.copy(), zeros.shape[1] // 32 * bits).T
    return qweight.astype(np.int32), np.ascontiguousarray(qzeros).astype(np.int32)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_gptq_matches_autogptq_pack(bits: int) -> None:
    torch.manual_seed(bits)
    qw = quantize_rtn(torch.randn(64, 256), bits, 64, False, scale_dtype=torch.float16)
    qw = QuantizedWeight(qw.codes, qw.scales, qw.zeros.clamp_min(1), bits, 64, False)
    qweight, qzeros = autogptq_pack(qw.codes.numpy().T.copy(), qw.zeros.numpy().T.copy(), bits)
    ours = get_format("gptq").pack(qw)
    assert np.array_equal(ours["qweight"], qweight)
    assert np.array_equal(ours["qzeros"], qzeros)
    assert np.array_equal(ours["scales"], qw.scales.numpy().T.astype(np.float16))
    assert np.array_equal(ours["g_idx"], np.arange(256) // 64)


def autoawq_pack(intweight: np.ndarray) -> np.ndarray:
    """AutoAWQ WQLinear_GEMM.from_linear: intweight [rows, out] -> int32 [rows, out/8]."""
    order_map = [0, 2, 4, 6, 1, 3, 5, 7]
    q = np.zeros((intweight.shape[0], intweight.shape[1] // 8), dtype=np.uint32)
    for col in range(intweight.shape[1] // 8):
        for i in range(8):
            q[:, col] |= intweight[:, col * 8 + order_map[i]].astype(np.uint32) << (i * 4)
    return q.astype(np.int32)


def test_awq_matches_autoawq_pack() -> None:
    torch.manual_seed(7)
    qw = quantize_rtn(torch.randn(64, 256), 4, 128, False, scale_dtype=torch.float16)
    ours = get_format("awq").pack(qw)
    assert np.array_equal(ours["qweight"], autoawq_pack(qw.codes.numpy().T))
    assert np.array_equal(ours["qzeros"], autoawq_pack(qw.zeros.numpy().T))
    assert ours["scales"].shape == (2, 64)


def test_ort_matmulnbits_layout() -> None:
    torch.manual_seed(8)
    n, k, block = 8, 96, 32  # 3 blocks per row: zero points padded to 2 bytes per row
    qw = quantize_rtn(torch.randn(n, k), 4, block, False)
    ours = get_format("ort").pack(qw)
    codes, zeros = qw.codes.numpy(), qw.zeros.numpy()
    b = np.zeros((n, k // block, block // 2), np.uint8)
    zp = np.zeros(n * 2, np.uint8)
    for row in range(n):
        for blk in range(k // block):
            for j in range(block // 2):
                lo, hi = codes[row, blk * block + 2 * j], codes[row, blk * block + 2 * j + 1]
                b[row, blk, j] = lo | (hi << 4)
            zp[row * 2 + blk // 2] |= zeros[row, blk] << (4 * (blk % 2))
    assert np.array_equal(ours["B"], b)
    assert np.array_equal(ours["zero_points"], zp)
    assert np.array_equal(ours["scales"], qw.scales.numpy().reshape(-1))
    assert get_format("ort").config(qw) == {"K": k, "N": n, "bits": 4, "block_size": block}
    assert "zero_points" not in get_format("ort").pack(quantize_rtn(torch.randn(n, k), 4, 32))


@pytest.mark.parametrize("sym", [True, False])
def test_onnx_int4_raw_data(sym: bool) -> None:
    torch.manual_seed(9)
    n, k = 3, 32  # K*N odd multiple of 16: 96 values -> 48 bytes
    qw = quantize_rtn(torch.randn(n, k), 4, 16, sym)
    ours = get_format("onnx-qdq").pack(qw)
    kn = qw.codes.numpy().T.astype(np.int16).reshape(-1)
    values = kn - 8 if sym else kn  # INT4 (two's complement) when symmetric, UINT4 otherwise
    expect = [(int(values[2 * i]) & 0xF) | ((int(values[2 * i + 1]) & 0xF) << 4)
              for i in range(values.size // 2)]
    assert ours["weight"].tolist() == expect
    assert ours["scale"].shape == (2, 3)
    assert ("zero_point" in ours) is (not sym)
    assert get_format("onnx-qdq").config(qw)["dtype"] == ("int4" if sym else "uint4")


def test_mlx_affine_layout() -> None:
    torch.manual_seed(10)
    qw = quantize_rtn(torch.randn(4, 64), 4, 32, False, scale_dtype=torch.float16)
    ours = get_format("mlx").pack(qw)
    codes = qw.codes.numpy()
    words = np.zeros((4, 8), np.uint32)
    for r in range(4):
        for i in range(64):
            words[r, i // 8] |= np.uint32(codes[r, i]) << np.uint32(4 * (i % 8))
    assert np.array_equal(ours["weight"], words)
    scale, zero = qw.scales.numpy(), qw.zeros.numpy()
    assert np.array_equal(ours["biases"], (-scale * zero).astype(np.float16))
    native = get_format("mlx").dequantize(ours, 4, 64, bits=4, group_size=32)
    per = np.repeat([0, 1], 32)
    expect = ours["scales"].astype(np.float32)[:, per] * codes + ours["biases"].astype(
        np.float32)[:, per]
    assert np.array_equal(native, expect)
    assert get_format("mlx").config(qw) == {"quantization": {"group_size": 32, "bits": 4}}
