"""ONNX `DequantizeLinear` (opset 21) blocked along the input dim, feeding `MatMul(x, W)`.

MatMul's constant is W in ONNX orientation [K, N] = [in, out] (the canonical codes transposed):

    weight:     [K, N] codes     4-bit: packed two per byte, first element in the low nibble, the
                                 tensor flattened row-major (ONNX INT4/UINT4 raw_data), uint8
                                 [ceil(K*N/2)]; 8-bit: int8 / uint8 [K, N]
    scale:      float32 [K/block, N]
    zero_point: [K/block, N], same element type as weight (4-bit packed the same way); written
                only when sym=False
    attributes: axis=0, block_size=group_size

Symmetric weights are stored signed without a zero point (INT4 code - 8 / INT8 code - 128),
asymmetric ones unsigned with zero points (UINT4 / UINT8), as ORT's `matmul_nbits_quantizer`
does in QDQ mode. `config(qw)["dtype"]` names the ONNX element type for the TensorProto.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..weight import QuantizedWeight
from .base import Constraints, Format, FormatError, expect_shape, n_groups, require
from .registry import register


def pack_int4(values: np.ndarray) -> np.ndarray:
    """Any-shape 4-bit values (nibbles 0..15) -> uint8 [ceil(size/2)], first in the low nibble."""
    flat = np.asarray(values, np.uint8).reshape(-1) & np.uint8(0xF)
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return flat[0::2] | (flat[1::2] << np.uint8(4))


def unpack_int4(packed: np.ndarray, count: int) -> np.ndarray:
    """uint8 [ceil(count/2)] -> nibbles uint8 [count]."""
    p = np.asarray(packed, np.uint8).reshape(-1)
    return np.stack([p & np.uint8(0xF), p >> np.uint8(4)], axis=1).reshape(-1)[:count]


class OnnxQDQFormat(Format):
    name = "onnx-qdq"
    constraints = Constraints(
        bits=(4, 8), group_sizes=(16, 32, 64, 128, 256), sym=(True, False), act_order=False,
        scale_dtype="float32", notes="opset 21 blocked DequantizeLinear, axis 0 of W [K, N]",
    )

    def nbytes(self, out_features: int, in_features: int, *, bits: int, group_size: int,
               sym: bool) -> int:
        """codes ceil(N·K·b/8) + fp32 scales ng·N + zero points ceil(ng·N·b/8) when asymmetric."""
        n, k, ng = out_features, in_features, n_groups(in_features, group_size)
        zeros = 0 if sym else -(-ng * n * bits // 8)
        return -(-n * k * bits // 8) + 4 * ng * n + zeros

    def pack(self, qw: QuantizedWeight) -> dict[str, np.ndarray]:
        self.check(qw)
        a, bits = qw.numpy(), qw.bits
        codes = a["codes"].T  # [K, N]
        mid = 1 << (bits - 1)
        out: dict[str, np.ndarray] = {"scale": np.ascontiguousarray(a["scales"].T)}
        if bits == 4:
            out["weight"] = pack_int4(codes ^ np.uint8(mid) if qw.sym else codes)
            if not qw.sym:
                out["zero_point"] = pack_int4(a["zeros"].T.astype(np.uint8))
        else:
            out["weight"] = np.ascontiguousarray(
                (codes.astype(np.int16) - mid).astype(np.int8) if qw.sym else codes)
            if not qw.sym:
                out["zero_point"] = np.ascontiguousarray(a["zeros"].T.astype(np.uint8))
        return out

    def unpack(self, tensors: Mapping[str, np.ndarray], out_features: int, in_features: int, *,
               bits: int = 4, group_size: int = 128, sym: bool = True) -> QuantizedWeight:
        n, k = out_features, in_features
        if bits not in self.constraints.bits:
            raise FormatError(f"onnx-qdq: bits={bits} not in {self.constraints.bits}",
                              "read bits from the weight's element type")
        groups, mid = k // group_size, 1 << (bits - 1)
        scale = expect_shape(require(tensors, "scale", self.name), (groups, n), "scale", self.name)
        weight = require(tensors, "weight", self.name)
        if bits == 4:
            codes = unpack_int4(weight, k * n).reshape(k, n)
            codes = codes ^ np.uint8(mid) if sym else codes
        else:
            weight = expect_shape(weight, (k, n), "weight", self.name)
            codes = (weight.astype(np.int16) + mid).astype(np.uint8) if sym else weight
        if sym:
            zeros = np.full((groups, n), mid, np.int32)
        else:
            zp = require(tensors, "zero_point", self.name)
            zeros = (unpack_int4(zp, groups * n) if bits == 4 else zp).reshape(groups, n)
        return QuantizedWeight(codes=codes.T, scales=scale.astype(np.float32).T,
                               zeros=zeros.astype(np.int32).T, bits=bits,
                               group_size=group_size, sym=sym)

    def config(self, qw: QuantizedWeight) -> dict:
        dtype = ("int" if qw.sym else "uint") + str(qw.bits)
        return {"axis": 0, "block_size": qw.group_size, "dtype": dtype,
                "dims": [qw.in_features, qw.out_features]}


ONNX_QDQ = register(OnnxQDQFormat())
