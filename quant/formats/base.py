"""What every storage format is: a name, its constraints as data, check / pack / unpack.

A format repacks a canonical `QuantizedWeight` losslessly or refuses it with a `FormatError`
naming the layer, the bad value, the allowed set and the next step. `pack` returns numpy arrays
keyed by the suffix of their checkpoint name (`qweight`, `qzeros`, `scales`, `g_idx`, ...);
`config` returns the metadata a runtime needs; `unpack` (numpy, the reference) inverts `pack`
bit-exactly.

`snap_params(scales, mins)` maps a tensor's group parameters to the nearest ones the format can
store (identity by default; the GGUF K-quants quantise their sub-scales per 256-weight
super-block), so a calibrator picks codes for parameters the format holds exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from ..weight import Kind, QuantError, QuantizedWeight

ScaleDType = Literal["float16", "float32"]


class FormatError(QuantError):
    """A weight cannot be stored in a format (or a stored tensor is malformed)."""


@dataclass(frozen=True)
class Constraints:
    """What a format can hold, as data (the hypothesis tests draw their cases from it).

    group_sizes: allowed group sizes (-1 = whole row); None = any divisor of in_features.
    in_multiple / out_multiple: in_features / out_features must be multiples of these.
    in_word_bits / out_word_bits: codes (or zero points) are bit-packed along that dimension into
        words of this many bits, so `dim * bits` must be a multiple of it.
    scale_dtype: dtype the scales are stored in; canonical scales must be exact in it.
    min_zero: smallest zero point the format can store (GPTQ v1 stores zero - 1).
    shared_scale_block: consecutive input columns that must share one scale (GGUF TQ: 256).
    float_mins: the format stores a float minimum per group (value = scale*code - min, GGUF
        Q4_K / Q5_K) instead of an integer zero point: weights must carry `mins`, and only
        these formats accept weights with `mins`.
    levels: a codebook format's fixed table (GGUF IQ4_NL: 16 non-uniform levels, value =
        scale * level); its weights are `Kind.CODEBOOK` and carry exactly this table.
    super_block: consecutive input columns whose group parameters are quantised together
        (GGUF K-quants: 256); `snap_params` needs all of them at once.
    """

    bits: tuple[int, ...]
    group_sizes: tuple[int, ...] | None
    sym: tuple[bool, ...] = (True, False)
    act_order: bool = False
    kinds: tuple[Kind, ...] = (Kind.UNIFORM,)
    in_multiple: int = 1
    out_multiple: int = 1
    in_word_bits: int | None = None
    out_word_bits: int | None = None
    scale_dtype: ScaleDType = "float16"
    min_zero: int = 0
    shared_scale_block: int | None = None
    float_mins: bool = False
    super_block: int | None = None
    levels: tuple[float, ...] | None = None
    notes: str = ""

    def in_step(self, bits: int, group_size: int) -> int:
        """Smallest in_features step satisfying every rule for these bits and group size."""
        step = math.lcm(self.in_multiple, group_size if group_size > 0 else 1)
        if self.in_word_bits:
            step = math.lcm(step, self.in_word_bits // math.gcd(self.in_word_bits, bits))
        if self.shared_scale_block:
            step = math.lcm(step, self.shared_scale_block)
        if self.super_block:
            step = math.lcm(step, self.super_block)
        return step

    def out_step(self, bits: int) -> int:
        step = self.out_multiple
        if self.out_word_bits:
            step = math.lcm(step, self.out_word_bits // math.gcd(self.out_word_bits, bits))
        return step


class Format:
    """Base class; subclasses set `name`, `constraints` and implement pack / unpack / config."""

    name: ClassVar[str]
    constraints: ClassVar[Constraints]

    # --------------------------------------------------------------------------------- check
    def check(self, qw: QuantizedWeight, layer_name: str | None = None) -> None:
        """Raise FormatError if `qw` cannot be stored losslessly in this format."""
        c, layer = self.constraints, repr(layer_name or qw.name or "?")
        out, inp = qw.out_features, qw.in_features

        def refuse(what: str, hint: str) -> FormatError:
            return FormatError(f"format {self.name!r} cannot store {layer}: {what}", hint)

        if qw.kind not in c.kinds:
            hint = ("store ternary weights as gguf-tq2_0 or gguf-tq1_0" if qw.kind is Kind.TERNARY
                    else "ternarise with quantize_ternary() or pick a uniform format")
            raise refuse(f"kind={qw.kind} is not storable (allowed {[str(k) for k in c.kinds]})",
                         hint)
        if qw.bits not in c.bits:
            raise refuse(f"bits={qw.bits} is not supported (allowed {c.bits})",
                         f"quantise with bits in {c.bits}")
        if c.group_sizes is not None and qw.group_size not in c.group_sizes:
            ok = [g for g in c.group_sizes if g == -1 or inp % g == 0]
            raise refuse(f"group_size={qw.group_size} is not supported (allowed {c.group_sizes})",
                         f"use group_size in {ok or c.group_sizes}")
        if qw.sym not in c.sym:
            raise refuse(f"sym={qw.sym} is not supported (allowed {c.sym})",
                         f"quantise with sym={c.sym[0]}")
        if (qw.mins is not None) != c.float_mins:
            if c.float_mins:
                raise refuse("the format stores a float min per group (value = scale*code - min)"
                             " and the weight has integer zero points",
                             f"quantise with quantize_rtn(..., fmt={self.name!r}) or "
                             f"gptq_quantize(..., fmt={self.name!r})")
            raise refuse("the weight has float mins (a K-quant's scale*code - min), which this "
                         "format cannot store", "store it as gguf-q4_k / gguf-q5_k, or "
                         "re-quantise for this format")
        if qw.act_order and not c.act_order:
            raise refuse("act-order (a non-static g_idx) is not supported",
                         "quantise with desc_act=False or use the gptq format")
        why = self.shape_refusal(out, inp, bits=qw.bits, group_size=qw.group_size)
        if why is not None:
            raise refuse(why, "skip this layer or choose another format")
        scales = qw.scales.cpu().numpy()  # qw may live on the calibration device
        if c.scale_dtype == "float16":
            back = scales.astype(np.float16).astype(np.float32)
            if not np.array_equal(back, scales):
                bad = float(scales.ravel()[np.argmax(back.ravel() != scales.ravel())])
                raise refuse(f"scale {bad!r} is not exactly representable in float16",
                             "quantise with scale_dtype=torch.float16 or call "
                             "qw.cast_scales(torch.float16) and record the added error")
        if c.min_zero and qw.zeros.numel() and int(qw.zeros.min()) < c.min_zero:
            raise refuse(f"zero point {int(qw.zeros.min())} is below {c.min_zero} (the format "
                         f"stores zero - {c.min_zero})", "quantise with sym=True")
        if c.shared_scale_block:
            block = c.shared_scale_block
            per_col = scales[:, qw.group_index().cpu().numpy()].reshape(out, inp // block, block)
            if not (per_col == per_col[..., :1]).all():
                raise refuse(f"scales differ inside a {block}-column block (group_size="
                             f"{qw.group_size})", "ternarise with group_size='row' or 'tensor'")
        if c.levels is not None and qw.levels is not None and \
                qw.levels.tolist() != [float(v) for v in c.levels]:
            raise refuse(f"the weight's levels {qw.levels.tolist()} are not the format's table "
                         f"{list(c.levels)}", f"quantise with quantize_rtn(..., fmt={self.name!r})"
                         f" or gptq_quantize(..., fmt={self.name!r})")
        self._check_extra(qw, refuse)

    # ------------------------------------------------------------ facts without any values
    def shape_refusal(self, out_features: int, in_features: int, *, bits: int,
                      group_size: int) -> str | None:
        """Why an `[out_features, in_features]` weight with these bits / group size cannot be
        stored (None when its shape can): the shape rules of `constraints`, answerable from
        config.json alone (plan, build's preflight) before any weight is read."""
        c = self.constraints
        if group_size > 0 and in_features % group_size:
            return f"group_size={group_size} does not divide in_features={in_features}"
        step_in, step_out = c.in_step(bits, group_size), c.out_step(bits)
        if in_features % step_in:
            return f"in_features={in_features} is not a multiple of {step_in}"
        if out_features % step_out:
            return f"out_features={out_features} is not a multiple of {step_out}"
        return None

    def nbytes(self, out_features: int, in_features: int, *, bits: int, group_size: int,
               sym: bool) -> int:
        """Bytes one `[out_features, in_features]` weight occupies packed in this format, scales
        and zero points included (what `pack` writes; tests/test_latency_storage.py checks it
        against real packs of every registered format)."""
        raise NotImplementedError(f"format {self.name!r} does not state its packed size")

    def _check_extra(self, qw: QuantizedWeight, refuse) -> None:
        """Format-specific rules beyond the constraint data."""

    def snap_params(self, scales: np.ndarray, mins: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Group parameters -> the nearest ones this format stores exactly: `scales` float32
        [out, n_groups] (and `mins`, same shape, for `float_mins` formats) in static group
        order. Identity here (fp16 rounding is the quantisers' `scale_dtype`); formats with
        quantised sub-scales (GGUF K-quants) override it."""
        return scales, mins

    # --------------------------------------------------------------------- pack / unpack / meta
    def pack(self, qw: QuantizedWeight) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def unpack(self, tensors: Mapping[str, np.ndarray], out_features: int, in_features: int, *,
               bits: int = 4, group_size: int = 128, sym: bool = True) -> QuantizedWeight:
        raise NotImplementedError

    def config(self, qw: QuantizedWeight) -> dict:
        """Metadata the runtime needs (config.json entries or ONNX node attributes)."""
        return {}

    def dequantize(self, tensors: Mapping[str, np.ndarray], out_features: int, in_features: int,
                   **params: object) -> np.ndarray:
        """float32 [out, in] exactly as the runtime computes it (numpy). Equal to the canonical
        dequantisation except where the format's own formula differs (documented per format)."""
        qw = self.unpack(tensors, out_features, in_features, **params)  # type: ignore[arg-type]
        return qw.dequantize().numpy()

    def __repr__(self) -> str:
        return f"<format {self.name}>"


def require(tensors: Mapping[str, np.ndarray], key: str, fmt: str) -> np.ndarray:
    """Fetch a packed tensor or raise naming the missing key."""
    if key not in tensors:
        raise FormatError(f"{fmt}: tensor {key!r} is missing (have {sorted(tensors)})",
                          "pass every tensor that pack() wrote")
    return np.asarray(tensors[key])


def expect_shape(arr: np.ndarray, shape: tuple[int, ...], key: str, fmt: str) -> np.ndarray:
    if tuple(arr.shape) != shape:
        raise FormatError(f"{fmt}: tensor {key!r} has shape {tuple(arr.shape)}; expected {shape}",
                          "check out_features / in_features / group_size against the checkpoint")
    return arr


def n_groups(in_features: int, group_size: int) -> int:
    return 1 if group_size == -1 else in_features // group_size
