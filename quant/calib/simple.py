"""RTN and ternary as block handlers: no activation-dependent choice, but the same streaming,
format checks and reporting as the calibrated methods.

The per-linear SNR of these handlers is measured on the *float* block's inputs (one forward with
the inputs of [q,k,v], o, [gate,up] and down captured together); with no calibration tokens it is
left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..rtn import Grid, quantize_rtn
from ..ternary import TernaryScope, quantize_ternary
from ..weight import QuantizedWeight
from .base import BlockCalibrator, BlockResult, CalibContext
from .block import SEQUENTIAL_GROUPS, BlockRunner


@dataclass(frozen=True)
class RTNConfig:
    """Round-to-nearest per group (docs/quant.md §1)."""

    bits: int = 4
    group_size: int = 128
    sym: bool = True
    grid: Grid = "minmax"
    # a llama.cpp imatrix file (quant/imatrix.py): each linear's input mean square weighs the
    # mse grid's search, as llama-quantize --imatrix does; linears it lacks get none
    imatrix: str | None = None


@dataclass(frozen=True)
class TernaryConfig:
    """Absmean ternary (docs/quant.md §5): an int group size, "row" or "tensor"."""

    group_size: TernaryScope = "row"


class _NoCalibration(BlockCalibrator):
    def quantize_weight(self, w: Tensor, name: str, ctx: CalibContext) -> QuantizedWeight:
        raise NotImplementedError

    @torch.no_grad()
    def quantize_block(self, runner: BlockRunner, ctx: CalibContext) -> BlockResult:
        result = BlockResult()
        todo = self.pending(runner, SEQUENTIAL_GROUPS, ctx, result)
        accs = runner.hessians([g[0] for g in todo], stop=False) if runner.inputs.shape[0] else {}
        for names in todo:
            h = accs.pop(names[0]).hessian(release=True) if names[0] in accs else None
            for name in names:
                qw = self.quantize_weight(runner.weight(name), runner.full(name), ctx)
                self.accept(runner, name, qw, ctx, result, h)
        return result

    def quantize_tail(self, name: str, w: Tensor, h: Tensor | None,
                      ctx: CalibContext, cross: Tensor | None = None) -> QuantizedWeight:
        return self.quantize_weight(w, name, ctx)


class RTNCalibrator(_NoCalibration):
    name = "rtn"

    def __init__(self, config: RTNConfig) -> None:
        self.config = config
        self.imatrix = None
        if config.imatrix is not None:
            from ..imatrix import ImatrixError, read_imatrix

            if config.grid != "mse":
                raise ImatrixError(f"RTN's {config.grid} grid takes no importance, so the "
                                   f"imatrix {config.imatrix} would be ignored",
                                   "use the mse grid (--grid mse) with an imatrix")
            self.imatrix = read_imatrix(config.imatrix)

    def describe(self) -> str:
        c = self.config
        imatrix = " imatrix" if c.imatrix is not None else ""
        return f"rtn {c.bits}-bit g{c.group_size} {'sym' if c.sym else 'asym'}{imatrix}"

    def importance(self, name: str, w: Tensor) -> Tensor | None:
        """The imatrix's mean square of `name`'s input columns [in], or None."""
        return None if self.imatrix is None else self.imatrix.importance(name, w.shape[1])

    def quantize_weight(self, w: Tensor, name: str, ctx: CalibContext) -> QuantizedWeight:
        c = self.config
        bits, group, sym = ctx.shape_for(name, c)  # a per-layer override, if the recipe has one
        return quantize_rtn(w, bits, group, sym, scale_dtype=ctx.scale_dtype, grid=c.grid,
                            name=name, importance=self.importance(name, w),
                            fmt=ctx.format_for(name))


class TernaryCalibrator(_NoCalibration):
    name = "ternary"

    def __init__(self, config: TernaryConfig) -> None:
        self.config = config

    def describe(self) -> str:
        return f"ternary absmean ({self.config.group_size})"

    def quantize_weight(self, w: Tensor, name: str, ctx: CalibContext) -> QuantizedWeight:
        return quantize_ternary(w, self.config.group_size, scale_dtype=ctx.scale_dtype, name=name)
