"""GPTQ (Frantar et al., reference `IST-DASLab/gptq`), docs/quant.md §2.

`gptq_quantize(w, H, ...)` quantises one linear layer given its Hessian `H = (2/N) Σ x xᵀ`:

1. dead columns (`H[i,i] == 0`): `H[i,i] = 1`, weight column zeroed;
2. act-order: columns permuted by descending `diag(H)` (stable sort);
3. damping `damp · mean(diag(H))` on the diagonal; if a Cholesky factorisation fails the damping
   is multiplied by 10 and tried again (up to 1.0 · mean(diag) and beyond, 8 tries);
4. `U = cholesky_upper(inverse(H))`; columns processed in blocks (128) with lazy batch updates:
   quantise column i, `e = (w - q) / U[i,i]`, `W[:, i:] -= e ⊗ U[i, i:]` inside the block, then
   `W[:, later] -= E_block @ U[block, later]` once per block.

Group parameters (scale, zero) come from `rtn.find_params` so codes and scales follow §1 exactly:
- natural order (no act-order), or act-order without static groups: parameters are computed when
  the group's first column is reached, from the error-compensated weights at that moment; with
  act-order the groups are consecutive *permuted* columns and `g_idx[k]` records each column's group;
- static groups (`static_groups=True`, and always for `group_size=-1`): parameters of the groups
  `k // group_size` are computed up front from the original weights; `g_idx = k // group_size`.

With a storage format `fmt` whose parameters are quantised (GGUF K-quants: sub-scales per
256-weight super-block, rtn.group_params), the parameters are snapped to the format before any
code is chosen: with static groups all at once; otherwise per super-block when its first column
is reached (from the error-compensated weights, as a group's parameters otherwise), so GPTQ's
codes and error feedback use exactly the values the format stores. Float-min formats (Q4_K /
Q5_K) round `clamp(round((w + min) / scale))` and feed back `w - (scale*q - min)`; codebook
formats (IQ4_NL) take the nearest level and feed back `w - scale * level`.

The block size is adjusted so a group never straddles a block boundary except at a block start
(then the group's parameters read fully updated weights), which keeps the blocked algorithm equal,
up to float rounding, to the plain column-by-column one.
"""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from arkinfer.torch_threads import one_torch_thread

from ..rtn import (
    Grid,
    find_params,
    format_levels,
    group_params,
    quantize_rtn,
    quantize_to_levels,
    resolve_format,
)
from ..weight import UNIFORM_BITS, Kind, QuantError, QuantizedWeight
from .base import BlockCalibrator, BlockResult, CalibContext
from .block import SEQUENTIAL_GROUPS, BlockRunner
from .hessian import prefix_split
from .refit import refit_scales, refittable
from .sequential import SequentialForward, supports

DEFAULT_BLOCK = 128


@dataclass(frozen=True)
class GPTQResult:
    """weight: the canonical result; damp: the damping fraction finally used (>= the requested
    one when Cholesky needed a retry); dead_columns: inputs never active; loss: GPTQ's proxy
    `Σ (w - q)² / (2 U[i,i]²)`."""

    weight: QuantizedWeight
    damp: float
    dead_columns: int
    loss: float


def inverse_cholesky(h: torch.Tensor, damp: float, name: str = "",
                     tries: int = 8) -> tuple[torch.Tensor, float]:
    """Upper Cholesky factor of `inverse(H + damp·mean(diag H)·I)` [n, n], and the damping used.

    `h` is damped IN PLACE (callers pass a private copy; no second n x n copy is made). Retries
    with 10x the damping when a factorisation fails (ill-conditioned H, e.g. few tokens).
    """
    if damp < 0:
        raise QuantError(f"damp={damp} for {name or 'a layer'!r} is negative",
                         "use a damping fraction such as 0.01")
    mean_diag = torch.mean(torch.diag(h))
    diag = h.diagonal()
    d, added = damp, 0.0
    for _ in range(tries):
        diag += (d - added) * mean_diag
        added = d
        lower, info = torch.linalg.cholesky_ex(h)
        if int(info) == 0:
            inv = torch.cholesky_inverse(lower)
            del lower
            upper, info = torch.linalg.cholesky_ex(inv, upper=True)
            del inv
            if int(info) == 0 and bool(torch.isfinite(upper).all()):
                return upper, d
        d = d * 10 if d > 0 else 0.01
    raise QuantError(f"the Hessian of {name or 'a layer'!r} is not positive definite even with "
                     f"damping {added:g} x mean(diag)", "give more calibration tokens (--samples) "
                     "or check the layer's inputs for inf/nan")


