"""ONNX Runtime `com.microsoft.MatMulNBits` initialisers (ContribOperators.md; the layout ORT's
own `matmul_nbits_quantizer` writes). N = out_features, K = in_features, block = group_size:

    B:           uint8 [N, K/block, block*bits/8]   codes along K, low bits first in each byte
    scales:      float32 [N * K/block]               (row n's blocks are contiguous)
    zero_points: uint8 [N * ceil((K/block)*bits/8)]  packed like B, each row padded to a whole
                                                     byte; written only when sym=False (absent,
                                                     the runtime uses 2^(bits-1))

Attributes (`config`): K, N, bits, block_size. Scales are float32 here (lossless); a float16
graph casts them, which needs fp16-exact scales. No g_idx (the input is deprecated).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..weight import QuantizedWeight
from .base import Constraints, Format, FormatError, n_groups, require
from .bitpack import pack_bits, unpack_bits
from .registry import register


def _zp_row_bytes(k_blocks: int, bits: int) -> int:
    return -(-k_blocks * bits // 8)


class OrtFormat(Format):
    name = "ort"
    constraints = Constraints(
        bits=(2, 4, 8), group_sizes=(16, 32, 64, 128, 256), sym=(True, False), act_order=False,
        scale_dtype="float32", notes="block_size a power of two >= 16",
    )

    def nbytes(self, out_features: int, in_features: int, *, bits: int, group_size: int,
               sym: bool) -> int:
        """codes N·K·b/8 + fp32 scales ng·N + packed uint8 zero points N·ceil(ng·b/8) when
        asymmetric."""
        n, k, ng = out_features, in_features, n_groups(in_features, group_size)
        zeros = 0 if sym else n * -(-ng * bits // 8)
        return n * k * bits // 8 + 4 * ng * n + zeros

    def pack(self, qw: QuantizedWeight) -> dict[str, np.ndarray]:
        self.check(qw)
        a, n, k, bits = qw.numpy(), qw.out_features, qw.in_features, qw.bits
        blocks = k // qw.group_size
        b = pack_bits(a["codes"].reshape(n, blocks, qw.group_size), bits, 8, axis=-1)
        out = {"B": b, "scales": a["scales"].reshape(-1).astype(np.float32)}
        if not qw.sym:
            per_byte = 8 // bits
            padded = np.zeros((n, -(-blocks // per_byte) * per_byte), np.uint8)
            padded[:, :blocks] = a["zeros"]
            out["zero_points"] = pack_bits(padded, bits, 8, axis=1).reshape(-1)
        return out

    def unpack(self, tensors: Mapping[str, np.ndarray], out_features: int, in_features: int, *,
               bits: int = 4, group_size: int = 128, sym: bool = False) -> QuantizedWeight:
        n, k = out_features, in_features
        blocks = k // group_size
        b = require(tensors, "B", self.name)
        if b.shape != (n, blocks, group_size * bits // 8):
            raise FormatError(f"ort: B has shape {b.shape}; expected "
                              f"{(n, blocks, group_size * bits // 8)}", "check K, N, block_size")
        scales = require(tensors, "scales", self.name).astype(np.float32).reshape(n, blocks)
        codes = unpack_bits(b, bits, group_size, axis=-1).reshape(n, k)
        if "zero_points" in tensors:
            zp = np.asarray(tensors["zero_points"]).reshape(n, _zp_row_bytes(blocks, bits))
            zeros = unpack_bits(zp, bits, blocks, axis=1).astype(np.int32)
        else:
            zeros = np.full((n, blocks), 1 << (bits - 1), np.int32)
        return QuantizedWeight(codes=codes, scales=scales, zeros=zeros, bits=bits,
                               group_size=group_size, sym=sym)

    def config(self, qw: QuantizedWeight) -> dict:
        return {"K": qw.in_features, "N": qw.out_features, "bits": qw.bits,
                "block_size": qw.group_size}


ORT = register(OrtFormat())
