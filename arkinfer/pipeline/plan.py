"""Resolve `arkinfer build` options into a BuildPlan before any work starts.

Everything a user can get wrong (model path, target, backend, quant scheme, output folder) is
checked here, so a bad request fails in a second with the alternatives named instead of after
an hour of calibration:

    plan = resolve_plan("demo", target="host", quant="q4_0")
    plan.describe()          # [(key, value)] for the CLI
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arkinfer.backend import backend_names, get_backend
from arkinfer.errors import ArkError, NotAvailableError, TargetError
from arkinfer.frontend.checkpoint import read_config, resolve_model_path

FLOAT_SCHEMES = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class CalibSettings:
    """Calibration text (None = the shipped corpus_train.txt), sequences and their length."""

    path: Path | None = None
    samples: int = 128
    seq_len: int = 512
    seed: int = 0


@dataclass
class BuildPlan:
    model_arg: str
    source: Path
    model_name: str
    raw_config: dict[str, Any]
    target: Any  # arkinfer.target_model.Target
    backend: str
    quant: str  # the user's --quant: a preset name or a float dtype
    recipe: Any  # arkinfer.quant.QuantRecipe, None for float schemes
    dtype: str
    out: Path
    calib: CalibSettings = field(default_factory=CalibSettings)
    options: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def describe(self) -> list[tuple[str, str]]:
        arch = self.raw_config.get("architectures", [self.raw_config.get("model_type", "?")])
        sparse = " + InfLLM v2 sparse_config" if self.raw_config.get("sparse_config") else ""
        recipe = self.recipe.describe() if self.recipe is not None else f"float ({self.dtype})"
        calib = (f"{self.calib.samples} x {self.calib.seq_len} tokens from "
                 f"{self.calib.path or 'corpus_train.txt (shipped)'}")
        return [("model", f"{self.source} ({arch[0] if arch else '?'}{sparse})"),
                ("target", f"{self.target.id} ({self.target.name})"),
                ("backend", self.backend),
                ("quant", f"{self.quant}: {recipe}"),
                ("calibration", calib if self.recipe is not None else "-"),
                ("output", str(self.out))]

    def as_dict(self) -> dict[str, Any]:
        return {"model": str(self.source), "target": self.target.id, "backend": self.backend,
                "quant": self.quant,
                "recipe": None if self.recipe is None else self.recipe.describe(),
                "dtype": self.dtype, "out": str(self.out),
                "calibration": {"path": str(self.calib.path) if self.calib.path else None,
                                "samples": self.calib.samples, "seq_len": self.calib.seq_len,
                                "seed": self.calib.seed},
                "options": self.options, "notes": self.notes}


def quant_schemes() -> list[str]:
    """Every value `--quant` accepts: the float dtypes, then the quantisation presets."""
    from arkinfer.quant.recipe import PRESETS

    return [*FLOAT_SCHEMES, *PRESETS]


def recipe_for(quant: str):
    """(recipe, dtype) for a --quant value; recipe None for float schemes."""
    if quant in FLOAT_SCHEMES:
        return None, quant
    from arkinfer.quant.recipe import PRESETS, get_preset

    if quant not in PRESETS:
        raise ArkError(f"unknown --quant {quant!r}; known: {', '.join(quant_schemes())}",
                       hint="pick one of them (`arkinfer targets TARGET` lists what a target runs)")
    return get_preset(quant), "f32"


# Storage formats to try, in order, when the preset's format cannot take the model's shapes
# (GGUF TQ needs rows that are multiples of 256; ArkInfer's `ternary` takes any shape).
FORMAT_FALLBACKS = {"gguf-tq2_0": ("gguf-tq1_0", "ternary"), "gguf-tq1_0": ("gguf-tq2_0", "ternary")}


def linear_shapes(raw: dict[str, Any]) -> list[tuple[int, int]]:
    """(out_features, in_features) of the decoder linears described by a config.json dict."""
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or hidden // heads)
    kv = int(raw.get("num_key_value_heads") or heads)
    ffn = int(raw["intermediate_size"])
    return [(heads * head_dim, hidden), (kv * head_dim, hidden), (hidden, heads * head_dim),
            (ffn, hidden), (hidden, ffn)]


def fits(fmt_name: str, recipe, raw: dict[str, Any]) -> bool:
    from arkinfer.quant.formats import get_format

    c = get_format(fmt_name).constraints
    step_in, step_out = c.in_step(recipe.bits, recipe.group_size), c.out_step(recipe.bits)
    return all(i % step_in == 0 and o % step_out == 0 for o, i in linear_shapes(raw))


def fit_recipe(recipe, raw: dict[str, Any], target, backend: str) -> tuple[Any, list[str]]:
    """The recipe, or one with a fallback format when the preset's cannot take the model."""
    from dataclasses import replace

    if recipe is None or fits(recipe.format, recipe, raw):
        return recipe, []
    shapes = sorted(set(linear_shapes(raw)))
    if recipe.group_size > 0:  # e.g. 576-wide rows (SmolLM2) with the g128 presets
        for group in (g for g in (64, 32) if g < recipe.group_size):
            try:
                smaller = replace(recipe, group_size=group)
            except ArkError:
                continue
            if fits(recipe.format, smaller, raw):
                return smaller, [(f"group size {recipe.group_size} does not divide this model's "
                                 f"rows (linear shapes {shapes}); using group size {group}")]
    allowed = target.backend(backend).quant_formats
    for alt in FORMAT_FALLBACKS.get(recipe.format, ()):
        if alt in allowed and fits(alt, recipe, raw):
            return replace(recipe, format=alt), [
                (f"{recipe.format} cannot store this model's linears (shapes "
                f"{sorted(set(linear_shapes(raw)))}); using {alt} instead")]
    return recipe, [(f"{recipe.format} cannot store some of this model's linears (shapes "
                    f"{sorted(set(linear_shapes(raw)))}); they stay in float (see the manifest)")]


