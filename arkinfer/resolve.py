"""One answer to "what does `--quant Q` mean for this model on this target?", for every command.

`build`, `plan` and `quantize` (and so bench's prediction, which reads the recipe a build
recorded) call `resolve`, so they agree on the backend, the scheme and the recipe:

    r = resolve("gptq", raw_config, target)        # target: arkinfer.targets Target
    r.backend, r.scheme, r.recipe, r.notes         # "reference", "gptq", GPTQ g64, ["group size..."]

`--quant` takes a float dtype (`f32`, `f16`, `bf16`, and the aliases `fp16`, `fp32`, `float16`,
`bfloat16`, ...), a preset (quant/recipe.py), or `int4`: the first 4-bit preset whose format the
backend takes (marlin on tensorrt, q4_0 on gguf, ...). A backend takes what its capabilities
declare (`Backend.capabilities`) narrowed by the target profile's `[backends.NAME]` lists
(`takes`). Without an explicit backend the target's default backend is used when it takes the
scheme, else the first of the target's backends that does. A preset is then *fitted* to the model: a group size that does not divide the model's rows
shrinks (SmolLM2's 576-wide rows: g128 -> g64), and a format that cannot take the shapes falls
back (GGUF TQ needs rows that are multiples of 256 -> ArkInfer's `ternary`); every change is a
note. Shapes are asked of the storage format (`Format.shape_refusal`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from arkinfer.backend import FLOAT_DTYPES, get_backend
from arkinfer.errors import ArkError, TargetError

FLOAT_SCHEMES = FLOAT_DTYPES
ALIASES = {"fp16": "f16", "fp32": "f32", "float16": "f16", "float32": "f32", "half": "f16",
           "float": "f32", "bfloat16": "bf16"}
# Storage formats to try, in order, when the preset's format cannot take the model's shapes.
FORMAT_FALLBACKS = {"gguf-tq2_0": ("gguf-tq1_0", "ternary"),
                    "gguf-tq1_0": ("gguf-tq2_0", "ternary")}


@dataclass(frozen=True)
class Resolution:
    """requested: the user's --quant; scheme: the float dtype or preset it resolved to;
    recipe: the preset's QuantRecipe fitted to the model (None for float); dtype: the float
    dtype of unquantised tensors; notes: what was chosen or changed, for the user."""

    requested: str
    scheme: str
    backend: str
    recipe: Any
    dtype: str
    notes: tuple[str, ...] = ()


def _presets() -> dict[str, Any]:
    from arkinfer.quant.recipe import PRESETS

    return PRESETS


def quant_names() -> list[str]:
    """Every value `--quant` accepts (aliases aside): int4, the float dtypes, the presets."""
    return ["int4", *FLOAT_SCHEMES, *_presets()]


def allowed_formats(target: Any, backend: str) -> tuple[str, ...]:
    """The quant formats `backend` stores on `target`: the profile's `[backends.NAME]
    quant_formats` (in its order) that the backend declares (`Capabilities.formats`)."""
    declared = get_backend(backend).capabilities.formats
    return tuple(f for f in target.backend(backend).quant_formats if f in declared)


def allowed_dtypes(target: Any, backend: str) -> tuple[str, ...]:
    """The float build dtypes `backend` lowers on `target`: the profile's, narrowed to the
    backend's declared `Capabilities.dtypes`."""
    declared = get_backend(backend).capabilities.dtypes
    return tuple(str(d) for d in target.backend(backend).dtypes if str(d) in declared)


def takes(target: Any, backend: str, scheme: str) -> bool:
    """True when `backend` runs `scheme` (a float dtype or a preset name) on `target`: the
    target's profile allows it and the backend declares it."""
    if scheme in FLOAT_SCHEMES:
        return scheme in allowed_dtypes(target, backend)
    return _presets()[scheme].format in allowed_formats(target, backend)


def _refusal(quant: str, scheme: str, target: Any, backend: str) -> TargetError:
    """Why `backend` does not take `scheme` on `target`: the profile's refusal (it names the
    backends that take it), else the backend's declaration."""
    fmt = None if scheme in FLOAT_SCHEMES else _presets()[scheme].format
    try:
        target.check(backend, quant_format=fmt, dtype=scheme if fmt is None else None)
    except TargetError as exc:
        return TargetError(f"--quant {quant}: {exc.message}", hint=exc.hint)
    caps = get_backend(backend).capabilities
    declared = caps.formats if fmt is not None else caps.dtypes
    allowed = allowed_formats(target, backend) if fmt is not None else \
        allowed_dtypes(target, backend)
    return TargetError(f"--quant {quant}: backend '{backend}' cannot run {fmt or scheme} (it "
                       f"declares {', '.join(declared)}), although target '{target.id}' lists it",
                       hint=f"pick one of: {', '.join(allowed) or 'none'}; a target profile "
                       "only narrows what its backend declares")


def _scheme(quant: str, target: Any, order: list[str]) -> tuple[str, str | None, str]:
    """(scheme, backend or None, how) for the user's `quant` (aliases and int4 resolved)."""
    q = ALIASES.get(quant.lower(), quant.lower())
    if q == "int4":
        for name in order:
            for fmt in allowed_formats(target, name):
                for preset, r in _presets().items():
                    if r.format == fmt and r.bits == 4 and r.calib != "ternary":
                        return preset, name, f"int4 -> {preset} ({r.describe()}) on {name}"
        raise TargetError(f"no 4-bit format on backend(s) {', '.join(order)} of '{target.id}'",
                          hint=f"formats there: {', '.join(target.quant_formats) or 'none'}")
    if q not in FLOAT_SCHEMES and q not in _presets():
        raise ArkError(f"unknown --quant {quant!r}; known: {', '.join(quant_names())}",
                       hint="pick one of them (`arkinfer targets show TARGET` lists what a "
                       "target runs; presets: quant/recipe.py)")
    return q, None, ""


def resolve(quant: str, raw_config: dict[str, Any], target: Any,
            backend: str | None = None) -> Resolution:
    """Resolve `quant` for the model `raw_config` (config.json) on `target` (see module doc).

    Raises ArkError for an unknown name, TargetError when no allowed backend takes it."""
    order = [backend] if backend else [target.default_backend,
                                       *[b for b in target.backends if b != target.default_backend]]
    for name in order:
        target.backend(name)  # TargetError when the backend is not allowed on the target
    scheme, chosen, how = _scheme(quant, target, order)
    if chosen is None:
        chosen = next((name for name in order if takes(target, name, scheme)), None)
        if chosen is None:
            raise _refusal(quant, scheme, target, order[0])
        if chosen != target.default_backend and backend is None:
            how = f"{chosen}: the default backend {target.default_backend} does not take {scheme}"
    notes = [how] if how else []
    if scheme in FLOAT_SCHEMES:
        return Resolution(quant, scheme, chosen, None, scheme, tuple(notes))
    from arkinfer.quant.recipe import get_preset

    preset = get_preset(scheme)
    recipe, fit_notes = fit_recipe(preset, raw_config, allowed_formats(target, chosen))
    if backend is None and not fits(recipe.format, recipe, raw_config):
        # The chosen backend would leave linears in float: prefer one whose formats fit them all
        # (ternary on 128-wide rows: gguf's TQ formats cannot, the reference's `ternary` can).
        for name in order:
            if name != chosen and takes(target, name, scheme):
                alt, alt_notes = fit_recipe(preset, raw_config, allowed_formats(target, name))
                if fits(alt.format, alt, raw_config):
                    notes = [f"{name}: {chosen} would keep linears of this model in float "
                             f"({preset.format})"]
                    return Resolution(quant, scheme, name, alt, "f32", tuple(notes + alt_notes))
    return Resolution(quant, scheme, chosen, recipe, "f32", tuple(notes + fit_notes))


def linear_shapes(raw: dict[str, Any]) -> list[tuple[int, int]]:
    """(out_features, in_features) of the decoder linears described by a config.json dict."""
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or hidden // heads)
    kv = int(raw.get("num_key_value_heads") or heads)
    ffn = int(raw["intermediate_size"])
    return [(heads * head_dim, hidden), (kv * head_dim, hidden), (hidden, heads * head_dim),
            (ffn, hidden), (hidden, ffn)]


def fits(fmt_name: str, recipe: Any, raw: dict[str, Any]) -> bool:
    """True when format `fmt_name` can store every decoder linear of the model under `recipe`."""
    from arkinfer.quant.formats import get_format

    fmt = get_format(fmt_name)
    return all(fmt.shape_refusal(o, i, bits=recipe.bits, group_size=recipe.group_size) is None
               for o, i in linear_shapes(raw))


def fit_recipe(recipe: Any, raw: dict[str, Any],
               allowed_formats: tuple[str, ...] = ()) -> tuple[Any, list[str]]:
    """The recipe, or one with a smaller group / a fallback format (one of `allowed_formats`)
    when the preset's cannot take the model's shapes; with a note for every change."""
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
    for alt in FORMAT_FALLBACKS.get(recipe.format, ()):
        if alt in allowed_formats and fits(alt, recipe, raw):
            return replace(recipe, format=alt), [
                (f"{recipe.format} cannot store this model's linears (shapes {shapes}); "
                 f"using {alt} instead")]
    return recipe, [(f"{recipe.format} cannot store some of this model's linears (shapes "
                     f"{shapes}); they stay in float (see the manifest)")]
