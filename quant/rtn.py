"""Uniform round-to-nearest quantiser (docs/quant.md §1): the shared primitive GPTQ/AWQ reuse.

Per row of a group `w_group` `[rows, cols]`, three grids (`Grid`):

`minmax` — the GPTQ reference (§1):

    xmin = min(min(w), 0); xmax = max(max(w), 0)          # the range always contains 0
    sym:  xmax = max(|xmin|, xmax); xmin = -xmax
    scale = (xmax - xmin) / (2^bits - 1)
    zero  = 2^(bits-1) if sym else round(-xmin / scale)
    q     = clamp(round(w / scale) + zero, 0, 2^bits - 1)  # dequantised: scale * (q - zero)

  Symmetric, it uses 15 of the 16 4-bit levels and clips +absmax to 7/7.5 of itself.

`ggml` — symmetric as ggml's Q4_0 (`d = max / -8`): `m` is the row's value of largest magnitude,
  with its sign, and `scale = m / -2^(bits-1)`, so code 0 is `m` exactly and all 2^bits levels are
  used (the scale is negative when `m > 0`). Asymmetric: as `minmax` (ggml's Q4_1 is min/max).

`mse` — `ggml`'s grid with the scale searched per row, as llama.cpp's `make_qx_quants` does
  (sym) and `make_qkx2_quants` (asym): for 19 (sym) or 21 (asym) trial scales around the start,
  round, refit the scale (and the minimum) by weighted least squares for those codes, and keep
  the fit with the smallest weighted squared error `sum(importance * (w - dequant)^2)`.
  `importance` `[cols]` or `[rows, cols]` (e.g. GPTQ's Hessian diagonal, the activations' mean
  square); None weighs every weight alike.

`round` is torch.round (half to even), as in the GPTQ reference. Two cases §1 leaves open follow
the GPTQ reference (`IST-DASLab/gptq`, quant.py): an all-zero row gets xmin=-1, xmax=+1 (so the
scale is finite and every code equals the zero point). One deliberate difference: for sym the
reference keeps `xmin = 0` when a row has no negative value (and then clips its upper half);
§1 says `xmin = -xmax` unconditionally and that is what this module does.

`scale_dtype` (e.g. torch.float16) rounds the scale through that dtype *before* the zero point
and codes are computed, so formats storing fp16 scales (GPTQ, AWQ, Marlin, GGUF, MLX) hold the
weight without further loss.

`fmt` (a storage format or its name; `group_params`, `quantize_rtn`, and GPTQ through
`group_params`) makes the parameters representable in that format *before* the codes are
chosen: the groups' scales (and, for a `float_mins` format, float minimums instead of integer
zero points: value = scale*code - min, min = -xmin of the grid's range) go through
`fmt.snap_params` (the GGUF K-quants quantise them per 256-weight super-block to fp16 d x 6/8-bit
sub-scales), and the codes are rounded for the snapped values. A group whose scale snaps to 0
gets code = zero (value 0; with mins, code 0, value -min).

A codebook format (`constraints.levels`, GGUF IQ4_NL: 16 fixed non-uniform levels, value =
scale * level) takes one scale per group and the code of the nearest level (ties to the upper
one, as ggml's best_index_iq4nl). Its scale (`_search_levels`, llama.cpp's
quantize_row_iq4_nl_impl): the group's value of largest magnitude `m` goes to the table's
largest-magnitude level `l0`; on the `mse` grid 15 more trial scales map `m` to `l0 + t`, t = -7..7,
each refit by weighted least squares for its codes, and the fit with the largest `sumqx^2 /
sumq2` (the smallest weighted error) is kept. Without `importance` the weights are w^2, as
llama.cpp's without an imatrix.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np
import torch

from .weight import UNIFORM_BITS, Kind, QuantError, QuantizedWeight

if TYPE_CHECKING:
    from .formats.base import Format


Grid = Literal["minmax", "ggml", "mse"]
GRIDS: tuple[str, ...] = get_args(Grid)


def _check_bits(bits: int) -> None:
    if bits not in UNIFORM_BITS:
        raise QuantError(f"bits={bits} is not supported by the uniform quantiser; allowed "
                         f"{UNIFORM_BITS}", "pick one of the allowed bit widths")


def find_params(w_group: torch.Tensor, bits: int, sym: bool,
                scale_dtype: torch.dtype | None = None, grid: Grid = "minmax",
                importance: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point per row of `w_group` [rows, cols] on `grid` (module docstring) ->
    (scale fp32 [rows, 1], zero fp32 [rows, 1], integer-valued)."""
    _check_bits(bits)
    if grid not in GRIDS:
        raise QuantError(f"grid={grid!r} is not a quantisation grid; allowed {list(GRIDS)}",
                         "use minmax (GPTQ's reference), ggml (Q4_0's) or mse (searched)")
    w = w_group.float()
    if w.dim() == 1:
        w = w[None]
    maxq = (1 << bits) - 1
    if grid == "minmax" or (grid == "ggml" and not sym):
        scale, xmin = _minmax(w, bits, sym)
    elif sym:
        scale, xmin = _signed_max(w, bits), None
        if grid == "mse":
            scale = _search_sym(w, bits, scale, _weights(w, importance))
    else:
        scale, xmin = _search_asym(w, bits, _weights(w, importance))
    if scale_dtype is not None:
        tiny = torch.finfo(scale_dtype).smallest_normal
        scale = scale.to(scale_dtype).float()
        # A row of denormal-small weights can round to a zero scale: keep it nonzero.
        scale = torch.where(scale == 0, tiny, scale)
    if sym:
        zero = torch.full_like(scale, float(1 << (bits - 1)))
    else:
        zero = torch.clamp(torch.round(-xmin / scale), 0, maxq)
    return scale[:, None], zero[:, None]


