"""TVM int4 linears (`backends/tvm`, MLC-LLM's `q4f16` idea): the layout `kernels_linear.linear_q4`
reads. N = out_features, K = in_features, g = group_size (-1: one group of K):

    q4_codes   uint32 [N, K/8]   word w of row n holds columns 8w .. 8w+7, column 8w+i in bits
                                 4i .. 4i+3 (the first column in the low nibble; the same words
                                 as MLX's 4-bit `weight`)
    q4_scales  float16 [N, K/g]  (float32 with `pack(qw, scale_dtype="float32")`)
    q4_zeros   uint8 [N, K/g]    zero points; written only when some zero point is not 8
                                 (asymmetric weights), absent = every zero point is 8

    W[n, k] = scales[n, k // g] * (code(n, k) - zero(n, k // g))     (computed in fp32)

which is the canonical dequantisation, so packing is lossless. A group holds whole words
(g % 8 == 0): the kernel reads one scale and zero point per word.

The TVM backend packs with `scale_storage.exact_scale_dtype(scales)`, the narrower dtype that
keeps the scales exact, so fp32 scales (ORT's) are never rounded silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from ..weight import QuantizedWeight
from .base import Constraints, Format, ScaleDType, expect_shape, n_groups, require
from .bitpack import pack_bits, unpack_bits
from .registry import register
from .scale_storage import SCALE_BYTES, scale_storage

CODES, SCALES, ZEROS = "q4_codes", "q4_scales", "q4_zeros"
BITS = 4
SYM_ZERO = 1 << (BITS - 1)
WORD_BITS = 32


def _storage(scale_dtype: str) -> ScaleDType:
    return scale_storage(scale_dtype, "tvm-q4 scales")


class TVMQ4Format(Format):
    name = "tvm-q4"
    constraints = Constraints(
        bits=(BITS,), group_sizes=None, sym=(True, False), act_order=False,
        in_word_bits=WORD_BITS, scale_dtype="float16",
        notes="group_size a multiple of 8 (whole words per group); fp16 scales, or fp32 with "
              "pack(qw, scale_dtype='float32'); uint8 zeros only for asymmetric weights",
    )

    def shape_refusal(self, out_features: int, in_features: int, *, bits: int,
                      group_size: int) -> str | None:
        """The constraint rules, and a group of whole 8-code words."""
        per_word = WORD_BITS // bits
        if group_size > 0 and group_size % per_word:
            # one uint32 word of 8 codes must lie in one group: the kernel reads one scale per word
            return f"group_size={group_size} is not a multiple of {per_word}"
        return super().shape_refusal(out_features, in_features, bits=bits,
                                     group_size=group_size)

    def nbytes(self, out_features: int, in_features: int, *, bits: int, group_size: int,
               sym: bool, scale_dtype: ScaleDType = "float16") -> int:
        """uint32 codes N·K·b/8 + scales ng·N (2 bytes each in fp16, 4 in fp32) + uint8 zero
        points ng·N when asymmetric."""
        n, k, ng = out_features, in_features, n_groups(in_features, group_size)
        zeros = 0 if sym else ng * n
        return n * k * bits // 8 + SCALE_BYTES[_storage(scale_dtype)] * ng * n + zeros

    def pack(self, qw: QuantizedWeight, scale_dtype: ScaleDType = "float16"
             ) -> dict[str, np.ndarray]:
        """{"q4_codes", "q4_scales"[, "q4_zeros"]} (layout: module docstring)."""
        (self if _storage(scale_dtype) == "float16" else _WIDE).check(qw)
        a = qw.numpy()
        out = {CODES: pack_bits(a["codes"], BITS, WORD_BITS, axis=1),
               SCALES: a["scales"].astype(np.float32).astype(scale_dtype)}
        if not (a["zeros"] == SYM_ZERO).all():
            out[ZEROS] = a["zeros"].astype(np.uint8)
        return out

    def _read(self, tensors: Mapping[str, np.ndarray], out: int, inp: int, group_size: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """codes uint8 [N, K], scales float32 and zeros int32 [N, groups]."""
        groups = n_groups(inp, group_size)
        words = expect_shape(require(tensors, CODES, self.name),
                             (out, inp * BITS // WORD_BITS), CODES, self.name)
        scales = expect_shape(require(tensors, SCALES, self.name), (out, groups), SCALES,
                              self.name).astype(np.float32)
        zeros = np.full((out, groups), SYM_ZERO, np.int32) if ZEROS not in tensors else \
            expect_shape(np.asarray(tensors[ZEROS]), (out, groups), ZEROS,
                         self.name).astype(np.int32)
        return unpack_bits(words.view(np.uint32), BITS, inp, axis=1), scales, zeros

    def unpack(self, tensors: Mapping[str, np.ndarray], out_features: int, in_features: int, *,
               bits: int = BITS, group_size: int = 32, sym: bool = True) -> QuantizedWeight:
        codes, scales, zeros = self._read(tensors, out_features, in_features, group_size)
        return QuantizedWeight(codes=codes, scales=scales, zeros=zeros, bits=BITS,
                               group_size=group_size, sym=sym)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out_features: int, in_features: int,
                   **params: object) -> np.ndarray:
        """float32 [N, K] = (code - zero) * scale, what the kernel computes."""
        group_size = int(params.get("group_size", 32))  # type: ignore[arg-type]
        codes, scales, zeros = self._read(tensors, out_features, in_features, group_size)
        group = in_features if group_size == -1 else group_size
        return ((codes.astype(np.float32) - np.repeat(zeros, group, axis=1).astype(np.float32))
                * np.repeat(scales, group, axis=1))


class _TVMQ4Wide(TVMQ4Format):
    """The rules for fp32 scales (not registered: `TVM_Q4.pack(qw, "float32")`)."""

    constraints = dataclasses.replace(TVMQ4Format.constraints, scale_dtype="float32",
                                      notes="fp32 scales (exact)")


_WIDE = _TVMQ4Wide()
TVM_Q4 = register(TVMQ4Format())
