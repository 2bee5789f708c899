"""MLX affine quantisation (`mx.quantize(w, group_size, bits, mode="affine")`, mlx-lm layout).

    weight: uint32 [out, in*bits/32]  codes as a little-endian bit stream along each row (4-bit:
                                      value i of a word at bits 4i, least significant nibble
                                      first; 3-bit values cross word boundaries)
    scales: fp16 or fp32 [out, in/group]
    biases: fp16 or fp32 [out, in/group]   MLX computes w = scale * q + bias

Canonical -> MLX: bias = -scale * zero, stored in one of two dtypes (`pack(qw, scale_dtype=...)`):

- "float16" (default, what mlx-lm writes; 4 bytes per group): bias = fp16(-scale * zero). MLX's
  value differs from the canonical scale * (q - zero) by the fp16 rounding of the bias (half an
  fp16 ulp of scale * zero at most), and `mx.dequantize` / `mx.quantized_matmul` with fp16 scales
  round twice more (round16(round16(s*q) + b)).
- "float32" (8 bytes per group): bias = -scale * zero is exact in fp32 (an fp16 scale times an
  integer below 2^8), and so is every s*q + b, so `mx.dequantize` returns exactly the canonical
  scale * (q - zero): GPTQ / AWQ codes become MLX affine with no second rounding.

`unpack` recovers zero = round(-bias / scale) and refuses biases that are not -scale * zero in
their stored dtype (mx.quantize's own output, whose bias is the group minimum, has no canonical
form: read it with `dequantize`, MLX's formula in fp32). mlx-lm writes
`"quantization": {"group_size": g, "bits": b, "mode": "affine"}` in config.json.

Checked against real mlx 0.32.4 (`mlx[cpu]` on Linux; tests/backends/mlx/test_mlx_format.py):
pack_bits gives mx.quantize's words for 2/3/4/8 bits, mx.quantize takes group sizes 32/64/128
only, and mx.dequantize of a float32 pack equals the canonical dequantisation bit for bit. MLX's
5- and 6-bit modes have no canonical counterpart and are absent.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..weight import QuantizedWeight
from .affine_bias import ScaleStorage, affine_bias, check_bias_recovers_zero
from .base import Constraints, Format, FormatError, expect_shape, n_groups, require
from .bitpack import pack_bits, unpack_bits
from .registry import register
from .scale_storage import SCALE_BYTES, scale_storage


def _scale_storage(scale_dtype: str) -> ScaleStorage:
    return scale_storage(scale_dtype, "mlx scales and biases (float16 is mlx-lm's default)")


class MLXFormat(Format):
    name = "mlx"
    constraints = Constraints(
        bits=(2, 3, 4, 8), group_sizes=(32, 64, 128), sym=(True, False), act_order=False,
        in_word_bits=32, scale_dtype="float16",
        notes="biases = fp16(-scale * zero) (or fp32, exact); MLX 5/6-bit modes have no "
              "canonical counterpart",
    )

    def nbytes(self, out_features: int, in_features: int, *, bits: int, group_size: int,
               sym: bool, scale_dtype: str = "float16") -> int:
        """uint32-packed codes N·K·b/8 + scales and biases, ng·N each, 2 bytes per value in fp16
        (4 in fp32)."""
        n, k, ng = out_features, in_features, n_groups(in_features, group_size)
        return n * k * bits // 8 + 2 * SCALE_BYTES[_scale_storage(scale_dtype)] * ng * n

    def packed_shapes(self, out_features: int, in_features: int, *, bits: int,
                      group_size: int) -> dict[str, tuple[int, int]]:
        """Shapes of the tensors `pack` writes for an `[out, in]` weight: "weight" uint32
        [out, in*bits/32] (each row's codes as one bit stream), "scales" and "biases"
        [out, in/group_size]. For any width MLX packs (mlx-lm's 5- and 6-bit too): readers of
        MLX folders ask it."""
        groups = n_groups(in_features, group_size)
        return {"weight": (out_features, in_features * bits // 32),
                "scales": (out_features, groups), "biases": (out_features, groups)}

    def _check_extra(self, qw: QuantizedWeight, refuse) -> None:
        check_bias_recovers_zero(qw, refuse)

    def pack(self, qw: QuantizedWeight, scale_dtype: str = "float16") -> dict[str, np.ndarray]:
        """{"weight": uint32 [out, in*bits/32], "scales", "biases": [out, groups] in
        `scale_dtype`} (see the module docstring for the two dtypes)."""
        storage = _scale_storage(scale_dtype)
        if storage == "float16":
            self.check(qw)
        else:
            _EXACT.check(qw)
        a = qw.numpy()
        dt = np.float16 if storage == "float16" else np.float32
        return {"weight": pack_bits(a["codes"], qw.bits, 32, axis=1),
                "scales": a["scales"].astype(dt),
                "biases": affine_bias(a["scales"], a["zeros"], storage).astype(dt)}

    def _read(self, tensors: Mapping[str, np.ndarray], out: int, inp: int, bits: int,
              group_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, ScaleStorage]:
        if group_size not in self.constraints.group_sizes or bits not in self.constraints.bits:
            raise FormatError(f"mlx: group_size={group_size}, bits={bits} are not an MLX affine "
                              f"mode (group in {self.constraints.group_sizes}, bits in "
                              f"{self.constraints.bits})", "read them from config.json")
        shapes = self.packed_shapes(out, inp, bits=bits, group_size=group_size)
        weight, raw_biases, scales = (
            expect_shape(require(tensors, key, self.name), shapes[key], key, self.name)
            for key in ("weight", "biases", "scales"))
        scales = scales.astype(np.float32)
        storage: ScaleStorage = "float32" if np.asarray(raw_biases).dtype == np.float32 \
            else "float16"
        return (unpack_bits(weight.view(np.uint32), bits, inp, axis=1), scales,
                np.asarray(raw_biases).astype(np.float32), storage)

    def unpack(self, tensors: Mapping[str, np.ndarray], out_features: int, in_features: int, *,
               bits: int = 4, group_size: int = 64, sym: bool = False) -> QuantizedWeight:
        codes, scales, biases, storage = self._read(tensors, out_features, in_features, bits,
                                                    group_size)
        with np.errstate(divide="ignore", invalid="ignore"):
            zeros = np.nan_to_num(np.where(scales == 0, 0, np.rint(-biases / scales)))
        zeros = np.clip(zeros, 0, (1 << bits) - 1).astype(np.int32)
        bad = affine_bias(scales, zeros, storage) != biases
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
        codes, scales, biases, _ = self._read(tensors, out_features, in_features, bits, group)
        per = np.repeat(np.arange(in_features // group), group)
        return scales[:, per] * codes.astype(np.float32) + biases[:, per]

    def config(self, qw: QuantizedWeight) -> dict:
        return {"quantization": {"group_size": qw.group_size, "bits": qw.bits}}


class _MLXExact(MLXFormat):
    """The rules for fp32 scales and biases (not registered: `MLX.pack(qw, "float32")`)."""

    constraints = Constraints(
        bits=(2, 3, 4, 8), group_sizes=(32, 64, 128), sym=(True, False), act_order=False,
        in_word_bits=32, scale_dtype="float32", notes="fp32 scales and biases (exact)")

    def _check_extra(self, qw: QuantizedWeight, refuse) -> None:
        """fp32 biases -scale * zero always give the zero point back."""


_EXACT = _MLXExact()
MLX = register(MLXFormat())
