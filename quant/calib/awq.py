"""AWQ, activation-aware weight quantisation (Lin et al.; llm-awq / AutoAWQ), docs/quant.md §4.

Per decoder block, on the float block's activations:

1. statistics: `x_mean` = mean |x| per input channel over every real calibration token; the
   inputs themselves are kept for the first `search_samples` sequences (which span every
   calibration domain: quant/calib_data.py interleaves the domains' windows);
2. scale search per joint group — input_layernorm → q,k,v (inspect: self_attn); v → o only when
   v's outputs equal o's inputs (not with GQA); post_attention_layernorm → gate,up (inspect: mlp);
   up → down (inspect: down_proj): for α in 0, 1/n_grid, …, (n_grid-1)/n_grid,
   `s = x_mean^α / (w_mean^(1-α) + 1e-4)` (w_mean = mean over rows of |W|/max|W| per group),
   normalised by `sqrt(max(s)·min(s))`; the α whose quantised `Q(W·diag(s))/s` gives the smallest
   MSE of the inspected module's output wins. `s = 1` (no scaling) is tried as well, so the chosen
   scaling never does worse than plain RTN on the search data (AutoAWQ's grid has no identity);
3. apply: the preceding op absorbs `1/s` (norm weight, or rows of v / up), the group's columns
   take `s`, the kept inputs are divided by `s`;
4. clipping search for every linear except q/k: per output row and group, max = absmax·(1 - i/n)
   for i < max_shrink·n; keep the one minimising that group's share of the output error;
5. quantise (rtn.find_params per group, so codes/scales follow §1), asymmetric 4-bit by default;
6. refit each row's scales to its codes by least squares of the output error on the search
   sequences (`refit.py`; ArkInfer's addition, on by default: the clipping shrinks the weights,
   and the refit takes back what that costs in output error; `refit=False` turns it off).

The block then runs with its quantised weights to give the next block's inputs (the streaming
driver does that for every method).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..rtn import Grid, quantize_rtn
from ..weight import QuantizedWeight
from .base import BlockCalibrator, BlockResult, CalibContext
from .block import BlockRunner
from .refit import refit_scales, refittable


@dataclass(frozen=True)
class AWQConfig:
    """n_grid: α grid points; max_shrink: largest clip fraction searched; search_samples:
    sequences used by the scale/clip searches; clip_tokens: tokens sampled for the clip search;
    refit: the scales refitted to the codes by least squares of the layer's output error on the
    search sequences (refit.py), so the clipping's shrink of the weights is undone where it costs
    output error."""

    bits: int = 4
    group_size: int = 128
    sym: bool = False
    n_grid: int = 20
    max_shrink: float = 0.5
    clip: bool = True
    search_samples: int = 16
    clip_tokens: int = 512
    grid: Grid = "minmax"
    refit: bool = True


@dataclass(frozen=True)
class _Group:
    prev: str  # the op that absorbs 1/s: a norm ("input_layernorm") or a linear ("self_attn.v_proj")
    linears: tuple[str, ...]
    inspect: str  # "attention", "mlp" or a linear name


GROUPS = (
    _Group("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
           "attention"),
    _Group("self_attn.v_proj", ("self_attn.o_proj",), "self_attn.o_proj"),
    _Group("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"), "mlp"),
    _Group("mlp.up_proj", ("mlp.down_proj",), "mlp.down_proj"),
)
NO_CLIP = ("self_attn.q_proj", "self_attn.k_proj")


def _fake_quant(w: Tensor, c: AWQConfig, scale_dtype: torch.dtype | None) -> Tensor:
    """The searches' quantiser: the grid `mse` starts from (ggml's, or min/max asymmetric), not
    the searched one. The scale and clip searches run it 20-30 times per linear, and AWQ's clip
    search is itself a search of the range; the final codes use `c.grid`."""
    base = "ggml" if c.sym else "minmax"
    return quantize_rtn(w, c.bits, c.group_size, c.sym, scale_dtype=scale_dtype,
                        grid=base if c.grid == "mse" else c.grid).dequantize()


def w_mean_of(weights: list[Tensor], group_size: int) -> Tensor:
    """[in]: mean over all rows of |W| / max|W| of the row's group (AutoAWQ's w_mean)."""
    w = torch.cat(weights, dim=0).float()
    size = w.shape[1] if group_size == -1 else group_size
    g = w.reshape(-1, size).abs()
    g = g / (g.amax(dim=1, keepdim=True) + 1e-6)
    return g.reshape(w.shape).mean(0)


def search_scale(x_mean: Tensor, weights: list[Tensor], run: Callable[[list[Tensor]], Tensor],
                 reference: Tensor, c: AWQConfig, scale_dtype: torch.dtype | None,
                 keep: Tensor | None = None) -> tuple[Tensor, float | None, float]:
    """Best per-channel scale s [in] for the linears `weights` (each [out_i, in]).

    run(w_hats) -> the inspected module's output with those weights; reference: its float output.
    Returns (s, α or None for the identity, loss)."""
    w_mean = w_mean_of(weights, c.group_size)
    m = None if keep is None else keep.to(reference.dtype)[..., None]

    def loss_of(s: Tensor) -> float:
        hats = [_fake_quant(w * s, c, scale_dtype) / s for w in weights]
        diff = (reference - run(hats)) ** 2
        if m is not None:
            diff = diff * m
        return float(diff.double().mean())

    best = (torch.ones_like(x_mean), None, loss_of(torch.ones_like(x_mean)))
    for i in range(c.n_grid):
        alpha = i / c.n_grid
        s = (x_mean.pow(alpha) / (w_mean.pow(1 - alpha) + 1e-4)).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        loss = loss_of(s)
        if loss < best[2]:
            best = (s, alpha, loss)
    return best


def search_clip(w: Tensor, x: Tensor, c: AWQConfig, scale_dtype: torch.dtype | None,
                rows_per_batch: int = 256) -> Tensor:
    """Best clip max [out, n_groups] for `w` [out, in] on tokens x [n, in] (AutoAWQ's search)."""
    out, cols = w.shape
    size = cols if c.group_size == -1 else c.group_size
    ng = cols // size
    xg = x.float().reshape(-1, ng, size)
    best_all = []
    for r0 in range(0, out, rows_per_batch):
        wb = w[r0:r0 + rows_per_batch].float()
        wg = wb.reshape(-1, ng, size)
        org_max = wg.abs().amax(dim=-1)  # [o, ng]
        ref = torch.einsum("ngk,ogk->ong", xg, wg)
        best_err = torch.full_like(org_max, math.inf)
        best_max = org_max.clone()
        for i in range(int(c.max_shrink * c.n_grid)):
            max_val = org_max * (1 - i / c.n_grid)
            cur = torch.maximum(torch.minimum(wg, max_val[..., None]), -max_val[..., None])
            q = _fake_quant(cur.reshape(wb.shape), c, scale_dtype).reshape(wg.shape)
            err = ((torch.einsum("ngk,ogk->ong", xg, q) - ref) ** 2).mean(dim=1)
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_max = torch.where(better, max_val, best_max)
        best_all.append(best_max)
    return torch.cat(best_all)


def apply_clip(w: Tensor, max_val: Tensor, group_size: int) -> Tensor:
    out, cols = w.shape
    size = cols if group_size == -1 else group_size
    wg = w.reshape(out, cols // size, size)
    return torch.maximum(torch.minimum(wg, max_val[..., None]), -max_val[..., None]).reshape(w.shape)


class AWQCalibrator(BlockCalibrator):
    name = "awq"

    def __init__(self, config: AWQConfig) -> None:
        self.config = config

    def describe(self) -> str:
        c = self.config
        return f"awq {c.bits}-bit g{c.group_size} {'sym' if c.sym else 'asym'}"

    def _statistics(self, runner: BlockRunner) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """x_mean [in] over all real tokens and kept inputs [n, T, in] of every group's input."""
        c = self.config
        names = [g.linears[0] for g in GROUPS]
        n_keep = min(c.search_samples, runner.inputs.shape[0])
        sums = {n: torch.zeros(runner.linear(n).in_features, dtype=torch.float64,
                               device=runner.device) for n in names}
        kept: dict[str, list[Tensor]] = {n: [] for n in names}
        count = {"tokens": 0}

        def make(name: str):
            def fn(x: Tensor, rows: slice) -> None:
                m = runner.mask[rows]
                sums[name] += (x.abs() * m[..., None]).sum(dim=(0, 1)).double()
                if name == names[0]:
                    count["tokens"] += int(m.sum())
                take = max(0, min(rows.stop, n_keep) - rows.start)
                if take:
                    kept[name].append(x[:take].clone())
            return fn

        runner.run({n: make(n) for n in names})
        x_mean = {n: (sums[n] / max(count["tokens"], 1)).float() for n in names}
        return x_mean, {n: torch.cat(v) for n, v in kept.items()}

    def _inspect(self, runner: BlockRunner, g: _Group) -> Callable[[Tensor], Tensor]:
        if g.inspect == "attention":
            return runner.attention
        if g.inspect == "mlp":
            return runner.mlp
        lin = runner.linear(g.inspect)
        return lambda x: x @ lin.weight.T

    def _run_with(self, runner: BlockRunner, g: _Group, x: Tensor) -> Callable[[list[Tensor]], Tensor]:
        fwd = self._inspect(runner, g)

        def run(hats: list[Tensor]) -> Tensor:
            saved = [runner.linear(n).weight.data for n in g.linears]
            try:
                for n, w in zip(g.linears, hats):
                    runner.linear(n).weight.data = w
                return torch.cat([fwd(x[i:i + runner.batch])
                                  for i in range(0, x.shape[0], runner.batch)])
            finally:
                for n, w in zip(g.linears, saved):
                    runner.linear(n).weight.data = w
        return run

    @torch.no_grad()
    def quantize_block(self, runner: BlockRunner, ctx: CalibContext) -> BlockResult:
        c, result = self.config, BlockResult()
        x_mean, kept = self._statistics(runner)
        n_keep = next(iter(kept.values())).shape[0]
        keep = runner.mask[:n_keep]
        inputs = {g.linears[0]: kept[g.linears[0]] for g in GROUPS}
        scales: list[tuple[_Group, Tensor]] = []
        for g in GROUPS:  # every search on the float block, as AutoAWQ
            if g.prev.endswith("_proj") and (runner.linear(g.prev).out_features
                                             != runner.linear(g.linears[0]).in_features):
                continue  # GQA: v's outputs are not o's inputs
            x = inputs[g.linears[0]]
            run = self._run_with(runner, g, x)
            ref = run([runner.weight(n) for n in g.linears])
            s, _alpha, _ = search_scale(x_mean[g.linears[0]], [runner.weight(n) for n in g.linears],
                                       run, ref, c, ctx.scale_dtype, keep)
            scales.append((g, s))
        scaled: set[str] = set()
        for g, s in scales:  # apply: prev absorbs 1/s, the group's columns take s
            prev = runner.layer.get_submodule(g.prev)
            if g.prev.endswith("_proj"):
                runner.set_weight(g.prev, prev.weight.detach() / s[:, None])
                scaled.add(g.prev)
            else:
                prev.weight.data = prev.weight.data / s
                result.floats[runner.full(g.prev) + ".weight"] = prev.weight.detach().clone()
            for n in g.linears:
                runner.set_weight(n, runner.weight(n) * s)
                scaled.add(n)
            inputs[g.linears[0]] = inputs[g.linears[0]] / s
            runner.mark_modified()
        for g in GROUPS:
            x = inputs[g.linears[0]]
            flat = x[keep] if keep.any() else x.reshape(-1, x.shape[-1])
            h = (2.0 / max(flat.shape[0], 1)) * (flat.T.double() @ flat.double()).float()
            step = max(1, flat.shape[0] // c.clip_tokens)
            for name in g.linears:
                report = self.skip_report(runner, name, ctx)
                w = runner.weight(name)
                if report is not None:
                    result.reports.append(report)
                else:
                    w_clip = w
                    if c.clip and name not in NO_CLIP:
                        w_clip = apply_clip(w, search_clip(w, flat[::step], c, ctx.scale_dtype),
                                            c.group_size)
                    qw = quantize_rtn(w_clip, c.bits, c.group_size, c.sym,
                                      scale_dtype=ctx.scale_dtype, grid=c.grid,
                                      name=runner.full(name))
                    if c.refit and refittable(qw):
                        qw, _ = refit_scales(qw, w, h, ctx.scale_dtype, damp=0.01)
                    if self.accept(runner, name, qw, ctx, result, h, original=w):
                        continue
                if name in scaled:  # kept in float: export the rescaled weight
                    result.floats[runner.full(name) + ".weight"] = w.clone()
        return result

    def quantize_tail(self, name: str, w: Tensor, h: Tensor | None,
                      ctx: CalibContext, cross: Tensor | None = None) -> QuantizedWeight:
        c = self.config
        return quantize_rtn(w, c.bits, c.group_size, c.sym, scale_dtype=ctx.scale_dtype,
                            grid=c.grid, name=name)