def _minmax(w: torch.Tensor, bits: int, sym: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """§1's scale and range minimum per row (the GPTQ reference)."""
    zero_ = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device)
    xmin = torch.minimum(w.amin(dim=1), zero_)
    xmax = torch.maximum(w.amax(dim=1), zero_)
    if sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = -xmax
    dead = (xmin == 0) & (xmax == 0)
    xmin = torch.where(dead, -1.0, xmin)
    xmax = torch.where(dead, 1.0, xmax)
    return (xmax - xmin) / ((1 << bits) - 1), xmin


def _signed_max(w: torch.Tensor, bits: int) -> torch.Tensor:
    """ggml's symmetric scale per row: the value of largest magnitude over -2^(bits-1)."""
    m = w.gather(1, w.abs().argmax(dim=1, keepdim=True))[:, 0]
    m = torch.where(m == 0, -1.0, m)  # an all-zero row: any finite scale
    return m / -float(1 << (bits - 1))


def _weights(w: torch.Tensor, importance: torch.Tensor | None) -> torch.Tensor:
    if importance is None:
        return torch.ones_like(w)
    return importance.float().expand_as(w).clamp_min(0)


SEARCH_ROWS = 4096  # rows (groups) a scale search takes at a time (`_in_row_chunks`)


def _in_row_chunks(search: Callable) -> Callable:
    """`search(w [rows, cols], bits, *row_args, **kw)` run on SEARCH_ROWS rows at a time, its
    per-row results concatenated. Each row's search is independent, so the results are the
    same bits; its ~20 temporaries per trial then stay in cache (benchmarks/rtn_speed.py, an
    8B down_proj, 4096 x 16384, on 2 cores: g64 asym 10.4 s against 57.7 s in one piece)."""
    @functools.wraps(search)
    def chunked(w: torch.Tensor, bits: int, *row_args: torch.Tensor, **kw: Any):
        if w.shape[0] <= SEARCH_ROWS:
            return search(w, bits, *row_args, **kw)
        parts = [search(w[i:i + SEARCH_ROWS], bits, *(a[i:i + SEARCH_ROWS] for a in row_args),
                        **kw) for i in range(0, w.shape[0], SEARCH_ROWS)]
        if isinstance(parts[0], tuple):
            return tuple(torch.cat(p) for p in zip(*parts))
        return torch.cat(parts)
    return chunked


@_in_row_chunks
def _search_sym(w: torch.Tensor, bits: int, start: torch.Tensor,
                wt: torch.Tensor) -> torch.Tensor:
    """make_qx_quants: codes from 19 trial scales around `start`, each refit by weighted least
    squares; the refit scale with the smallest weighted error per row."""
    half = float(1 << (bits - 1))
    m = start * -half  # the signed max
    best, best_err = start.clone(), _sym_error(w, start, half, wt)
    for step in range(-9, 10):
        trial = m / -(half + 0.1 * step)
        q = torch.clamp(torch.round(w / trial[:, None]), -half, half - 1)
        den = (wt * q * q).sum(dim=1)
        fit = torch.where(den > 0, (wt * w * q).sum(dim=1) / den.clamp_min(1e-30), start)
        err = _sym_error(w, fit, half, wt)
        better = err < best_err
        best, best_err = torch.where(better, fit, best), torch.where(better, err, best_err)
    return best


