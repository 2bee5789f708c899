"""What every calibration handler shares: the context it runs in and what it reports.

A handler (torchao style: a frozen config dataclass -> a handler, see `registry.py`) takes one
`BlockRunner` and quantises the block's linears in place: every linear it quantises is checked
against the storage format first; a refused linear stays in float and is reported (fatal with
`strict`), a quantised one is replaced by its dequantised weight so later captures and the next
block's inputs see the quantised model.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from ..formats import Format, FormatError, get_format
from ..recipe import QuantRecipe
from ..weight import QuantizedWeight
from .block import BlockRunner

Status = Literal["quantised", "refused", "skipped"]


@dataclass
class LinearReport:
    """One linear's outcome. snr_db: 10·log10(‖XWᵀ‖² / ‖X(W-Ŵ)ᵀ‖²) on its calibration inputs."""

    name: str
    status: Status
    recipe: str
    snr_db: float | None = None
    reason: str = ""
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = {"name": self.name, "status": self.status, "recipe": self.recipe,
             "snr_db": None if self.snr_db is None else round(self.snr_db, 3)}
        if self.reason:
            d["reason"] = self.reason
        d.update(self.extra)
        return d


@dataclass
class BlockResult:
    """quantized / floats: full tensor-owner names -> canonical weight / changed float tensor
    (e.g. AWQ's rescaled norm weights, keyed by the tensor name `...input_layernorm.weight`).
    outputs: the quantised block's outputs [N, T, H] when the handler computed them on the way
    (equal to `runner.run()`, which the driver calls otherwise); float_outputs: the float block's
    outputs on the float model's inputs, when the handler carries both paths."""

    quantized: dict[str, QuantizedWeight] = field(default_factory=dict)
    floats: dict[str, Tensor] = field(default_factory=dict)
    reports: list[LinearReport] = field(default_factory=list)
    outputs: Tensor | None = None
    float_outputs: Tensor | None = None  # the float block on the float model's inputs (GPTQ asymmetric)


@dataclass(frozen=True)
class LayerQuant:
    """One linear's storage override: its format and the bits / group size / symmetry to
    quantise it with (from `QuantRecipe.for_layer`)."""

    fmt: Format
    bits: int
    group_size: int
    sym: bool


def context_for(recipe: QuantRecipe, skip: frozenset[str] = frozenset(),
                strict: bool = False) -> CalibContext:
    """The context calibrating with `recipe` runs in: its format, skipped linears, per-layer
    overrides, and fp16 scales when the format stores them."""
    fmt = get_format(recipe.format)
    return CalibContext(fmt, skip, strict,
                        torch.float16 if fmt.constraints.scale_dtype == "float16" else None,
                        recipe)


@dataclass(frozen=True)
class CalibContext:
    """fmt: the storage format (checked per linear); skip: full linear names kept in float;
    strict: a refused linear raises instead of staying float; scale_dtype: dtype scales are
    rounded through (float16 for every format that stores fp16 scales)."""

    fmt: Format
    skip: frozenset[str] = frozenset()
    strict: bool = False
    scale_dtype: torch.dtype | None = torch.float16
    recipe: QuantRecipe | None = None

    def layer(self, name: str) -> LayerQuant | None:
        """How linear `name` (full name, or `lm_head`) is stored when the recipe's per-layer
        overrides (`QuantRecipe.layers`) name it; None: the handler's own settings."""
        if self.recipe is None or not self.recipe.layers:
            return None
        sub = self.recipe.for_layer(name)
        if sub is self.recipe:
            return None
        return LayerQuant(get_format(sub.format), sub.bits, sub.group_size, sub.sym)

    def shape_for(self, name: str, config) -> tuple[int, int, bool]:
        """(bits, group_size, sym) linear `name` is quantised with: its override's, else
        `config`'s (a handler config with those three fields)."""
        layer = self.layer(name)
        if layer is None:
            return config.bits, config.group_size, config.sym
        return layer.bits, layer.group_size, layer.sym

    def format_for(self, name: str) -> Format:
        layer = self.layer(name)
        return self.fmt if layer is None else layer.fmt

    def refusal(self, qw: QuantizedWeight, name: str) -> str | None:
        """None when the format stores `qw`; else why not (with `strict`: StrictError)."""
        try:
            self.format_for(name).check(qw, name)
        except FormatError as exc:
            if self.strict:
                raise StrictError(exc.message, exc.hint) from None
            return exc.message
        return None


class StrictError(FormatError):
    """--strict and the format cannot take a layer."""