def asymmetric_correction(h: Tensor, cross: Tensor, damp: float) -> Tensor:
    """`(C - H)(H + λI)⁻¹` float64 [in, in] for `asymmetric_target` (one per shared input: the
    linears reading it, q/k/v or gate/up, each add `W @` this to their weight)."""
    hd = h.double().clone()
    diag = torch.diagonal(hd)
    dead = diag == 0
    mean = float(diag[~dead].mean()) if bool((~dead).any()) else 1.0
    diag.add_(damp * mean)
    diag[dead] = 1.0
    delta = (cross.double() - h.double()).T          # (C - H)ᵀ
    return torch.linalg.solve(hd, delta).T           # (C - H)(H + λI)⁻¹, hd symmetric


def asymmetric_target(w: Tensor, correction: Tensor) -> Tensor:
    """The weight GPTQ should reach when its inputs carry the earlier layers' quantisation
    error (GPTAQ, Li et al. 2025: asymmetric calibration). GPTQ minimises `‖(W - Q) X_q‖²` on
    the quantised model's inputs `X_q`; the float model computes `W X_f` from its own inputs
    `X_f`. `‖W X_f - Q X_q‖² = ‖(W* - Q) X_q‖² + const` for the least-squares
    `W* = W C H⁻¹` (`C = Σ x_f x_qᵀ`, `H = Σ x_q x_qᵀ`), so GPTQ of `W*` under `H` minimises
    the asymmetric objective exactly. Computed as `W + W (C - H)(H + λI)⁻¹` (λ = `damp` x
    mean diag H, GPTQ's damping; dead columns get 1 on the diagonal), which is `W` itself
    when the two paths' inputs agree. w [out, in]; `correction` from `asymmetric_correction`
    (h, cross [in, in] scaled alike)."""
    return (w.double() + w.double() @ correction).to(w.dtype)