def _sym_error(w: torch.Tensor, scale: torch.Tensor, half: float, wt: torch.Tensor) -> torch.Tensor:
    s = torch.where(scale == 0, 1.0, scale)[:, None]
    q = torch.clamp(torch.round(w / s), -half, half - 1)
    return (wt * (w - s * q) ** 2).sum(dim=1)


@_in_row_chunks
def _search_asym(w: torch.Tensor, bits: int, wt: torch.Tensor,
                 float_min: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """make_qkx2_quants: (scale, min) per row, min <= 0, from 21 trial scales over the row's
    range, each refit (scale and min together) by weighted least squares for its codes.
    Each fit is scored as it will be stored: with the zero point round(-min / scale) (integer
    zeros), or with the float min itself (`float_min`, K-quants)."""
    error = _float_min_error if float_min else _asym_error
    maxq = float((1 << bits) - 1)
    lo = w.amin(dim=1).clamp(max=0.0)
    hi = w.amax(dim=1).clamp(min=0.0)
    span = torch.where(hi > lo, hi - lo, 1.0)
    best_s, best_min = span / maxq, lo
    best_err = error(w, best_s, best_min, maxq, wt)
    sw, sx = wt.sum(dim=1), (wt * w).sum(dim=1)
    for step in range(21):
        iscale = (maxq - 1 + 0.1 * step) / span  # rmin -1, rdelta 0.1, as llama.cpp's Q4_K
        q = torch.clamp(torch.round((w - lo[:, None]) * iscale[:, None]), 0, maxq)
        sl, sl2, sxl = (wt * q).sum(dim=1), (wt * q * q).sum(dim=1), (wt * q * w).sum(dim=1)
        det = sw * sl2 - sl * sl
        ok = det > 0
        det = torch.where(ok, det, 1.0)
        scale = (sw * sxl - sx * sl) / det
        mn = (sl2 * sx - sl * sxl) / det
        fix = mn > 0  # the range keeps 0: refit the scale alone with min 0
        scale = torch.where(fix, sxl / sl2.clamp_min(1e-30), scale)
        mn = torch.where(fix, 0.0, mn)
        ok = ok & (scale > 0)
        err = error(w, torch.where(ok, scale, best_s), torch.where(ok, mn, best_min), maxq, wt)
        better = ok & (err < best_err)
        best_s = torch.where(better, scale, best_s)
        best_min = torch.where(better, mn, best_min)
        best_err = torch.where(better, err, best_err)
    return best_s, best_min


def _asym_error(w: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor, maxq: float,
                wt: torch.Tensor) -> torch.Tensor:
    zero = torch.clamp(torch.round(-mn / scale), 0, maxq)[:, None]
    q = torch.clamp(torch.round(w / scale[:, None]) + zero, 0, maxq)
    return (wt * (w - scale[:, None] * (q - zero)) ** 2).sum(dim=1)


def _float_min_error(w: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor, maxq: float,
                     wt: torch.Tensor) -> torch.Tensor:
    q = torch.clamp(torch.round((w - mn[:, None]) / scale[:, None]), 0, maxq)
    return (wt * (w - (scale[:, None] * q + mn[:, None])) ** 2).sum(dim=1)


def quantize_with(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                  bits: int) -> torch.Tensor:
    """Codes uint8, same shape as `w`: clamp(round(w / scale) + zero, 0, 2^bits - 1).
    `scale`, `zero` broadcast against `w` (e.g. [rows, 1] for a column group); where the scale
    is 0 (a snapped K-quant sub-scale) the code is the zero point."""
    _check_bits(bits)
    dead = scale == 0
    if bool(dead.any()):
        q = torch.where(dead, zero, torch.round(w.float() / torch.where(dead, 1.0, scale)) + zero)
    else:
        q = torch.round(w.float() / scale) + zero
    return torch.clamp(q, 0, (1 << bits) - 1).to(torch.uint8)


def quantize_with_min(w: torch.Tensor, scale: torch.Tensor, low: torch.Tensor,
                      bits: int) -> torch.Tensor:
    """Codes uint8 for value = scale*code - low: clamp(round((w + low) / scale), 0, 2^bits - 1)
    (llama.cpp's Q4_K rounding); code 0 where the scale is 0. Broadcasts as quantize_with."""
    _check_bits(bits)
    dead = scale == 0
    q = torch.round((w.float() + low) / torch.where(dead, 1.0, scale))
    return torch.clamp(torch.where(dead, 0.0, q), 0, (1 << bits) - 1).to(torch.uint8)


def nearest_level(x: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Index (int64, same shape as `x`) of the level of ascending `levels` nearest to each value;
    a value halfway between two levels takes the upper one (ggml's best_index_iq4nl)."""
    mids = (levels[1:] + levels[:-1]) / 2
    return torch.bucketize(x.float().contiguous(), mids, right=True)


def quantize_to_levels(w: torch.Tensor, scale: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Codes uint8 for value = scale * levels[code]: the level nearest to w / scale (the level
    nearest to 0 where the scale is 0). Broadcasts as quantize_with."""
    dead = scale == 0
    x = w.float() / torch.where(dead, 1.0, scale)
    return nearest_level(torch.where(dead, 0.0, x), levels).to(torch.uint8)


def _search_levels(w: torch.Tensor, levels: torch.Tensor, wt: torch.Tensor | None,
                   search: bool, chunk: int = 16384) -> torch.Tensor:
    """Scale per row of `w` [rows, cols] for value = scale * level (module docstring); rows are
    searched `chunk` at a time (16 trials x cols floats each)."""
    if w.shape[0] > chunk:
        return torch.cat([_search_levels(w[r:r + chunk], levels,
                                         None if wt is None else wt[r:r + chunk], search, chunk)
                          for r in range(0, w.shape[0], chunk)])
    edge = levels[0] if levels[0].abs() >= levels[-1].abs() else levels[-1]
    m = w.gather(1, w.abs().argmax(dim=1, keepdim=True))[:, 0]
    start = m / edge
    if not search:
        return start
    wt = w * w if wt is None else wt
    safe_m = torch.where(m == 0, 1.0, m)
    trials = torch.arange(-7, 8, dtype=torch.float32, device=w.device)
    inv = torch.cat([(-edge / safe_m)[:, None], (edge + trials)[None, :] / safe_m[:, None]], 1)
    q = levels[nearest_level(inv[:, :, None] * w[:, None, :], levels)]  # [rows, trials, cols]
    sumqx = (wt[:, None, :] * q * w[:, None, :]).sum(dim=2)
    sumq2 = (wt[:, None, :] * q * q).sum(dim=2)
    score = torch.where(sumq2 > 0, sumqx * sumqx / sumq2.clamp_min(1e-30), -1.0)
    best = score.argmax(dim=1, keepdim=True)
    fit = (sumqx.gather(1, best) / sumq2.gather(1, best).clamp_min(1e-30))[:, 0]
    ok = (score.gather(1, best)[:, 0] > 0) & (m != 0)
    return torch.where(ok, fit, torch.where(m == 0, 0.0, start))


def format_levels(fmt: Format | None,
                  device: torch.device | str = "cpu") -> torch.Tensor | None:
    """A codebook format's table of levels, float32 [2^bits] on `device`; None for every other
    format."""
    lv = None if fmt is None else fmt.constraints.levels
    return None if lv is None else torch.tensor(lv, dtype=torch.float32, device=device)


def resolve_format(fmt: Format | str | None) -> Format | None:
    """A format instance from a format or its registered name (None stays None)."""
    if fmt is None or not isinstance(fmt, str):
        return fmt
    from .formats.registry import get_format

    return get_format(fmt)


def _scale_min(w: torch.Tensor, bits: int, grid: Grid,
               importance: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, min >= 0) per row of `w` [rows, cols] for value = scale*code - min: the asym
    grid's scale and range minimum (mse: make_qkx2_quants' search; else min/max)."""
    if grid == "mse":
        scale, xmin = _search_asym(w, bits, _weights(w, importance), float_min=True)
    else:
        scale, xmin = _minmax(w, bits, False)
    return scale, (-xmin).clamp_min(0)


def group_params(w: torch.Tensor, bits: int, size: int, sym: bool, *,
                 scale_dtype: torch.dtype | None = None, grid: Grid = "minmax",
                 importance: torch.Tensor | None = None, fmt: Format | str | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Parameters of the groups of `size` consecutive columns of `w` [rows, cols] ->
    (scales fp32 [rows, n], zeros fp32 [rows, n] integer-valued, mins fp32 [rows, n] or None),
    n = cols / size. importance: [cols] or None. With `fmt`, snapped to what it stores (module
    docstring); a `float_mins` format gives mins and zeros of 0."""
    _check_bits(bits)
    fmt = resolve_format(fmt)
    rows, cols = w.shape
    n = cols // size
    groups = w.float().reshape(rows, n, size).reshape(-1, size)
    imp = None
    if importance is not None:
        imp = importance.float().reshape(1, n, size).expand(rows, -1, -1).reshape(-1, size)
    levels = format_levels(fmt, w.device)
    if levels is not None:
        scale = _search_levels(groups, levels, None if imp is None else imp.clamp_min(0),
                               grid == "mse")
        if scale_dtype is not None:
            scale = scale.to(scale_dtype).float()
        zero = torch.full((rows, n), float(1 << (bits - 1)), device=w.device)
        return scale.reshape(rows, n), zero, None
    if fmt is not None and fmt.constraints.float_mins:
        scale, low = _scale_min(groups, bits, grid, imp)
        if scale_dtype is not None:
            scale = scale.to(scale_dtype).float()
        s, m = fmt.snap_params(scale.reshape(rows, n).cpu().numpy(),
                               low.reshape(rows, n).cpu().numpy())
        return (_from_numpy(s, w.device), torch.zeros(rows, n, device=w.device),
                _from_numpy(m, w.device))
    scale, zero = find_params(groups, bits, sym, scale_dtype, grid, imp)
    scale, zero = scale.reshape(rows, n), zero.reshape(rows, n)
    if fmt is not None:
        s, _ = fmt.snap_params(scale.cpu().numpy())
        scale = _from_numpy(s, w.device)
    return scale, zero, None


def _from_numpy(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """float32 tensor on `device` from a numpy array (the formats snap parameters in numpy)."""
    return torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(device)


def quantize_rtn(w: torch.Tensor, bits: int, group_size: int = 128, sym: bool = True, *,
                 scale_dtype: torch.dtype | None = None, grid: Grid = "minmax",
                 importance: torch.Tensor | None = None, name: str = "",
                 fmt: Format | str | None = None) -> QuantizedWeight:
    """Round-to-nearest quantisation of `w` [out, in] per row and group of `group_size` input
    columns (-1 = whole row) on `grid` -> QuantizedWeight with static groups (g_idx None).
    importance: [in] per input column (e.g. activations' mean square), or None. fmt: the
    storage format whose parameter snapping applies (module docstring), e.g. "gguf-q4_k"."""
    _check_bits(bits)
    if w.dim() != 2:
        raise QuantError(f"weight {name!r} has shape {tuple(w.shape)}; quantize_rtn takes a 2-D "
                         "[out_features, in_features] weight", "reshape it to [out, in]")
    out, inp = w.shape
    if group_size != -1 and (group_size <= 0 or inp % group_size):
        ok = [g for g in (32, 64, 128, 256) if inp % g == 0]
        raise QuantError(f"group_size={group_size} does not divide in_features={inp} of "
                         f"{name or 'the weight'!r}", f"use -1 or one of {ok or 'its divisors'}")
    size = inp if group_size == -1 else group_size
    scale, zero, low = group_params(w, bits, size, sym, scale_dtype=scale_dtype, grid=grid,
                                    importance=importance, fmt=fmt)
    groups = w.float().reshape(out, inp // size, size)
    levels = format_levels(resolve_format(fmt), w.device)
    if levels is not None:
        codes = quantize_to_levels(groups, scale[..., None], levels)
    elif low is not None:
        codes = quantize_with_min(groups, scale[..., None], low[..., None], bits)
    else:
        codes = quantize_with(groups, scale[..., None], zero[..., None], bits)
    return QuantizedWeight(codes=codes.reshape(out, inp), scales=scale,
                           zeros=zero.to(torch.int32), bits=bits, group_size=group_size,
                           sym=sym, name=name, mins=low, levels=levels,
                           kind=Kind.UNIFORM if levels is None else Kind.CODEBOOK)