def hessian_snr_db(w: Tensor, w_hat: Tensor, h: Tensor, rows: int = 512) -> float | None:
    """Output SNR from the Hessian: tr(W H Wᵀ) / tr(ΔW H ΔWᵀ) in dB (None without tokens).
    float32 products over chunks of rows (no n x n float64 copy), sums in float64."""
    signal = noise = 0.0
    hf = h.float()
    for r0 in range(0, w.shape[0], rows):
        wc = w[r0:r0 + rows].float()
        dc = wc - w_hat[r0:r0 + rows].float()
        signal += float(((wc @ hf) * wc).sum(dtype=torch.float64))
        noise += float(((dc @ hf) * dc).sum(dtype=torch.float64))
    return snr_from(signal, noise)


def snr_from(signal: float, noise: float) -> float | None:
    if signal <= 0:
        return None
    if noise <= 0:
        return math.inf
    return 10.0 * math.log10(signal / noise)


def output_snr_db(reference: Tensor, inputs: Tensor, outputs: Tensor, mask: Tensor) -> float | None:
    """Block SNR of the residual *update*: ‖ref - x‖² / ‖ref - out‖² over real tokens (the
    residual stream itself would hide the error)."""
    m = mask.to(reference.dtype)[..., None]
    signal = float((((reference - inputs) * m) ** 2).double().sum())
    noise = float((((reference - outputs) * m) ** 2).double().sum())
    return snr_from(signal, noise)


def block_snr_db(reference: Tensor, inputs: Tensor, outputs: Tensor, mask: Tensor) -> float | None:
    """`output_snr_db` over the sequences the float reference covers (its first n rows)."""
    n = reference.shape[0]
    return output_snr_db(reference, inputs[:n], outputs[:n], mask[:n])


def trim_heap() -> None:
    """Give freed heap memory back to the OS (glibc `malloc_trim`; a no-op elsewhere).

    Blocks allocate and free many large, differently sized tensors; glibc keeps the freed memory
    in its arenas, so without this the resident set creeps up block after block."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM = None


class BlockCalibrator:
    """Base handler. Subclasses implement `quantize_block` and `quantize_tail`."""

    name: str = "?"
    # True: the handler's first forward runs the whole pristine block, which records the float
    # reference the block SNR is measured against; False: the driver runs one first.
    records_reference: bool = True

    def describe(self) -> str:
        return self.name

    def quantize_block(self, runner: BlockRunner, ctx: CalibContext) -> BlockResult:
        raise NotImplementedError

    def quantize_tail(self, name: str, w: Tensor, h: Tensor | None,
                      ctx: CalibContext, cross: Tensor | None = None) -> QuantizedWeight:
        """A linear outside the blocks (lm_head), given its input Hessian when captured and, for
        GPTQ's asymmetric target, its float / quantised cross moments (others ignore them)."""
        raise NotImplementedError

    # --------------------------------------------------------------------------- helpers
    def skip_report(self, runner: BlockRunner, name: str, ctx: CalibContext) -> LinearReport | None:
        full = runner.full(name)
        if full in ctx.skip:
            return LinearReport(full, "skipped", "float", reason="matches a skip pattern")
        return None

    def pending(self, runner: BlockRunner, groups, ctx: CalibContext,
                result: BlockResult) -> list[list[str]]:
        """The linears of `groups` (lists of names sharing an input) still to quantise, groups
        left empty dropped; skipped linears are reported into `result` on the way."""
        todo = []
        for group in groups:
            names = []
            for name in group:
                report = self.skip_report(runner, name, ctx)
                if report is not None:
                    result.reports.append(report)
                else:
                    names.append(name)
            if names:
                todo.append(names)
        return todo

    def accept(self, runner: BlockRunner, name: str, qw: QuantizedWeight, ctx: CalibContext,
               result: BlockResult, h: Tensor | None, original: Tensor | None = None,
               extra: dict | None = None) -> bool:
        """Check `qw` against the format; install it (or keep float and report the refusal).
        `original` is the weight Ŵ is compared with (default: the linear's current weight).
        `qw` may live on the block's device (saving moves it to the CPU)."""
        full = runner.full(name)
        why = ctx.refusal(qw, full)
        if why is not None:
            result.reports.append(LinearReport(full, "refused", "float", reason=why))
            return False
        w = runner.weight(name) if original is None else original
        w_hat = qw.to(w.device).dequantize()
        snr = hessian_snr_db(w, w_hat, h) if h is not None else None
        runner.set_weight(name, w_hat)
        trim_heap()
        result.quantized[full] = qw
        layer = ctx.layer(full)
        recipe = self.describe() if layer is None else \
            f"{self.name} {layer.bits}-bit -> {layer.fmt.name} (layer override)"
        result.reports.append(LinearReport(full, "quantised", recipe, snr, extra=extra or {}))
        return True
