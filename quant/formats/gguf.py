"""GGUF block types as storage formats: gguf-q4_0, gguf-q4_1, gguf-q5_0, gguf-q5_1, gguf-q8_0,
gguf-iq4_nl, gguf-q4_k, gguf-q5_k, gguf-q6_k, gguf-tq1_0, gguf-tq2_0.

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
- Q5_0 / Q5_1: as Q4_0 / Q4_1 with 5-bit codes (zero 16 when symmetric; Q5_1's m as Q4_1's).
- IQ4_NL: a codebook weight (Kind.CODEBOOK), 4-bit, group 32: code = q, d = scale, levels =
  ggml's kvalues_iq4nl; ggml's d · table[q] is the canonical scale · levels[code] bit for bit.
  Quantise with `quantize_rtn(..., fmt="gguf-iq4_nl")` / `gptq_quantize(..., fmt=...)`, which
  pick the nearest level for a searched scale (rtn.py).
- Q6_K: sym 6-bit, group 16, zero 32; the 16 scales of each 256-weight super-block must be
  fp16 d · int8 sc (ggml's (d·sc)·(q - 32) is then the canonical value bit for bit).
- Q4_K / Q5_K: 4 / 5-bit, group 32, weights with float `mins` (value = scale·q - min); the 8
  scales and 8 mins of each super-block must be fp16 d · 6-bit sc and fp16 dmin · 6-bit m.
  K-quant rows are whole super-blocks: in_features a multiple of 256. Quantise with
  `quantize_rtn(..., fmt=...)` / `gptq_quantize(..., fmt=...)`, which snap the parameters with
  `snap_params` (gguf_kquant.py) before choosing codes; other scales are refused by `check`.
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
from .affine_bias import check_bias_recovers_zero
from .base import Constraints, Format, FormatError, expect_shape, require
from .gguf_blocks import (
    BLOCK,
    KVALUES_IQ4NL,
    GGMLType,
    decode_q4,
    decode_q5,
    decode_q6_k,
    decode_q8_0,
    decode_qk,
    decode_tq1_0,
    decode_tq2_0,
    dequantize_gguf,
    encode_q4,
    encode_q5,
    encode_q6_k,
    encode_q8_0,
    encode_qk,
    encode_tq1_0,
    encode_tq2_0,
)
from .gguf_kquant import factor, snap
from .registry import register


class GGUFBlockFormat(Format):
    """One ggml block type; subclasses set `ggml_type` and the canonical <-> block mapping."""

    ggml_type: GGMLType

    @property
    def block(self) -> tuple[int, int]:
        return BLOCK[self.ggml_type]

    def nbytes(self, out_features: int, in_features: int, *, bits: int, group_size: int,
               sym: bool) -> int:
        """Whole ggml blocks: N·K/weights_per_block blocks of the type's byte size (Q4_0 and
        IQ4_NL 32 / 18,
        Q4_1 32 / 20, Q5_0 32 / 22, Q5_1 32 / 24, Q8_0 32 / 34, Q4_K 256 / 144, Q5_K 256 / 176,
        Q6_K 256 / 210, TQ1_0 256 / 54, TQ2_0 256 / 66)."""
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
        levels = self.constraints.levels  # IQ4_NL: the same bytes, codes index a table
        return QuantizedWeight(codes=q.reshape(out, inp), scales=d.reshape(out, -1),
                               zeros=np.full((out, inp // 32), 8, np.int32), bits=4,
                               group_size=32, sym=True, kind=self.constraints.kinds[0],
                               levels=None if levels is None else np.asarray(levels, np.float32))


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
    # asymmetric first: a block stores its min, so a symmetric Q4_1 is Q4_0 at 0.5 more bits
    constraints = Constraints(bits=(4,), group_sizes=(32,), sym=(False, True), in_multiple=32,
                              notes="m = fp16(-scale * zero): ggml's q*d + m rounds m")

    def _check_extra(self, qw: QuantizedWeight, refuse) -> None:
        check_bias_recovers_zero(qw, refuse)

    @staticmethod
    def _m(d: np.ndarray, zeros: np.ndarray) -> np.ndarray:
        return (-(d * zeros.astype(np.float32))).astype(np.float16).astype(np.float32)

    bits_ = 4  # Q5_1 is the same with 5-bit codes

    def _encode(self, codes: np.ndarray, d: np.ndarray, zeros: np.ndarray) -> np.ndarray:
        return (encode_q4 if self.bits_ == 4 else encode_q5)(codes, d, self._m(d, zeros))

    def _decode(self, rows: np.ndarray, out: int, inp: int, group_size: int | None,
                sym: bool | None) -> QuantizedWeight:
        q, d, m = (decode_q4 if self.bits_ == 4 else decode_q5)(rows, with_min=True)
        top = (1 << self.bits_) - 1
        with np.errstate(divide="ignore", invalid="ignore"):
            zeros = np.nan_to_num(np.where(d == 0, 0, np.rint(-m / d)))
        zeros = np.clip(zeros, 0, top).astype(np.int32)
        bad = self._m(d, zeros) != m
        if bad.any():
            i = int(np.argmax(bad))
            raise FormatError(f"{self.name}: block {i} has m={m[i]!r}, d={d[i]!r}; m is not "
                              f"-d * zero for an integer zero point 0..{top}, so the block has "
                              "no canonical form", "read it with dequantize_gguf() and re-quantise")
        zeros = zeros.reshape(out, -1)
        return QuantizedWeight(codes=q.reshape(out, inp), scales=d.reshape(out, -1), zeros=zeros,
                               bits=self.bits_, group_size=32,
                               sym=bool((zeros == (top + 1) // 2).all()) if sym is None else sym)


class _Q5_0(GGUFBlockFormat):
    name, ggml_type = "gguf-q5_0", GGMLType.Q5_0
    constraints = Constraints(bits=(5,), group_sizes=(32,), sym=(True,), in_multiple=32)

    def _encode(self, codes: np.ndarray, d: np.ndarray, zeros: np.ndarray) -> np.ndarray:
        return encode_q5(codes, d)

    def _decode(self, rows: np.ndarray, out: int, inp: int, group_size: int | None,
                sym: bool | None) -> QuantizedWeight:
        q, d = decode_q5(rows, with_min=False)
        return QuantizedWeight(codes=q.reshape(out, inp), scales=d.reshape(out, -1),
                               zeros=np.full((out, inp // 32), 16, np.int32), bits=5,
                               group_size=32, sym=True)


class _Q5_1(_Q4_1):
    name, ggml_type = "gguf-q5_1", GGMLType.Q5_1
    constraints = Constraints(bits=(5,), group_sizes=(32,), sym=(False, True), in_multiple=32,
                              notes="m = fp16(-scale * zero): ggml's q*d + m rounds m")
    bits_ = 5


class _IQ4_NL(_Q4_0):
    """Q4_0's bytes; the code indexes ggml's table instead of a uniform grid."""

    name, ggml_type = "gguf-iq4_nl", GGMLType.IQ4_NL
    constraints = Constraints(bits=(4,), group_sizes=(32,), sym=(True,), in_multiple=32,
                              kinds=(Kind.CODEBOOK,),
                              levels=tuple(float(v) for v in KVALUES_IQ4NL),
                              notes="16 fixed non-uniform levels: value = d * kvalues_iq4nl[q]")


class _KQuant(GGUFBlockFormat):
    """A K-quant: 256-weight super-blocks whose sub-block parameters are quantised (see
    gguf_kquant.py); pack factors the canonical scales (and mins) back into d · sc."""

    signed: bool  # int8 sub-scales (Q6_K) or 6-bit unsigned ones (Q4_K / Q5_K)

    @property
    def n_sub(self) -> int:
        return 256 // self.constraints.group_sizes[0]

    def snap_params(self, scales: np.ndarray, mins: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Per super-block: scales -> fp16 d · sc (and mins -> fp16 dmin · m); [out, n_groups]
        with n_groups a multiple of the sub-blocks per super-block."""
        scales = np.asarray(scales, np.float32)
        if scales.shape[-1] % self.n_sub:
            raise FormatError(f"{self.name}: {scales.shape[-1]} groups per row are not whole "
                              f"super-blocks of {self.n_sub} groups (256 weights)",
                              "give rows whose length is a multiple of 256")
        out_s = snap(scales, self.n_sub, self.signed)
        out_m = None if mins is None else snap(np.asarray(mins, np.float32), self.n_sub, False)
        return out_s, out_m

    def _factors(self, qw: QuantizedWeight) -> tuple[np.ndarray, ...]:
        """(d, sc, dmin, m, first bad super-block index or -1, which: 'scales' / 'mins')."""
        d, sc, bad = factor(qw.scales.numpy().reshape(-1, self.n_sub), self.signed)
        if bad >= 0 or qw.mins is None:
            return d, sc, None, None, bad, "scales"
        dmin, m, bad = factor(qw.mins.numpy().reshape(-1, self.n_sub), False)
        return d, sc, dmin, m, bad, "mins"

    def _check_extra(self, qw: QuantizedWeight, refuse) -> None:
        *_, bad, which = self._factors(qw)
        if bad >= 0:
            per_row = qw.in_features // 256
            vals = getattr(qw, which).numpy().reshape(-1, self.n_sub)[bad]
            kind = "int8 sc" if self.signed else "6-bit 0..63"
            raise refuse(f"the {which} of super-block {bad % per_row} of row {bad // per_row} "
                         f"({vals.tolist()}) are not fp16 d x {kind} values",
                         f"quantise with quantize_rtn(..., fmt={self.name!r}) or gptq_quantize"
                         f"(..., fmt={self.name!r}), or snap them with "
                         f"get_format({self.name!r}).snap_params()")

    def pack(self, qw: QuantizedWeight) -> dict[str, np.ndarray]:
        self.check(qw)
        d, sc, dmin, m, _, _ = self._factors(qw)
        codes = qw.codes.numpy().reshape(-1, 256)
        if self.signed:
            blocks = encode_q6_k(codes, d, sc)
        else:
            blocks = encode_qk(codes, d, dmin, sc, m, qw.bits)
        return {"weight": blocks.reshape(qw.out_features, -1)}

    def _decode(self, rows: np.ndarray, out: int, inp: int, group_size: int | None,
                sym: bool | None) -> QuantizedWeight:
        group = self.constraints.group_sizes[0]
        bits = self.constraints.bits[0]
        if self.signed:
            q, d, sc = decode_q6_k(rows)
            scales = (d[:, None] * sc.astype(np.float32)) + np.float32(0)
            return QuantizedWeight(codes=q.reshape(out, inp), scales=scales.reshape(out, -1),
                                   zeros=np.full((out, inp // group), 32, np.int32), bits=bits,
                                   group_size=group, sym=True)
        q, d, dmin, sc, m = decode_qk(rows, bits)
        scales = (d[:, None] * sc.astype(np.float32)) + np.float32(0)
        mins = (dmin[:, None] * m.astype(np.float32)) + np.float32(0)
        return QuantizedWeight(codes=q.reshape(out, inp), scales=scales.reshape(out, -1),
                               zeros=np.zeros((out, inp // group), np.int32), bits=bits,
                               group_size=group, sym=False, mins=mins.reshape(out, -1))


class _Q4_K(_KQuant):
    name, ggml_type, signed = "gguf-q4_k", GGMLType.Q4_K, False
    constraints = Constraints(bits=(4,), group_sizes=(32,), sym=(False,), in_multiple=256,
                              scale_dtype="float32", float_mins=True, super_block=256,
                              notes="8 sub-blocks of 32 per 256: scale = d*sc, min = dmin*m")


class _Q5_K(_KQuant):
    name, ggml_type, signed = "gguf-q5_k", GGMLType.Q5_K, False
    constraints = Constraints(bits=(5,), group_sizes=(32,), sym=(False,), in_multiple=256,
                              scale_dtype="float32", float_mins=True, super_block=256,
                              notes="8 sub-blocks of 32 per 256: scale = d*sc, min = dmin*m")


class _Q6_K(_KQuant):
    name, ggml_type, signed = "gguf-q6_k", GGMLType.Q6_K, True
    constraints = Constraints(bits=(6,), group_sizes=(16,), sym=(True,), in_multiple=256,
                              scale_dtype="float32", super_block=256,
                              notes="16 sub-blocks of 16 per 256: scale = d * int8 sc")


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
Q5_0 = register(_Q5_0())
Q5_1 = register(_Q5_1())
IQ4_NL = register(_IQ4_NL())
Q4_K = register(_Q4_K())
Q5_K = register(_Q5_K())
Q6_K = register(_Q6_K())
TQ1_0 = register(_TQ1_0())
TQ2_0 = register(_TQ2_0())
