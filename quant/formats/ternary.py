"""ArkInfer's own ternary layout (`ternary`): any shape, any group size; for the reference
backend and for models whose rows are not multiples of GGUF TQ's 256-column blocks.

    weight: uint8 [out, in/4]     trits + 1 (0, 1, 2), four per byte, value i at bits 2i
    scales: fp16  [out, groups]   w = scale * (code - 1)

Not a runtime layout of any third-party engine: the exporter writes it with
`quant_method: "arkinfer"`, and `quant.load` unpacks it for the reference model.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..weight import Kind, QuantizedWeight
from .base import Constraints, Format, expect_shape, n_groups, require
from .bitpack import pack_bits, unpack_bits
from .registry import register


class TernaryFormat(Format):
    name = "ternary"
    constraints = Constraints(
        bits=(2,), group_sizes=None, sym=(True,), act_order=False, kinds=(Kind.TERNARY,),
        in_word_bits=8, scale_dtype="float16",
        notes="ArkInfer-only layout: 2-bit packed trits + fp16 scale per group",
    )

    def nbytes(self, out_features: int, in_features: int, *, bits: int, group_size: int,
               sym: bool) -> int:
        """2-bit codes N·K/4 + fp16 scales per group and row (no zero points)."""
        ng = n_groups(in_features, group_size)
        return out_features * in_features * 2 // 8 + 2 * ng * out_features

    def pack(self, qw: QuantizedWeight) -> dict[str, np.ndarray]:
        self.check(qw)
        a = qw.numpy()
        return {"weight": pack_bits(a["codes"], 2, 8, axis=1).astype(np.uint8),
                "scales": a["scales"].astype(np.float16)}

    def unpack(self, tensors: Mapping[str, np.ndarray], out_features: int, in_features: int, *,
               bits: int = 2, group_size: int = -1, sym: bool = True) -> QuantizedWeight:
        weight = expect_shape(require(tensors, "weight", self.name),
                              (out_features, in_features // 4), "weight", self.name)
        groups = n_groups(in_features, group_size)
        scales = expect_shape(require(tensors, "scales", self.name), (out_features, groups),
                              "scales", self.name).astype(np.float32)
        codes = unpack_bits(weight.view(np.uint8), 2, in_features, axis=1)
        return QuantizedWeight(codes=codes, scales=scales,
                               zeros=np.ones((out_features, groups), np.int32), bits=2,
                               group_size=group_size, sym=True, kind=Kind.TERNARY)


TERNARY = register(TernaryFormat())