def default_out(model_name: str, target_id: str, quant: str) -> Path:
    return Path("dist") / f"{model_name}.{target_id}.{quant}"


def model_name_of(model_arg: str, source: Path) -> str:
    base = "demo" if model_arg == "demo" else Path(model_arg).name
    base = re.sub(r"\.gguf$", "", base, flags=re.IGNORECASE)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-").lower() or "model"


def choose_backend(target, backend: str | None) -> str:
    """The backend to use on `target`: explicit, else the target's default; it must be allowed on
    the target, registered, and installed here (else an error naming the alternatives)."""
    name = backend or target.default_backend
    target.backend(name)  # allowed on the target
    registered = backend_names()
    usable = [b for b in target.backends if b in registered and get_backend(b).available()]
    if name not in registered:
        raise NotAvailableError(
            f"backend {name!r} (for target {target.id!r}) is not implemented in this ArkInfer",
            hint=f"backends available for {target.id} here: {', '.join(usable) or 'none'}"
            + (f"; pass --backend {usable[0]}" if usable else ""))
    be = get_backend(name)
    if not be.available():
        raise NotAvailableError(
            f"backend {name!r} is not installed", hint=f"{be.install_hint()}"
            + (f"; or use another backend {target.id} accepts: --backend {usable[0]}"
               if [u for u in usable if u != name] else ""))
    return name


def resolve_plan(model: str = "demo", *, target: str = "host", quant: str = "q4_0",
                 backend: str | None = None, out: Path | None = None,
                 calib: CalibSettings | None = None, options: dict[str, str] | None = None,
                 force: bool = False) -> BuildPlan:
    """Check every option and return the plan; raises ArkError subclasses naming alternatives."""
    from arkinfer.targets import load_target

    tgt = load_target(target)
    name = choose_backend(tgt, backend)
    recipe, dtype = recipe_for(quant)
    try:
        if recipe is not None:
            tgt.check(name, quant_format=recipe.format)
        else:
            tgt.check(name, dtype=dtype)
    except TargetError as exc:
        raise TargetError(f"--quant {quant}: {exc.message}", hint=exc.hint) from None
    source = resolve_model_path(model)
    raw = read_config(source)
    recipe, notes = fit_recipe(recipe, raw, tgt, name)
    be = get_backend(name)
    notes += list(be.preflight(raw, recipe, tgt)) if hasattr(be, "preflight") else []
    model_name = model_name_of(model, source)
    out = Path(out) if out is not None else default_out(model_name, tgt.id, quant)
    if out.exists() and not force:
        raise ArkError(f"output {out} already exists",
                       hint="pass --force to replace it, or -o another folder")
    return BuildPlan(model, source, model_name, raw, tgt, name, quant, recipe, dtype, out,
                     calib or CalibSettings(), dict(options or {}), notes)
