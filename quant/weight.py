"""The canonical quantised weight every calibrator produces and every storage format repacks.

One linear layer's weight `W` (torch layout `[out_features, in_features]`) is stored as

- `codes`:  uint8 `[out, in]`, unsigned codes `0 .. 2^bits - 1`, in the original column order
  (act-order never permutes the stored codes; `g_idx` says which group a column belongs to);
- `scales`: float32 `[out, n_groups]`;
- `zeros`:  int32 `[out, n_groups]`, integer zero points (symmetric: all `2^(bits-1)`);
- `g_idx`:  int32 `[in]` or None; None means the static grouping `g_idx[k] = k // group_size`
  (an explicit `g_idx` equal to that is normalised to None, so equal weights compare equal).

The definition of the value: `W[o, k] = scales[o, g] * (codes[o, k] - zeros[o, g])` with
`g = g_idx[k]` (fp32: the difference is an exact small integer, one rounding in the product).

Ternary weights (BitNet b1.58 / BitCPM, `kind="ternary"`) use the same definition with
`bits=2`, trit `t ∈ {-1, 0, 1}` stored as code `t + 1 ∈ {0, 1, 2}` and every zero point 1, so
`scale * (code - 1) = scale * t` (the code is TQ2_0's 2-bit code, `sym=True`).

K-quant weights with a float minimum (GGUF Q4_K / Q5_K: `value = d·sc·q - dmin·m`, whose
minimum is no integer multiple of the scale) carry `mins` float32 `[out, n_groups]` and the
definition `W[o, k] = scales[o, g] * codes[o, k] - mins[o, g]` (fp32: one rounding in the product,
one in the difference, as ggml's dequantize_row_q4_K); such a weight is asymmetric and its
`zeros` are all 0 (unused). Every other weight has `mins=None`.

Codebook weights (`kind="codebook"`, GGUF IQ4_NL: a fixed non-uniform table of 16 levels) carry
`levels` float32 `[2^bits]`, ascending, and the definition `W[o, k] = scales[o, g] *
levels[codes[o, k]]` (fp32: one rounding in the product, as ggml's dequantize_row_iq4_nl); such a
weight is symmetric with every zero point `2^(bits-1)` (unused). Every other weight has
`levels=None`.

`group_size=-1` means one group per row. Scales may be negative only when they come from a file
that stores them so (ggml's Q4_0 writes `d = max / -8`); ArkInfer's quantisers write scales >= 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import torch

from arkinfer.errors import ArkError

UNIFORM_BITS: tuple[int, ...] = (2, 3, 4, 5, 6, 8)


class QuantError(ArkError):
    """A quantised weight or a quantiser argument is invalid."""


class Kind(StrEnum):
    """What the integer codes mean: a uniform grid, trits (ternary), or indices into a fixed table
    of levels (codebook)."""

    UNIFORM = "uniform"
    TERNARY = "ternary"
    CODEBOOK = "codebook"


def _fail(what: str, hint: str) -> QuantError:
    return QuantError(what, hint)


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """Canonical quantised weight; see the module docstring for the layout and the definition.

    Construction validates shapes, dtypes and ranges and raises `QuantError` naming the bad value.
    Tensors stay on the device they were made on (calibration on CUDA makes them there; `to`
    moves them, e.g. `.to("cpu")` before saving); `numpy()` gives the same arrays as CPU numpy
    arrays for the numpy format packers.
    """

    codes: torch.Tensor  # uint8 [out, in]
    scales: torch.Tensor  # float32 [out, n_groups]
    zeros: torch.Tensor  # int32 [out, n_groups]
    bits: int
    group_size: int  # -1 = whole row
    sym: bool
    g_idx: torch.Tensor | None = None  # int32 [in]
    kind: Kind = Kind.UNIFORM
    name: str = field(default="", compare=False)  # layer name, used in error messages only
    mins: torch.Tensor | None = None  # float32 [out, n_groups]: value = scale*code - min
    levels: torch.Tensor | None = None  # float32 [2^bits] (codebook): value = scale*levels[code]

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.kind not in tuple(Kind):
            raise QuantError(f"kind={self.kind!r} of quantised weight {self.name!r} is unknown; "
                             f"allowed {[str(k) for k in Kind]}",
                             "use Kind.UNIFORM, Kind.TERNARY or Kind.CODEBOOK")
        set_(self, "kind", Kind(self.kind))
        set_(self, "codes", _as_tensor(self.codes, torch.uint8, "codes", self.name))
        set_(self, "scales", _as_tensor(self.scales, torch.float32, "scales", self.name))
        set_(self, "zeros", _as_tensor(self.zeros, torch.int32, "zeros", self.name))
        if self.g_idx is not None:
            set_(self, "g_idx", _as_tensor(self.g_idx, torch.int32, "g_idx", self.name))
        if self.mins is not None:
            set_(self, "mins", _as_tensor(self.mins, torch.float32, "mins", self.name))
        if self.levels is not None:
            set_(self, "levels", _as_tensor(self.levels, torch.float32, "levels", self.name))
        self._validate()
        if self.g_idx is not None and torch.equal(self.g_idx, self._static_g_idx()):
            set_(self, "g_idx", None)

    # ----------------------------------------------------------------------------- validation
    def _validate(self) -> None:
        who = f"quantised weight {self.name!r}" if self.name else "quantised weight"
        if self.codes.dim() != 2:
            raise _fail(f"codes of {who} have shape {tuple(self.codes.shape)}; expected 2-D "
                        "[out_features, in_features]", "reshape the weight to [out, in]")
        out, inp = self.codes.shape
        if self.kind is Kind.TERNARY:
            if self.bits != 2:
                raise _fail(f"{who} is ternary with bits={self.bits}; ternary codes are 2-bit",
                            "construct it with bits=2 (codes = trit + 1)")
        elif self.bits not in UNIFORM_BITS:
            raise _fail(f"bits={self.bits} of {who} is not supported; allowed {UNIFORM_BITS}",
                        "quantise with one of the allowed bit widths")
        if self.group_size == -1:
            n_groups = 1
        elif self.group_size <= 0 or inp % self.group_size:
            divisors = [g for g in (32, 64, 128, 256) if inp % g == 0]
            raise _fail(f"group_size={self.group_size} does not divide in_features={inp} of {who}",
                        f"use -1 (whole row) or one of {divisors or 'a divisor of in_features'}")
        else:
            n_groups = inp // self.group_size
        for name, t in (("scales", self.scales), ("zeros", self.zeros)):
            if tuple(t.shape) != (out, n_groups):
                raise _fail(f"{name} of {who} have shape {tuple(t.shape)}; expected [out, "
                            f"n_groups] = [{out}, {n_groups}] for group_size={self.group_size}",
                            "build scales and zeros with one column per group")
        maxq = 2 if self.kind is Kind.TERNARY else (1 << self.bits) - 1
        if self.codes.numel() and int(self.codes.max()) > maxq:
            raise _fail(f"codes of {who} reach {int(self.codes.max())}; {self.kind} "
                        f"{self.bits}-bit codes are 0..{maxq}", "clamp the codes when quantising")
        if not bool(torch.isfinite(self.scales).all()):
            raise _fail(f"scales of {who} contain inf or nan", "check the weight for inf/nan")
        zmin = int(self.zeros.min()) if self.zeros.numel() else 0
        zmax = int(self.zeros.max()) if self.zeros.numel() else 0
        if self.kind is Kind.TERNARY:
            if (zmin, zmax) != (1, 1) or not self.sym:
                raise _fail(f"{who} is ternary but zeros span {zmin}..{zmax} (sym={self.sym}); "
                            "ternary weights have every zero point 1 and sym=True",
                            "use quantize_ternary() to build ternary weights")
            if self.g_idx is not None:
                raise _fail(f"{who} is ternary with a g_idx; ternary weights have no act-order",
                            "drop g_idx")
        elif self.sym:
            mid = 1 << (self.bits - 1)
            if (zmin, zmax) != (mid, mid):
                raise _fail(f"{who} is symmetric but zeros span {zmin}..{zmax}; symmetric "
                            f"{self.bits}-bit zero points are all {mid}", "pass sym=False")
        elif zmin < 0 or zmax > maxq:
            raise _fail(f"zeros of {who} span {zmin}..{zmax}; allowed 0..{maxq}",
                        "clamp zero points to the code range")
        if self.mins is not None:
            self._validate_mins(who, out, n_groups)
        if (self.levels is not None) != (self.kind is Kind.CODEBOOK):
            raise _fail(f"{who} is {self.kind} with levels={'set' if self.levels is not None else None};"
                        " a table of levels goes with kind=codebook and only with it",
                        "pass kind=Kind.CODEBOOK with levels, or neither")
        if self.levels is not None:
            self._validate_levels(who)
        if self.g_idx is not None:
            if tuple(self.g_idx.shape) != (inp,):
                raise _fail(f"g_idx of {who} has shape {tuple(self.g_idx.shape)}; expected [{inp}]",
                            "give one group index per input column")
            if inp and (int(self.g_idx.min()) < 0 or int(self.g_idx.max()) >= n_groups):
                lo, hi = int(self.g_idx.min()), int(self.g_idx.max())
                raise _fail(f"g_idx of {who} spans {lo}..{hi}; allowed 0..{n_groups - 1}",
                            "index groups from 0")

    def _validate_mins(self, who: str, out: int, n_groups: int) -> None:
        if tuple(self.mins.shape) != (out, n_groups):
            raise _fail(f"mins of {who} have shape {tuple(self.mins.shape)}; expected [out, "
                        f"n_groups] = [{out}, {n_groups}]", "give one min per group, as scales")
        if self.kind is not Kind.UNIFORM or self.sym:
            raise _fail(f"{who} has float mins but is {self.kind} sym={self.sym}; mins belong "
                        "to asymmetric uniform weights (K-quants)", "pass sym=False")
        if self.zeros.numel() and bool((self.zeros != 0).any()):
            raise _fail(f"{who} has float mins and nonzero zero points; with mins the value is "
                        "scale*code - min and zeros must all be 0", "pass zeros of 0")
        if not bool(torch.isfinite(self.mins).all()):
            raise _fail(f"mins of {who} contain inf or nan", "check the weight for inf/nan")

    def _validate_levels(self, who: str) -> None:
        lv = self.levels
        if tuple(lv.shape) != (1 << self.bits,):
            raise _fail(f"levels of {who} have shape {tuple(lv.shape)}; expected [{1 << self.bits}]"
                        f" for {self.bits}-bit codes", "give one level per code")
        if not bool(torch.isfinite(lv).all()) or not bool((lv[1:] > lv[:-1]).all()):
            raise _fail(f"levels of {who} are not finite and strictly ascending: {lv.tolist()}",
                        "sort the table")
        if not self.sym:
            raise _fail(f"{who} is a codebook weight with sym=False; its value is scale*level "
                        "(no zero point)", "pass sym=True")

    # ------------------------------------------------------------------------------- shape info
    @property
    def out_features(self) -> int:
        return int(self.codes.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.codes.shape[1])

    @property
    def n_groups(self) -> int:
        return int(self.scales.shape[1])

    @property
    def act_order(self) -> bool:
        """True when columns are grouped by an explicit (non-static) g_idx."""
        return self.g_idx is not None

    def _static_g_idx(self) -> torch.Tensor:
        size = self.in_features if self.group_size == -1 else self.group_size
        return (torch.arange(self.in_features, dtype=torch.int32, device=self.codes.device)
                // max(size, 1)).to(torch.int32)

    def group_index(self) -> torch.Tensor:
        """int64 [in]: the group of every input column (g_idx, or k // group_size)."""
        return (self.g_idx if self.g_idx is not None else self._static_g_idx()).long()

    # ---------------------------------------------------------------------------- definitions
    def dequantize(self) -> torch.Tensor:
        """float32 [out, in]: `scale * (code - zero)` per group chosen by g_idx
        (`scale * code - min` for a weight with mins)."""
        gi = self.group_index()
        if self.mins is not None:
            return self.scales[:, gi] * self.codes.float() - self.mins[:, gi]
        if self.levels is not None:
            return self.scales[:, gi] * self.levels[self.codes.long()]
        diff = self.codes.float() - self.zeros.float()[:, gi]
        return self.scales[:, gi] * diff

    def numpy(self) -> dict[str, np.ndarray]:
        """codes uint8 [out, in], scales float32 and zeros int32 [out, n_groups], g_idx int32 [in]
        (static grouping written out when g_idx is None); mins float32 [out, n_groups] too when
        the weight has them; levels float32 [2^bits] for a codebook weight."""
        gi = self.g_idx if self.g_idx is not None else self._static_g_idx()
        out = {"codes": self.codes.cpu().numpy(), "scales": self.scales.cpu().numpy(),
               "zeros": self.zeros.cpu().numpy(), "g_idx": gi.cpu().numpy()}
        if self.mins is not None:
            out["mins"] = self.mins.cpu().numpy()
        if self.levels is not None:
            out["levels"] = self.levels.cpu().numpy()
        return out

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def to(self, device: torch.device | str) -> QuantizedWeight:
        """The same weight with every tensor on `device` (itself when already there)."""
        if self.codes.device == torch.device(device):
            return self

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)
        return QuantizedWeight(move(self.codes), move(self.scales), move(self.zeros), self.bits,
                               self.group_size, self.sym, move(self.g_idx), self.kind, self.name,
                               move(self.mins), move(self.levels))

    def equals(self, other: QuantizedWeight) -> bool:
        """Bit-exact equality of codes, scales, zeros, mins, g_idx and the metadata."""
        same_gidx = (self.g_idx is None and other.g_idx is None) or (
            self.g_idx is not None and other.g_idx is not None
            and torch.equal(self.g_idx, other.g_idx))
        return (self.bits, self.group_size, self.sym, self.kind) == (
            other.bits, other.group_size, other.sym, other.kind) and same_gidx and torch.equal(
            self.codes, other.codes) and torch.equal(self.zeros, other.zeros) and torch.equal(
            self.scales.view(torch.int32), other.scales.view(torch.int32)) and _same_mins(
            self.mins, other.mins) and _same_mins(self.levels, other.levels)

    def cast_scales(self, dtype: torch.dtype) -> QuantizedWeight:
        """Same codes and zeros with scales rounded through `dtype` (e.g. torch.float16), so the
        weight fits formats that store fp16 scales. Adds error; the build records how much."""
        return QuantizedWeight(self.codes, self.scales.to(dtype).float(), self.zeros, self.bits,
                               self.group_size, self.sym, self.g_idx, self.kind, self.name,
                               None if self.mins is None else self.mins.to(dtype).float(),
                               self.levels)

    def rows(self, r0: int, r1: int, name: str = "") -> QuantizedWeight:
        """Output rows r0 .. r1 as their own weight (copies: formats save each linear apart)."""
        def part(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[r0:r1].clone()
        return QuantizedWeight(part(self.codes), part(self.scales), part(self.zeros), self.bits,
                               self.group_size, self.sym,
                               None if self.g_idx is None else self.g_idx.clone(), self.kind,
                               name or self.name, part(self.mins),
                               None if self.levels is None else self.levels.clone())

    def __repr__(self) -> str:
        order = (", act_order" if self.act_order else "") + (", mins" if self.mins is not None
                                                             else "")
        return (f"QuantizedWeight({self.name or '?'}: [{self.out_features}, {self.in_features}],"
                f" {self.kind} {self.bits}-bit, group_size={self.group_size}, sym={self.sym}"
                f"{order})")


def _same_mins(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def _as_tensor(value: object, dtype: torch.dtype, what: str, name: str) -> torch.Tensor:
    """Accept a torch tensor or numpy array; integer inputs must already be integers."""
    if isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value)
        if arr.dtype.kind == "u" and arr.dtype.itemsize > 1:
            arr = arr.astype(np.int64)  # torch has little uint16/32/64 support
        t = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
    else:
        t = value
    if not isinstance(t, torch.Tensor):
        raise QuantError(f"{what} of quantised weight {name!r} is a {type(value).__name__}; "
                         "expected a torch tensor or numpy array", "pass a tensor")
    if dtype is not torch.float32 and t.is_floating_point():
        raise QuantError(f"{what} of quantised weight {name!r} has dtype {t.dtype}; expected an "
                         "integer dtype", f"round and cast it to {dtype}")
    if dtype is not torch.float32 and t.numel():
        info = torch.iinfo(dtype)
        lo, hi = int(t.min()), int(t.max())
        if lo < info.min or hi > info.max:
            raise QuantError(f"{what} of quantised weight {name!r} span {lo}..{hi}, outside "
                             f"{dtype}", "clamp the values to the code range")
    return t.detach().to(dtype=dtype).contiguous()
