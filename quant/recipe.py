"""Quantisation recipes: calibration algorithm x storage format, as a frozen config.

    QuantRecipe(calib="gptq", format="marlin", bits=4, group_size=128)
    get_preset("q4_0")                       # rtn 4-bit g32 sym -> gguf-q4_0
    get_preset("awq", group_size=64)         # a preset with overrides

A recipe is checked against its format's constraint data on construction, so an impossible
combination (Marlin with 3 bits, AWQ with act-order) fails before any calibration runs.
`skip` holds fnmatch patterns of layer names left in full precision (reported, never silent).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Literal, get_args

from .formats import get_format
from .rtn import GRIDS, Grid
from .weight import Kind, QuantError

Calib = Literal["rtn", "gptq", "pgptq", "awq", "ternary"]
#: Calibrations that choose codes for a codebook format's table (GGUF IQ4_NL).
CODEBOOK_CALIBS = ("rtn", "gptq", "pgptq")


@dataclass(frozen=True)
class QuantRecipe:
    """calib: how codes and scales are chosen; format: registered storage format name.

    group_size -1 = one group per row (for ternary: one absmean scale per row).
    desc_act: GPTQ act-order (columns processed by descending Hessian diagonal; g_idx stored).
    grid: how a group's scale is chosen (quant/rtn.py): mse (ggml's grid, scale searched; the
    default), ggml (Q4_0's rule, all 16 levels), minmax (GPTQ's reference, 15 of 16 levels when
    symmetric). Ternary recipes ignore it.
    layers: per-linear storage overrides, `(pattern, format)` pairs matched like `skip` against the
    full linear name (`model.layers.3.mlp.down_proj`, `lm_head`); the first match wins and the
    linear is stored in that format at its bits, group size and symmetry (`for_layer`). Only
    ArkInfer's own layouts hold several formats in one folder, so the runtime checkpoint layouts
    (gptq, marlin, awq) take no overrides.
    budget: mean stored bits per weight (linears and output layer) for mixed precision: before
    calibrating, `quant.mix` measures each tensor's sensitivity and writes `layers` to fit it
    (`calib.stream.calibrate` does this when `layers` is empty). None: one format throughout.
    """

    calib: Calib
    format: str
    bits: int = 4
    group_size: int = 128
    sym: bool = True
    desc_act: bool = False
    skip: tuple[str, ...] = ("lm_head",)
    grid: Grid = "mse"
    layers: tuple[tuple[str, str], ...] = ()
    budget: float | None = None

    def __post_init__(self) -> None:
        if self.calib not in get_args(Calib):
            raise QuantError(f"calib={self.calib!r} is not a calibration algorithm; allowed "
                             f"{list(get_args(Calib))}", "pick one of the allowed algorithms")
        if self.grid not in GRIDS:
            raise QuantError(f"grid={self.grid!r} is not a quantisation grid; allowed "
                             f"{list(GRIDS)}", "use minmax, ggml or mse")
        if isinstance(self.skip, str):
            raise QuantError(f"skip={self.skip!r} is a string; expected a tuple of patterns",
                             f"write skip=({self.skip!r},)")
        c = get_format(self.format).constraints
        kinds = {Kind.TERNARY} if self.calib == "ternary" else {Kind.UNIFORM}
        if self.calib in CODEBOOK_CALIBS:
            kinds.add(Kind.CODEBOOK)
        where = f"recipe {self.calib} -> {self.format}"
        if not kinds & set(c.kinds):
            kind = "/".join(sorted(str(k) for k in kinds))
            raise QuantError(f"{where}: the format stores {[str(k) for k in c.kinds]} weights, "
                             f"not {kind}", "pick a format for this calibration")
        if self.bits not in c.bits:
            raise QuantError(f"{where}: bits={self.bits} not in {c.bits}",
                             f"use bits={c.bits[0]}")
        if c.group_sizes is not None and self.group_size not in c.group_sizes:
            raise QuantError(f"{where}: group_size={self.group_size} not in {c.group_sizes}",
                             f"use group_size in {c.group_sizes}")
        if self.group_size == 0 or self.group_size < -1:
            raise QuantError(f"{where}: group_size={self.group_size} is invalid",
                             "use -1 (whole row) or a positive group size")
        if self.sym not in c.sym:
            raise QuantError(f"{where}: sym={self.sym} not in {c.sym}", f"use sym={c.sym[0]}")
        if self.desc_act and (not c.act_order or self.calib not in ("gptq", "pgptq")):
            raise QuantError(f"{where}: desc_act=True needs a GPTQ calibration and a format with "
                             "g_idx (gptq)", "set desc_act=False")
        self._check_layers(where)

    def _check_layers(self, where: str) -> None:
        if self.budget is not None:
            if not self.format.startswith("gguf-"):
                raise QuantError(f"{where}: a bits budget mixes GGUF block formats; "
                                 f"{self.format} is not one", "use a gguf-* format")
            if not (isinstance(self.budget, (int, float)) and 4.0 <= self.budget <= 8.5):
                raise QuantError(f"{where}: budget={self.budget!r} bits per weight is outside "
                                 "4.0..8.5", "use e.g. 4.9 (Q4_0 is 4.5, Q8_0 8.5)")
        if not self.layers:
            return
        if self.format in ("gptq", "marlin", "awq"):
            raise QuantError(f"{where}: per-layer formats need one of ArkInfer's own layouts; "
                             f"{self.format} stores one bit width for every linear",
                             "use a gguf-* format, or drop the layer overrides")
        for pair in self.layers:
            if not (isinstance(pair, tuple) and len(pair) == 2
                    and all(isinstance(x, str) for x in pair)):
                raise QuantError(f"{where}: layer override {pair!r} is not a (pattern, format) "
                                 "pair of strings", "write layers=(('*.down_proj', 'gguf-q8_0'),)")
            self._sub(pair[1])  # validates the override's format against this calibration

    def _sub(self, format_name: str) -> QuantRecipe:
        c = get_format(format_name).constraints
        group = self.group_size if c.group_sizes is None or self.group_size in c.group_sizes \
            else c.group_sizes[0]
        # an override takes its format's own symmetry (the first it lists: Q4_1 / Q5_1 store a
        # min, so asymmetric); the recipe's format keeps the recipe's
        own = format_name == self.format and self.sym in c.sym
        sym = self.sym if own else c.sym[0]
        bits = self.bits if self.bits in c.bits else c.bits[0]
        return replace(self, format=format_name, bits=bits, group_size=group, sym=sym,
                       layers=(), budget=None)

    def for_layer(self, name: str) -> QuantRecipe:
        """The recipe linear `name` is quantised with: the first matching `layers` override as a
        recipe of its own (its format's bits, group size and symmetry), else this recipe."""
        for pattern, format_name in self.layers:
            if fnmatchcase(name, pattern) or fnmatchcase(name, f"*{pattern}"):
                return self._sub(format_name)
        return self

    def skips(self, layer_name: str) -> bool:
        """True when `layer_name` matches one of the skip patterns (kept in full precision)."""
        return any(fnmatchcase(layer_name, p) or fnmatchcase(layer_name, f"*{p}")
                   for p in self.skip)

    def describe(self) -> str:
        order = " act-order" if self.desc_act else ""
        if self.calib == "ternary":
            return f"ternary (group {self.group_size}) -> {self.format}"
        grid = "" if self.grid == "mse" else f" {self.grid}-grid"
        mixed = f" ({len(self.layers)} layer overrides)" if self.layers else ""
        if self.budget is not None:
            mixed += f" mixed <= {self.budget:g} bits"
        return (f"{self.calib} {self.bits}-bit g{self.group_size} "
                f"{'sym' if self.sym else 'asym'}{order}{grid} -> {self.format}{mixed}")


# Every uniform preset searches its group scales (grid "mse", the default; docs/quant.md §1.1):
# lower KL than the GPTQ reference's 15-level grid and than ggml's Q4_0 rule on every development
# text (benchmarks/quant_quality.py --texts dev). `build --quant q4_0` still rounds with ggml's own
# quantiser in the GGUF backend (bytes equal to llama-quantize's) unless `--option rtn=folder`.
PRESETS: dict[str, QuantRecipe] = {
    "marlin": QuantRecipe("gptq", "marlin", 4, 128, sym=True, desc_act=False),
    "gptq": QuantRecipe("gptq", "gptq", 4, 128, sym=True),
    "awq": QuantRecipe("awq", "awq", 4, 128, sym=False),
    "q4_0": QuantRecipe("rtn", "gguf-q4_0", 4, 32, sym=True),
    # GPTQ-calibrated Q4_0 (llama.cpp's block layout); P-GPTQ: see quant/calib/pgptq.py
    "gptq-q4_0": QuantRecipe("gptq", "gguf-q4_0", 4, 32, sym=True),
    "pgptq-q4_0": QuantRecipe("pgptq", "gguf-q4_0", 4, 32, sym=True),
    # IQ4_NL: Q4_0's 4.5 bits with ggml's 16 non-uniform levels (lower error on real weights)
    "iq4_nl": QuantRecipe("rtn", "gguf-iq4_nl", 4, 32, sym=True),
    "gptq-iq4_nl": QuantRecipe("gptq", "gguf-iq4_nl", 4, 32, sym=True),
    # GPTQ with per-tensor GGUF types chosen by measured sensitivity (quant/mix.py) to a mean of
    # 4.9 stored bits per weight over the linears and the (tied) output layer
    "gptq-mix": QuantRecipe("gptq", "gguf-q4_0", 4, 32, sym=True, skip=(), budget=4.9),
    "q4_1": QuantRecipe("rtn", "gguf-q4_1", 4, 32, sym=False),
    "q8_0": QuantRecipe("rtn", "gguf-q8_0", 8, 32, sym=True),
    "ternary": QuantRecipe("ternary", "gguf-tq2_0", 2, -1, sym=True),
    "mlx4": QuantRecipe("rtn", "mlx", 4, 64, sym=False),
    "mlx8": QuantRecipe("rtn", "mlx", 8, 64, sym=False),
    # ORT's own quantiser defaults to asymmetric (zero points written).
    "ort4": QuantRecipe("rtn", "ort", 4, 128, sym=False),
}


# GPTQ passes over static groups per storage format (docs/quant.md §2, "Static passes"): the
# checkpoint layouts (one uniform grid, group 64-128) take a second pass with every group's scale
# re-chosen from the first pass's error-fed weights: KL -4 to -5 % on all four development texts
# for SmolLM2's gptq g64, and held out below llama.cpp's Q4_0 on every text (BENCHMARKS.md). The
# GGUF block formats (group 32: GPTQ IQ4_NL, the 4.9-bit mix) moved -6 to +2 %: one pass.
CHECKPOINT_STATIC_PASSES = {"gptq": 2, "marlin": 2}


def static_passes_for(format_name: str) -> int:
    """GPTQ passes over static groups for the recipe's storage format (1 unless listed)."""
    return CHECKPOINT_STATIC_PASSES.get(format_name, 1)


def get_preset(name: str, **overrides: object) -> QuantRecipe:
    """The named preset, optionally with fields replaced (re-validated)."""
    if name not in PRESETS:
        raise QuantError(f"unknown quantisation preset {name!r}; presets: {sorted(PRESETS)}",
                         "pick a preset or build a QuantRecipe(calib=..., format=...)")
    return replace(PRESETS[name], **overrides) if overrides else PRESETS[name]
