"""MLX affine quantisation (`mx.quantize(w, group_size, bits, mode="affine")`, mlx-lm layout).

    weight: uint32 [out, in*bits/32]  codes as a little-endian bit stream along each row (for
                                      4-bit: value i of a word at bits 4i; 3-bit values cross
                                      word boundaries the same way mlx packs 8 values in 3 bytes)
    scales: fp16   [out, in/group]
    biases: fp16   [out, in/group]    MLX computes w = scale * q + bias

Canonical -> MLX: bias = fp16(-scale * zero). MLX's value therefore differs from the canonical
scale * (q - zero) by the fp16 rounding of the bias (half an fp16 ulp of scale * zero at most);
unpack recovers zero = round(-bias / scale) and refuses biases that are not such a rounding
(mx.quantize's own output, whose bias is the group minimum). mlx-lm writes
`"quantization": {"group_size": g, "bits": b}` in config.json.

mlx is not installed on the build host: this layout follows the MLX documentation
(mlx.core.quantize / dequantize); the MLX backend checks it against real mlx on Apple silicon.
MLX also has 5- and 6-bit modes; the canonical weight has no 5/6-bit codes, so they are absent.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..weight import QuantizedWeight
from . import register
from .base import Constraints, Format, FormatError, expect_shape, n_groups, require
from .bitpack import pack_bits, unpack_bits


def _bias(scales: np.ndarray, zeros: np.ndarray) -> np.ndarray:
    """fp16(-scale * zero) as float32."""
    return (-(scales * zeros.astype(np.float32))).astype(np.float16).astype(np.float32)


def _check_bias_recovers_zero(qw: QuantizedWeight, refuse) -> None:
    """The stored bias fp16(-scale * zero) must give the zero point back (it does unless the
    scale is below the fp16 normal range); shared with GGUF Q4_1, whose m is the same bias."""
    scales, zeros = qw.scales.numpy(), qw.zeros.numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        back = np.where(scales == 0, 0, np.rint(-_bias(scales, zeros) / scales))
    bad = (back != zeros) & ~((scales == 0) & (zeros == 0))
    if bad.any():
        o, g = np.argwhere(bad)[0]
        raise refuse(f"zero point {int(zeros[o, g])} with scale {float(scales[o, g])!r} is not "
                     "recoverable from the fp16 bias -scale * zero",
                     "use a symmetric recipe or larger scales")


class MLXFormat(Format):
    name = "mlx"
    constraints = Constraints(
        bits=(2, 3, 4, 8), group_sizes=(32, 64, 128), sym=(True, False), act_order=False,
        in_word_bits=32, scale_dtype="float16",
        notes="biases = fp16(-scale * zero); MLX 5/6-bit modes have no canonical counterpart",
    )

    def nbytes(self, out_features: int, in_features: int, *, bits: int, group_size: int,
               sym: bool) -> int:
        """uint32-packed codes N·K·b/8 + fp16 scales and fp16 biases, ng·N each."""
        n, k, ng = out_features, in_features, n_groups(in_features, group_size)
        return n * k * bits // 8 + 4 * ng * n

    def _check_extra(self, qw: QuantizedWeight, refuse) -> None:
        _check_bias_recovers_zero(qw, refuse)

    def pack(self, qw: QuantizedWeight) -> dict[str, np.ndarray]:
        self.check(qw)
        a = qw.numpy()
        return {"weight": pack_bits(a["codes"], qw.bits, 32, axis=1),
                "scales": a["scales"].astype(np.float16),
                "biases": _bias(a["scales"], a["zeros"]).astype(np.float16)}

    def _read(self, tensors: Mapping[str, np.ndarray], out: int, inp: int, bits: int,
              group_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if group_size not in self.constraints.group_sizes or bits not in self.constraints.bits:
            raise FormatError(f"mlx: group_size={group_size}, bits={bits} are not an MLX affine "
                              f"mode (group in {self.constraints.group_sizes}, bits in "
                              f"{self.constraints.bits})", "read them from config.json")
        weight = expect_shape(require(tensors, "weight", self.name), (out, inp * bits // 32),
                              "weight", self.name)
        scales = expect_shape(require(tensors, "scales", self.name), (out, inp // group_size),
                              "scales", self.name).astype(np.float32)
        biases = expect_shape(require(tensors, "biases", self.name), (out, inp // group_size),
                              "biases", self.name).astype(np.float32)
        return unpack_bits(weight.view(np.uint32), bits, inp, axis=1), scales, biases

    def unpack(self, tensors: Mapping[str, np.ndarray], out_features: int, in_features: int, *,
               bits: int = 4, group_size: int = 64, sym: bool = False) -> QuantizedWeight:
        codes, scales, biases = self._read(tensors, out_features, in_features, bits, group_size)
        with np.errstate(divide="ignore", invalid="ignore"):
            zeros = np.nan_to_num(np.where(scales == 0, 0, np.rint(-biases / scales)))
        zeros = np.clip(zeros, 0, (1 << bits) - 1).astype(np.int32)
        bad = _bias(scales, zeros) != biases
        if bad.any():
            o, g = np.argwhere(bad)[0]
            raise FormatError(f"mlx: group ({o}, {g}) has bias {biases[o, g]!r} with scale "
                              f"{scales[o, g]!r}; the bias is not -scale * zero for an integer "
                              "zero point, so the group has no canonical form",
                              "dequantise with MLXFormat.dequantize() and re-quantise")
        return QuantizedWeight(codes=codes, scales=scales, zeros=zeros, bits=bits,
                               group_size=group_size, sym=sym)

    def dequantize(self, tensors: Mapping[str, np.ndarray], out_features: int, in_features: int,
                   **params: object) -> np.ndarray:
        """MLX's formula scale * q + bias (float32), for any MLX affine weight."""
        bits, group = int(params.get("bits", 4)), int(params.get("group_size", 64))
        codes, scales, biases = self._read(tensors, out_features, in_features, bits, group)
        per = np.repeat(np.arange(in_features // group), group)
        return scales[:, per] * codes.astype(np.float32) + biases[:, per]

    def config(self, qw: QuantizedWeight) -> dict:
        return {"quantization": {"group_size": qw.group_size, "bits": qw.bits}}


MLX = register(MLXFormat())
