"""GPTQ checkpoint, AutoGPTQ / GPTQModel "gptq" v1 layout (what vLLM / SGLang / exllama load).

    qweight: int32 [in*bits/32, out]    codes packed along the input dim, first value in the low
                                        bits; 3-bit values run across int32 boundaries (AutoGPTQ's
                                        32-values-in-3-words scheme = a little-endian bit stream)
    qzeros:  int32 [groups, out*bits/32] (zero - 1) packed the same way along the output dim
    scales:  fp16  [groups, out]
    g_idx:   int32 [in]                 group of every input column (act-order keeps codes in
                                        the original column order; g_idx does the grouping)

v1 stores `zero - 1` and kernels read `stored + 1` without masking, so a zero point of 0 (an
asymmetric group with no negative weight) is refused rather than silently read back as 2^bits.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..weight import QuantizedWeight
from .base import Constraints, Format, FormatError, expect_shape, n_groups, require
from .bitpack import pack_bits, unpack_bits
from .registry import register


class GPTQFormat(Format):
    name = "gptq"
    constraints = Constraints(
        bits=(2, 3, 4, 8), group_sizes=None, sym=(True, False), act_order=True,
        in_word_bits=32, out_word_bits=32, scale_dtype="float16", min_zero=1,
        notes="v1 (zero - 1) storage; 3-bit packs 32 values into 3 int32 words",
    )

    def nbytes(self, out_features: int, in_features: int, *, bits: int, group_size: int,
               sym: bool) -> int:
        """codes N·K·b/8 + qzeros ng·N·b/8 (written even when symmetric) + fp16 scales ng·N +
        int32 g_idx [K]."""
        n, k, ng = out_features, in_features, n_groups(in_features, group_size)
        return n * k * bits // 8 + ng * n * bits // 8 + 2 * ng * n + 4 * k

    def pack(self, qw: QuantizedWeight) -> dict[str, np.ndarray]:
        self.check(qw)
        a, mask = qw.numpy(), (1 << qw.bits) - 1
        qweight = pack_bits(a["codes"].T, qw.bits, 32, axis=0).view(np.int32)
        stored = ((a["zeros"].T - 1) & mask).astype(np.uint8)
        qzeros = pack_bits(stored, qw.bits, 32, axis=1).view(np.int32)
        return {"qweight": qweight, "qzeros": qzeros,
                "scales": a["scales"].T.astype(np.float16), "g_idx": a["g_idx"].astype(np.int32)}

    def unpack(self, tensors: Mapping[str, np.ndarray], out_features: int, in_features: int, *,
               bits: int = 4, group_size: int = 128, sym: bool = True) -> QuantizedWeight:
        groups = n_groups(in_features, group_size)
        qweight = expect_shape(require(tensors, "qweight", self.name),
                               (in_features * bits // 32, out_features), "qweight", self.name)
        qzeros = expect_shape(require(tensors, "qzeros", self.name),
                              (groups, out_features * bits // 32), "qzeros", self.name)
        scales = expect_shape(require(tensors, "scales", self.name), (groups, out_features),
                              "scales", self.name)
        codes = unpack_bits(qweight.view(np.uint32), bits, in_features, axis=0).T
        zeros = unpack_bits(qzeros.view(np.uint32), bits, out_features, axis=1).astype(np.int32) + 1
        if zeros.max(initial=0) >= 1 << bits:
            raise FormatError(f"gptq: qzeros store {(1 << bits) - 1} (zero point {1 << bits}), "
                              f"outside the {bits}-bit range", "the checkpoint may be GPTQ v2 "
                              "(zeros stored as-is); convert it to v1")
        g_idx = tensors.get("g_idx")
        return QuantizedWeight(codes=codes, scales=scales.astype(np.float32).T, zeros=zeros.T,
                               bits=bits, group_size=group_size, sym=sym,
                               g_idx=None if g_idx is None else np.asarray(g_idx, np.int32))

    def config(self, qw: QuantizedWeight) -> dict:
        return {"quant_method": "gptq", "bits": qw.bits, "group_size": qw.group_size,
                "sym": qw.sym, "desc_act": qw.act_order, "checkpoint_format": "gptq"}


GPTQ = register(GPTQFormat())
