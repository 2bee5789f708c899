"""AWQ GEMM checkpoint (AutoAWQ `WQLinear_GEMM`, what vLLM's awq / awq_marlin load).

    qweight: int32 [in, out/8]          packed along the OUTPUT dim; nibble slot i of word c
                                        holds output column 8c + AWQ_ORDER[i],
                                        AWQ_ORDER = [0,2,4,6,1,3,5,7]
    qzeros:  int32 [in/group, out/8]    zero points as-is, same packing
    scales:  fp16  [in/group, out]

4-bit only, no g_idx (act-order is not representable). group_size -1 means one group of
in_features (AutoAWQ's convention).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..weight import QuantizedWeight
from .base import Constraints, Format, expect_shape, n_groups, require
from .registry import register

AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])
_SHIFTS = np.arange(8, dtype=np.uint32) * 4


def _pack_awq(values: np.ndarray) -> np.ndarray:
    """uint8 [rows, out] (values < 16) -> int32 [rows, out/8] in AWQ nibble order."""
    rows, out = values.shape
    v = values.astype(np.uint32).reshape(rows, out // 8, 8)[..., AWQ_ORDER]
    return (v << _SHIFTS).sum(axis=-1, dtype=np.uint32).view(np.int32)


def _unpack_awq(words: np.ndarray) -> np.ndarray:
    """int32 [rows, out/8] -> uint8 [rows, out]."""
    w = words.view(np.uint32)
    slots = (w[..., None] >> _SHIFTS) & np.uint32(0xF)
    out = np.empty_like(slots)
    out[..., AWQ_ORDER] = slots
    return out.reshape(w.shape[0], -1).astype(np.uint8)


class AWQFormat(Format):
    name = "awq"
    constraints = Constraints(
        bits=(4,), group_sizes=(-1, 32, 64, 128), sym=(True, False), act_order=False,
        out_multiple=8, scale_dtype="float16",
        notes="AutoAWQ GEMM; zero points stored as-is (a symmetric weight stores 8)",
    )

    def nbytes(self, out_features: int, in_features: int, *, bits: int, group_size: int,
               sym: bool) -> int:
        """codes N·K·b/8 + qzeros ng·N·b/8 (written even when symmetric) + fp16 scales ng·N."""
        n, k, ng = out_features, in_features, n_groups(in_features, group_size)
        return n * k * bits // 8 + ng * n * bits // 8 + 2 * ng * n

    def pack(self, qw: QuantizedWeight) -> dict[str, np.ndarray]:
        self.check(qw)
        a = qw.numpy()
        return {"qweight": _pack_awq(a["codes"].T), "qzeros": _pack_awq(a["zeros"].T),
                "scales": a["scales"].T.astype(np.float16)}

    def unpack(self, tensors: Mapping[str, np.ndarray], out_features: int, in_features: int, *,
               bits: int = 4, group_size: int = 128, sym: bool = False) -> QuantizedWeight:
        groups = n_groups(in_features, group_size)
        qweight = expect_shape(require(tensors, "qweight", self.name),
                               (in_features, out_features // 8), "qweight", self.name)
        qzeros = expect_shape(require(tensors, "qzeros", self.name),
                              (groups, out_features // 8), "qzeros", self.name)
        scales = expect_shape(require(tensors, "scales", self.name), (groups, out_features),
                              "scales", self.name)
        return QuantizedWeight(codes=_unpack_awq(qweight).T,
                               scales=scales.astype(np.float32).T,
                               zeros=_unpack_awq(qzeros).astype(np.int32).T, bits=4,
                               group_size=group_size, sym=sym)

    def config(self, qw: QuantizedWeight) -> dict:
        return {"quant_method": "awq", "bits": 4, "group_size": qw.group_size,
                "zero_point": True, "version": "gemm"}  # qzeros are always written


AWQ = register(AWQFormat())
