"""GGUF block types as storage formats: gguf-q4_0, gguf-q4_1, gguf-q8_0, gguf-tq1_0, gguf-tq2_0.

`pack(qw)` -> {"weight": uint8 [out, in / block * block_bytes]}: the ggml tensor's bytes, one row
per output feature (ggml ne0 = in_features); `config(qw)["ggml_type"]` is the type id. Byte
layouts and ggml's own quantisers: gguf_blocks.py. Canonical <-> block mapping:

- Q4_0: sym 4-bit, group 32: code = q, d = scale (fp16-exact). ggml's value (q - 8)·d is the
  canonical value bit for bit. Blocks written by ggml carry d = max / -8 < 0: unpack keeps the
  negative scale, so ggml's blocks also round-trip exactly.
- Q8_0: sym 8-bit, group 32: int8 q = code - 128, d = scale.
- Q4_1: 4-bit, group 32: d = scale, m = fp16(-scale·zero). ggml computes q·d + m, which differs
  from the canonical scale·(q - zero) by m's fp16 rounding (at most half an fp16 ulp of
  scale·zero). unpack recovers zero = round(-m / d) and refuses blocks whose m is not such a
  rounding (e.g. ggml's own Q4_1 blocks, whose m is the block minimum): dequantise those with
  `dequantize_gguf` instead.
- TQ1_0 / TQ2_0: ternary, every 256-block of a row shares one scale d (fp16-exact); code = trit+1.

fp16 d: a canonical scale that is not exactly an fp16 value is refused by `check` (never rounded
silently, which would move every weight of the block). Quantise with `scale_dtype=torch.float16`
(the codes are then chosen for the rounded scale) or call `qw.cast_scales(torch.float16)` and
record the added error. `quantize_gguf` (ggml's own quantisers) is the float -> bytes path.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..weight import Kind, QuantizedWeight
from . import register
from .base import Constraints, Format, FormatError, expect_shape, require
from .gguf_blocks import (
    BLOCK,
    GGMLType,
    decode_q4,
    decode_q8_0,
    decode_tq1_0,
    decode_tq2_0,
    dequantize_gguf,
    encode_q4,
    encode_q8_0,
    encode_tq1_0,
    encode_tq2_0,
)
from .mlx import _check_bias_recovers_zero


class GGUFBlockFormat(Format):
    """One ggml block type; subclasses set `ggml_type` and the canonical <-> block mapping."""

    ggml_type: GGMLType

    @property
    def block(self) -> tuple[int, int]:
        return BLOCK[self.ggml_type]

    def nbytes(self, out_features: int, in_features: int, *, bits: int, group_size: int,
               sym: bool) -> int:
        """Whole ggml blocks: N·K/weights_per_block blocks of the type's byte size (Q4_0 32 / 18,
        Q4_1 32 / 20, Q8_0 32 / 34, TQ1_0 256 / 54, TQ2_0 256 / 66)."""
        per_block, block_bytes = self.block
        return out_features * (in_features // per_block) * block_bytes

    def _rows(self, tensors: Mapping[str, np.ndarray], out: int, inp: int) -> np.ndarray:
        size, nbytes = self.block
        raw = require(tensors, "weight", self.name)
        raw = expect_shape(raw.view(np.uint8).reshape(out, -1), (out, inp // size * nbytes),
                           "weight", self.name)
        return raw.reshape(-1, nbytes)

    def pack(self, qw: QuantizedWeight) -> dict[str, np.ndarray]:
        self.check(qw)
        a = qw.numpy()
        size = self.block[0]
        codes = a["codes"].reshape(-1, size)
        scales = a["scales"][:, a["g_idx"]].reshape(-1, size)[:, 0]
        zeros = a["zeros"][:, a["g_idx"]].reshape(-1, size)[:, 0]
        blocks = self._encode(codes, scales, zeros)
        return {"weight": blocks.reshape(qw.out_features, -1)}

    def unpack(self, tensors: Mapping[str, np.ndarray], out_features: int, in_features: int, *,
               bits: int | None = None, group_size: int | None = None,
               sym: bool | None = None) -> QuantizedWeight:
        """The block type fixes bits and (for Q types) the group of 32; `group_size` matters for
        TQ types only (-1 or a multiple of 256 whose blocks share d; default 256), `sym` for Q4_1
        only (None: True iff every zero point is 8)."""
        rows = self._rows(tensors, out_features, in_features)
        return self._decode(rows, out_features, in_features, group_size, sym)

    def config(self, qw: QuantizedWeight) -> dict:
        return {"ggml_type": int(self.ggml_type), "ggml_type_name": self.ggml_type.name}

    def dequantize(self, tensors: Mapping[str, np.ndarray], out_features: int, in_features: int,
                   **params: object) -> np.ndarray:
        """What ggml computes (dequantize_row_*), numpy."""
        return dequantize_gguf(self._rows(tensors, out_features, in_features), self.ggml_type,
                               in_features)

    def _encode(self, codes: np.ndarray, d: np.ndarray, zeros: np.ndarray) -> np.ndarray:
        """codes uint8 [nb, block], d float32 [nb], zeros int32 [nb] -> bytes [nb, block_bytes]."""
        raise NotImplementedError

    def _decode(self, rows: np.ndarray, out: int, inp: int, group_size: int | None,
                sym: bool | None) -> QuantizedWeight:
        raise NotImplementedError


class _Q4_0(GGUFBlockFormat):
    name, ggml_type = "gguf-q4_0", GGMLType.Q4_0
    constraints = Constraints(bits=(4,), group_sizes=(32,), sym=(True,), in_multiple=32)

    def _encode(self, codes: np.ndarray, d: np.ndarray, zeros: np.ndarray) -> np.ndarray:
        return encode_q4(codes, d)

    def _decode(self, rows: np.ndarray, out: int, inp: int, group_size: int | None,
                sym: bool | None) -> QuantizedWeight:
        q, d = decode_q4(rows, with_min=False)
        return QuantizedWeight(codes=q.reshape(out, inp), scales=d.reshape(out, -1),
                               zeros=np.full((out, inp // 32), 8, np.int32), bits=4,
                               group_size=32, sym=True)


class _Q8_0(GGUFBlockFormat):
    name, ggml_type = "gguf-q8_0", GGMLType.Q8_0
    constraints = Constraints(bits=(8,), group_sizes=(32,), sym=(True,), in_multiple=32)

    def _encode(self, codes: np.ndarray, d: np.ndarray, zeros: np.ndarray) -> np.ndarray:
        return encode_q8_0(codes.astype(np.int16) - 128, d)

    def _decode(self, rows: np.ndarray, out: int, inp: int, group_size: int | None,
                sym: bool | None) -> QuantizedWeight:
        q, d = decode_q8_0(rows)
        return QuantizedWeight(codes=(q.astype(np.int16) + 128).reshape(out, inp),
                               scales=d.reshape(out, -1),
                               zeros=np.full((out, inp // 32), 128, np.int32), bits=8,
                               group_size=32, sym=True)


class _Q4_1(GGUFBlockFormat):
    name, ggml_type = "gguf-q4_1", GGMLType.Q4_1
    constraints = Constraints(bits=(4,), group_sizes=(32,), sym=(True, False), in_multiple=32,
                              notes="m = fp16(-scale * zero): ggml's q*d + m rounds m")

    def _check_extra(self, qw: QuantizedWeight, refuse) -> None:
        _check_bias_recovers_zero(qw, refuse)

    @staticmethod
    def _m(d: np.ndarray, zeros: np.ndarray) -> np.ndarray:
        return (-(d * zeros.astype(np.float32))).astype(np.float16).astype(np.float32)

    def _encode(self, codes: np.ndarray, d: np.ndarray, zeros: np.ndarray) -> np.ndarray:
        return encode_q4(codes, d, self._m(d, zeros))

    def _decode(self, rows: np.ndarray, out: int, inp: int, group_size: int | None,
                sym: bool | None) -> QuantizedWeight:
        q, d, m = decode_q4(rows, with_min=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            zeros = np.nan_to_num(np.where(d == 0, 0, np.rint(-m / d)))
        zeros = np.clip(zeros, 0, 15).astype(np.int32)
        bad = self._m(d, zeros) != m
        if bad.any():
            i = int(np.argmax(bad))
            raise FormatError(f"gguf-q4_1: block {i} has m={m[i]!r}, d={d[i]!r}; m is not "
                              "-d * zero for an integer zero point 0..15, so the block has no "
                              "canonical form", "read it with dequantize_gguf() and re-quantise")
        zeros = zeros.reshape(out, -1)
        return QuantizedWeight(codes=q.reshape(out, inp), scales=d.reshape(out, -1), zeros=zeros,
                               bits=4, group_size=32,
                               sym=bool((zeros == 8).all()) if sym is None else sym)


class _Ternary(GGUFBlockFormat):
    constraints = Constraints(bits=(2,), group_sizes=None, sym=(True,), kinds=(Kind.TERNARY,),
                              in_multiple=256, shared_scale_block=256,
                              notes="one fp16 scale per 256-block: use 'row' or 'tensor' scales")

    def _encode(self, codes: np.ndarray, d: np.ndarray, zeros: np.ndarray) -> np.ndarray:
        enc = encode_tq2_0 if self.ggml_type is GGMLType.TQ2_0 else encode_tq1_0
        return enc(codes, d)

    def _decode(self, rows: np.ndarray, out: int, inp: int, group_size: int | None,
                sym: bool | None) -> QuantizedWeight:
        codes, d = (decode_tq2_0 if self.ggml_type is GGMLType.TQ2_0 else decode_tq1_0)(rows)
        if codes.max(initial=0) > 2:
            raise FormatError(f"{self.name}: a code is 3 (no trit); the tensor is corrupt",
                              "re-export it")
        group = 256 if group_size is None else group_size
        size = inp if group == -1 else group
        if size % 256 or inp % size:
            raise FormatError(f"{self.name}: group_size={group} is not -1 or a multiple of 256 "
                              f"dividing in_features={inp}", "use 256 or -1")
        d = d.reshape(out, inp // size, size // 256)
        if not (d == d[..., :1]).all():
            raise FormatError(f"{self.name}: block scales differ inside a group of {size}",
                              "unpack with group_size=256")
        return QuantizedWeight(codes=codes.reshape(out, inp), scales=d[..., 0],
                               zeros=np.ones(d.shape[:2], np.int32), bits=2, group_size=group,
                               sym=True, kind=Kind.TERNARY)


class _TQ1_0(_Ternary):
    name, ggml_type = "gguf-tq1_0", GGMLType.TQ1_0


class _TQ2_0(_Ternary):
    name, ggml_type = "gguf-tq2_0", GGMLType.TQ2_0


Q4_0 = register(_Q4_0())
Q4_1 = register(_Q4_1())
Q8_0 = register(_Q8_0())
TQ1_0 = register(_TQ1_0())
TQ2_0 = register(_TQ2_0())