def block_size_for(group_size: int, block_size: int = DEFAULT_BLOCK) -> int:
    """A block size such that every group either lies inside one block or starts a block."""
    if group_size == -1 or block_size % group_size == 0 or group_size % block_size == 0:
        return block_size
    return group_size * max(1, block_size // group_size)


def gptq_quantize(w: torch.Tensor, hessian: torch.Tensor, *, bits: int = 4,
                  group_size: int = 128, sym: bool = True, act_order: bool = False,
                  static_groups: bool = False, damp: float = 0.01,
                  block_size: int = DEFAULT_BLOCK, scale_dtype: torch.dtype | None = None,
                  dtype: torch.dtype = torch.float32, grid: Grid = "minmax",
                  name: str = "", fmt=None, refit: bool = False,
                  static_passes: int = 1) -> GPTQResult:
    """GPTQ of `w` [out, in] with Hessian [in, in] -> canonical weight (codes in the original
    column order). `dtype` is the working precision of the error updates (float32 as the
    reference; float64 for tests). `grid`: how each group's scale is chosen (rtn.find_params;
    `mse` weighs each column's error by the Hessian's diagonal, its input's mean square).
    `fmt`: storage format (or name) whose parameter snapping applies (module docstring), e.g.
    "gguf-q6_k"; None = none. `refit`: the scales are then refitted to the codes by least
    squares of the same objective (quant/calib/refit.py). `static_passes` (static groups
    only): 2 or more runs GPTQ again with every group's parameters re-chosen from the weights
    as the previous pass's error feedback left them just before rounding, instead of from the
    original weights."""
    if bits not in UNIFORM_BITS:
        raise QuantError(f"bits={bits} for {name or 'a layer'!r} is not supported by GPTQ; "
                         f"allowed {UNIFORM_BITS}", "pick one of the allowed bit widths")
    if w.dim() != 2:
        raise QuantError(f"weight {name!r} has shape {tuple(w.shape)}; GPTQ takes [out, in]",
                         "reshape it to [out_features, in_features]")
    out, cols = w.shape
    if tuple(hessian.shape) != (cols, cols):
        raise QuantError(f"Hessian of {name!r} has shape {tuple(hessian.shape)}; expected "
                         f"[{cols}, {cols}] for in_features={cols}",
                         "accumulate it from this layer's inputs")
    if group_size != -1 and (group_size <= 0 or cols % group_size):
        ok = [g for g in (32, 64, 128, 256) if cols % g == 0]
        raise QuantError(f"group_size={group_size} does not divide in_features={cols} of "
                         f"{name or 'the weight'!r}", f"use -1 or one of {ok or 'its divisors'}")
    size = cols if group_size == -1 else group_size
    n_groups = cols // size
    fmt = resolve_format(fmt)
    span = size  # columns whose parameters are computed together
    if fmt is not None and fmt.constraints.super_block and group_size != -1:
        span = math.lcm(size, fmt.constraints.super_block)
        if cols % span:
            raise QuantError(f"in_features={cols} of {name or 'the weight'!r} is not a multiple "
                             f"of {fmt.name}'s {span}-column super-block",
                             "keep this layer in float or pick a 32-block GGUF type (Q5_0, Q8_0)")
        if act_order and not static_groups:
            raise QuantError(f"{fmt.name} for {name or 'a layer'!r} needs static groups with "
                             "act-order (its parameters are snapped per super-block)",
                             "pass static_groups=True or act_order=False")
    W = w.detach().to(dtype).clone()
    dead = torch.diag(hessian) == 0
    W[:, dead] = 0

    diag_h = torch.diag(hessian).to(dtype).clone()
    diag_h[dead] = 1
    dev = W.device
    scales = torch.zeros(out, n_groups, dtype=torch.float32, device=dev)
    zeros = torch.zeros(out, n_groups, dtype=torch.float32, device=dev)
    mins = torch.zeros(out, n_groups, device=dev) \
        if fmt is not None and fmt.constraints.float_mins else None
    static = group_size == -1 or static_groups
    params = _Params(scales, zeros, mins, size, span, fmt)
    if static:
        _static_params(params, W, bits, sym, scale_dtype, grid, diag_h, fmt)

    perm = torch.argsort(diag_h, descending=True, stable=True) if act_order else None
    if perm is not None:
        W = W[:, perm]
        H = hessian.detach()[perm][:, perm].to(dtype)
    else:
        H = hessian.detach().to(dtype, copy=True)
    H.diagonal().copy_(diag_h if perm is None else diag_h[perm])  # dead columns: H[i,i] = 1
    with single_thread(below=cols):  # small: threads only add waits; large: they halve it
        U, damp_used = inverse_cholesky(H, damp, name)
    del H

    diag_p = diag_h if perm is None else diag_h[perm]  # importance in the permuted order
    perm_list = perm.tolist() if perm is not None else None
    block = block_size_for(span if group_size != -1 else group_size, block_size)
    passes = max(1, static_passes) if static else 1
    start = W.clone() if passes > 1 else W
    for p in range(passes):
        W = start.clone() if p < passes - 1 else start
        fed = torch.empty_like(W) if p < passes - 1 else None
        codes, loss = _column_loop(W, U, block, params, static, perm_list, bits, sym,
                                   scale_dtype, dtype, grid, diag_p, fed)
        if fed is not None:  # next pass: parameters from the error-fed weights
            fed_natural = fed if perm is None else fed[:, torch.argsort(perm)]
            _static_params(params, fed_natural, bits, sym, scale_dtype, grid, diag_h, fmt)

    g_idx = None
    if perm is not None:
        inv = torch.argsort(perm)
        codes = codes[:, inv]
        if not static:
            g_idx = (inv // size).to(torch.int32)  # column k sits at permuted position inv[k]
    qw = QuantizedWeight(codes=codes, scales=scales, zeros=zeros.to(torch.int32), bits=bits,
                         group_size=group_size, sym=sym, g_idx=g_idx, name=name, mins=mins,
                         levels=params.levels,
                         kind=Kind.UNIFORM if params.levels is None else Kind.CODEBOOK)
    if refit and refittable(qw, fmt):
        h = hessian.detach().float().clone()
        h.diagonal().copy_(diag_h)  # dead columns: H[i,i] = 1, as in the column loop
        qw, _ = refit_scales(qw, w.detach().masked_fill(dead[None, :], 0), h, scale_dtype,
                             damp=damp_used)
    return GPTQResult(qw, damp_used, int(dead.sum()), float(loss))


# From this many input columns on, the inverse Cholesky factor and the lazy updates run on
# torch's threads: 2 threads took 0.57x the time of one for 4096 columns and 0.50x for 8192 and
# 16384 (an 8B model's down_proj: 47 s instead of 93 s) on a 2-core AMD EPYC VM; below it the
# matrices are small enough that threads mostly wait.
THREADED_COLUMNS = 2048


@contextmanager
def single_thread(below: int | None = None):
    """Run the body with one torch thread (restored afterwards); with `below`, only when that
    many columns are fewer than THREADED_COLUMNS (else the body keeps torch's threads)."""
    if below is not None and below >= THREADED_COLUMNS:
        yield
        return
    with one_torch_thread():
        yield


@dataclass
class _Params:
    """The group parameters GPTQ fills and reads: scales / zeros (/ mins, float-min formats)
    [out, n_groups]; groups of `size` columns, computed `span` columns at a time (the format's
    super-block when `fmt` snaps them, else one group)."""

    scales: Tensor
    zeros: Tensor
    mins: Tensor | None
    size: int
    span: int
    fmt: object = None

    @property
    def levels(self) -> Tensor | None:
        """The codebook format's table of levels (value = scale * level), else None."""
        return format_levels(self.fmt, self.scales.device)

    def fill(self, src: Tensor, c: int, bits: int, sym: bool, scale_dtype: torch.dtype | None,
             grid: Grid, importance: Tensor) -> None:
        """Parameters of the groups of columns c .. c + span from `src` [out, span]."""
        g0, n = c // self.size, src.shape[1] // self.size
        if self.fmt is None:
            s2, z2 = find_params(src, bits, sym, scale_dtype, grid, importance)
            self.scales[:, g0], self.zeros[:, g0] = s2[:, 0], z2[:, 0]
            return
        s, z, m = group_params(src, bits, self.size, sym, scale_dtype=scale_dtype, grid=grid,
                               importance=importance, fmt=self.fmt)
        self.scales[:, g0:g0 + n], self.zeros[:, g0:g0 + n] = s, z
        if self.mins is not None:
            self.mins[:, g0:g0 + n] = m


def _static_params(params: _Params, w: Tensor, bits: int, sym: bool,
                   scale_dtype: torch.dtype | None, grid: Grid, importance: Tensor,
                   fmt) -> None:
    """Every group's parameters at once from `w` [out, cols] (natural column order), in place."""
    if fmt is not None:
        s, z, m = group_params(w, bits, params.size, sym, scale_dtype=scale_dtype, grid=grid,
                               importance=importance, fmt=fmt)
        params.scales.copy_(s)
        params.zeros.copy_(z)
        if params.mins is not None:
            params.mins.copy_(m)
        return
    size = params.size
    for g in range(w.shape[1] // size):
        cols_g = slice(g * size, (g + 1) * size)
        s, z = find_params(w[:, cols_g], bits, sym, scale_dtype, grid, importance[cols_g])
        params.scales[:, g], params.zeros[:, g] = s[:, 0], z[:, 0]


def _column_loop(W: Tensor, U: Tensor, block: int, params: _Params, static: bool,
                 perm_list: list[int] | None, bits: int, sym: bool,
                 scale_dtype: torch.dtype | None, dtype: torch.dtype, grid: Grid,
                 importance: Tensor, fed: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """GPTQ over all (permuted) columns of `W` [out, cols], updated in place: codes uint8
    [out, cols] (permuted order) and the proxy loss. `fed` [out, cols], when given, receives
    each column as error feedback left it just before rounding."""
    out, cols = W.shape
    codes = torch.zeros(out, cols, dtype=torch.uint8, device=W.device)
    loss = torch.zeros((), dtype=torch.float64, device=W.device)
    for i1 in range(0, cols, block):
        i2 = min(i1 + block, cols)
        with single_thread():  # the column loop is ~10 tiny ops per column: threads only wait
            q1, err_block = _solve_block(W, U, i1, i2, params, static, perm_list,
                                         bits, sym, scale_dtype, dtype, grid, importance, fed)
        codes[:, i1:i2] = q1.T
        loss += (err_block.double() ** 2).sum() / 2
        with single_thread(below=cols):  # the lazy update: out x (cols - i2) x block MACs
            W[:, i2:] -= err_block.T @ U[i1:i2, i2:]
    return codes, loss


def _solve_block(W: Tensor, U: Tensor, i1: int, i2: int, params: _Params, static: bool,
                 perm_list: list[int] | None, bits: int, sym: bool,
                 scale_dtype: torch.dtype | None, dtype: torch.dtype, grid: Grid,
                 importance: Tensor, fed: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """GPTQ's column loop over the (permuted) columns i1..i2 of `W` [out, cols]: codes uint8 and
    scaled errors `(w - q) / U[i,i]`, both [i2 - i1, out] (one row per column). The block is
    worked on transposed, so every column is a contiguous row; fills `params` for the spans
    that start inside the block (unless `static`)."""
    maxq = (1 << bits) - 1
    W1 = W[:, i1:i2].T.contiguous()  # [b, out]
    U1 = U[i1:i2, i1:i2]
    codes = torch.empty(i2 - i1, W.shape[0], dtype=torch.uint8, device=W.device)
    errors = torch.empty_like(W1)
    s = z = m = None
    size, span, snapped = params.size, params.span, params.fmt is not None
    levels = params.levels
    for i in range(i2 - i1):
        c = i1 + i
        if not static and c % span == 0:
            src = W[:, c:c + span] if i == 0 else W1[i:i + span].T
            params.fill(src, c, bits, sym, scale_dtype, grid, importance[c:c + span])
        if static or c % size == 0:
            g = (perm_list[c] if perm_list is not None and static else c) // size
            s, z = params.scales[:, g], params.zeros[:, g]
            m = None if params.mins is None else params.mins[:, g]
            if snapped:  # a sub-scale snapped to 0: code = zero point (mins: 0)
                dead = s == 0
                s_div = torch.where(dead, 1.0, s)
        col = W1[i]
        if fed is not None:
            fed[:, c] = col
        if levels is not None:  # value = s * levels[q]
            q = quantize_to_levels(col, s, levels).long()
            deq = s * levels[q]
        elif m is not None:  # rtn.quantize_with_min: value = s*q - m
            q = torch.clamp(torch.where(dead, 0.0, torch.round((col.float() + m) / s_div)),
                            0, maxq)
            deq = s * q - m
        else:
            if snapped:
                q = torch.where(dead, z, torch.round(col.float() / s_div) + z)
            else:
                q = torch.round(col.float() / s) + z  # rtn.quantize_with
            q = torch.clamp(q, 0, maxq)
            deq = s * (q - z)
        codes[i] = q
        err = (col - deq.to(dtype)) / U1[i, i]
        W1[i:] -= U1[i, i:, None] * err[None, :]
        errors[i] = err
    return codes, errors


@dataclass(frozen=True)
class GPTQConfig:
    """GPTQ settings (AutoGPTQ names in brackets): bits, group_size, sym, act_order [desc_act],
    static_groups, damp [damp_percent], block_size, true_sequential; prefix_skip: positions at
    the start of every calibration sequence treated apart in the Hessian (0 = GPTQ, 4 = P-GPTQ);
    prefix_cap: those positions enter H with their norm capped at prefix_cap x the RMS norm of
    the other tokens (0 = left out entirely; see hessian.py); refit: the scales refitted to the
    codes by least squares of GPTQ's objective once a layer's codes are fixed (refit.py; off by
    default: 0-2 % lower KL on the development texts, no gain on held-out text); tail: how the
    output layer is quantised, "gptq" (under its inputs' H) or "rtn" (its weights alone);
    asymmetric: GPTQ aims at the float model's outputs from its own inputs rather than at the
    float weights on the quantised model's inputs (`asymmetric_target`; the calibration then
    carries the float model's hidden states beside the quantised one's); static_passes: with
    static groups, 2 or more re-chooses every group's parameters from the previous pass's
    error-fed weights and runs GPTQ again (`gptq_quantize`)."""

    bits: int = 4
    group_size: int = 128
    sym: bool = True
    act_order: bool = False
    static_groups: bool = False
    damp: float = 0.01
    block_size: int = DEFAULT_BLOCK
    true_sequential: bool = True
    prefix_skip: int = 0
    prefix_cap: float = 0.0
    grid: Grid = "minmax"
    refit: bool = False
    tail: str = "gptq"
    asymmetric: bool = False
    static_passes: int = 1


class GPTQCalibrator(BlockCalibrator):
    """Block handler: Hessians captured group by group ([q,k,v] -> [o] -> [gate,up] -> [down]),
    each group quantised before the next group's inputs are captured (true-sequential)."""

    name = "gptq"

    def __init__(self, config: GPTQConfig) -> None:
        self.config = config

    def describe(self) -> str:
        c = self.config
        text = (f"{self.name} {c.bits}-bit g{c.group_size} {'sym' if c.sym else 'asym'}"
                f"{' act-order' if c.act_order else ''}{' static-groups' if c.static_groups else ''}")
        if c.static_groups and c.static_passes > 1:
            text += f" {c.static_passes}-pass"
        if c.asymmetric:
            text += " asymmetric"
        if not c.prefix_skip:
            return text
        how = f" cap {c.prefix_cap:g}" if c.prefix_cap else ""
        return text + f" prefix {c.prefix_skip}{how}"

    def _quantize(self, w: Tensor, h: Tensor, name: str, ctx: CalibContext,
                  layer: str | None = None) -> GPTQResult:
        """GPTQ of one (or one stacked) weight, stored as linear `layer` (default `name`): its
        per-layer override's format, bits, group size and symmetry, else the config's."""
        c = self.config
        bits, group, sym = ctx.shape_for(layer or name, c)
        return gptq_quantize(w, h, bits=bits, group_size=group, sym=sym,
                             act_order=c.act_order, static_groups=c.static_groups, damp=c.damp,
                             block_size=c.block_size, scale_dtype=ctx.scale_dtype, grid=c.grid,
                             name=name, fmt=ctx.format_for(layer or name), refit=c.refit,
                             static_passes=c.static_passes)

    def _quantize_sharing(self, runner: BlockRunner, names: list[str], h: Tensor,
                          ctx: CalibContext, targets: dict[str, Tensor] | None = None
                          ) -> list[tuple[str, GPTQResult]]:
        """GPTQ of the linears `names`, which share one input and so one Hessian (q/k/v,
        gate/up). GPTQ treats every output row alone given H (the permutation, damping and
        inverse Cholesky come from H; group parameters and error updates are per row), so they
        run as ONE stacked [sum of outs, in] weight: one factorisation and one column loop
        instead of one per linear, then split back by rows. `targets`: the weights to aim at
        per name (`asymmetric_target`), default the linears' own."""
        layers = [ctx.layer(runner.full(n)) for n in names]
        if len(set(layers)) > 1:  # per-layer formats differ: one stack per storage
            out = []
            for layer in dict.fromkeys(layers):
                out += self._quantize_sharing(
                    runner, [n for n, lq in zip(names, layers) if lq == layer], h, ctx, targets)
            return sorted(out, key=lambda item: names.index(item[0]))
        weights = [runner.weight(n) if targets is None else targets[n] for n in names]
        if len(names) == 1:
            return [(names[0], self._quantize(weights[0], h, runner.full(names[0]), ctx))]
        stacked = self._quantize(torch.cat(weights), h,  # one storage: the first one's
                                 " + ".join(runner.full(n) for n in names), ctx,
                                 layer=runner.full(names[0]))
        qw, out, r0 = stacked.weight, [], 0
        for name, w in zip(names, weights):
            r1 = r0 + w.shape[0]
            # own copies: the formats save each linear's tensors apart (safetensors refuses
            # tensors that share memory)
            part = qw.rows(r0, r1, runner.full(name))
            out.append((name, GPTQResult(part, stacked.damp, stacked.dead_columns,
                                         stacked.loss)))
            r0 = r1
        return out

    @torch.no_grad()
    def quantize_block(self, runner: BlockRunner, ctx: CalibContext) -> BlockResult:
        result = BlockResult()
        keep, prefix = prefix_split(runner.mask, self.config.prefix_skip)
        passes = ([[g] for g in SEQUENTIAL_GROUPS] if self.config.true_sequential
                  else [list(SEQUENTIAL_GROUPS)])
        # true-sequential on a plain decoder block: each part of the block runs once
        seq = SequentialForward(runner) if self.config.true_sequential and supports(runner) \
            else None
        twin = self._float_twin(runner, seq) if self.config.asymmetric else None
        crosses: dict = {}
        for groups in passes:
            todo = self.pending(runner, groups, ctx, result)
            if seq is not None:  # a skipped group is still run through: later groups need it
                accs, crosses = seq.capture([groups[0][0]], keep,  # the group shares one input
                                            prefix=prefix if self.config.prefix_skip else None,
                                            prefix_cap=self.config.prefix_cap, float_twin=twin)
            elif not todo:
                continue
            else:
                accs = runner.hessians([names[0] for names in todo], keep,
                                       prefix=prefix if self.config.prefix_skip else None,
                                       prefix_cap=self.config.prefix_cap)
            for names in todo:
                key = names[0] if seq is None else groups[0][0]
                h = accs.pop(key).hessian(release=True)
                targets = None
                if twin is not None:
                    correction = asymmetric_correction(h, crosses[key].matrix(), self.config.damp)
                    targets = {n: asymmetric_target(runner.weight(n), correction) for n in names}
                for name, res in self._quantize_sharing(runner, names, h, ctx, targets):
                    self.accept(runner, name, res.weight, ctx, result, h,
                                extra={"damp": res.damp, "dead_columns": res.dead_columns})
        if seq is not None:
            result.outputs = seq.output()
        if twin is not None:
            result.float_outputs = twin.output()
        return result

    def _float_twin(self, runner: BlockRunner, seq: SequentialForward | None) -> SequentialForward:
        """The block's float copy on the float model's inputs (`runner.float_inputs`), stepped
        beside `seq` so each linear's float-path inputs pair with its quantised-path ones."""
        why = ("not a plain DecoderLayer" if seq is None else
               "no float inputs" if runner.float_inputs is None else
               "P-GPTQ prefix" if self.config.prefix_skip else None)
        if why is not None:
            raise QuantError(
                f"asymmetric GPTQ needs a plain decoder block, the float model's hidden states "
                f"and no prefix treatment ({runner.prefix}: {why})",
                "calibrate through quant.calib.calibrate (it carries both paths), with method gptq")
        twin = BlockRunner(copy.deepcopy(runner.layer), runner.prefix, runner.float_inputs,
                           runner.mask, runner.rope, runner.batch)
        return SequentialForward(twin)

    def quantize_tail(self, name: str, w: Tensor, h: Tensor | None,
                      ctx: CalibContext, cross: Tensor | None = None) -> QuantizedWeight:
        """lm_head (or the tied embedding) under its inputs' H; with `cross` (asymmetric: the
        final hidden states' float/quantised cross moments) aiming at `asymmetric_target`."""
        if h is not None and cross is not None and self.config.asymmetric:
            w = asymmetric_target(w, asymmetric_correction(h, cross, self.config.damp))
        if h is None or self.config.tail == "rtn":
            bits, group, sym = ctx.shape_for(name, self.config)
            return quantize_rtn(w, bits, group, sym, scale_dtype=ctx.scale_dtype,
                                grid=self.config.grid, name=name, fmt=ctx.format_for(name))
        return self._quantize(w, h, name, ctx).weight
