"""Resolve `arkinfer build` options into a BuildPlan before any work starts.

Everything a user can get wrong (model path, target, backend, quant scheme, output folder) is
checked here, so a bad request fails in a second with the alternatives named instead of after
an hour of calibration:

    plan = resolve_plan("demo", target="host", quant="q4_0")
    plan.describe()          # [(key, value)] for the CLI
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arkinfer.backend import backend_names, check_backend_options, get_backend
from arkinfer.errors import NotAvailableError
from arkinfer.frontend.checkpoint import read_config, resolve_model_path
from arkinfer.output_folder import check_output
from arkinfer.resolve import resolve


@dataclass(frozen=True)
class CalibSettings:
    """Calibration text (None = the shipped corpus_train.txt), sequences and their length.
    Weight-only recipes (RTN, ternary) use none of it unless `report` asks for the per-layer SNR
    report, which needs activations."""

    path: Path | None = None
    samples: int = 128
    seq_len: int = 512
    seed: int = 0
    report: bool = False
    device: str = "auto"  # where calibration runs (quant/calib/device.py)

    def needed(self, recipe: Any) -> bool:
        """True when a build with `recipe` runs calibration."""
        from arkinfer.quant.calib.weight_only import is_weight_only

        return recipe is not None and (self.report or not is_weight_only(recipe))


@dataclass
class BuildPlan:
    model_arg: str
    source: Path
    model_name: str
    raw_config: dict[str, Any]
    target: Any  # arkinfer.targets.model.Target
    backend: str
    quant: str  # the resolved --quant scheme: a preset name or a float dtype (aliases resolved)
    recipe: Any  # arkinfer.quant.QuantRecipe, None for float schemes
    dtype: str
    out: Path
    calib: CalibSettings = field(default_factory=CalibSettings)
    options: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    draft: str | None = None  # `--draft SOURCE` carried by the artifact (draft_artifact.py)
    draft_vocab: int | None = None  # `--draft-vocab K`: FR-Spec's reduced draft LM head

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
                ("calibration", calib if self.calib.needed(self.recipe) else
                 "none (weight-only recipe: codes from the weights alone)"
                 if self.recipe is not None else "-"),
                *([("draft", self.draft + (f" (FR-Spec: {self.draft_vocab} most frequent "
                                            "tokens)" if self.draft_vocab else ""))]
                  if self.draft else []),
                ("output", str(self.out))]

    def as_dict(self) -> dict[str, Any]:
        return {"model": str(self.source), "target": self.target.id, "backend": self.backend,
                "quant": self.quant,
                "recipe": None if self.recipe is None else self.recipe.describe(),
                "dtype": self.dtype, "out": str(self.out),
                "calibration": {"path": str(self.calib.path) if self.calib.path else None,
                                "samples": self.calib.samples, "seq_len": self.calib.seq_len,
                                "seed": self.calib.seed,
                                "used": self.calib.needed(self.recipe)},
                "options": self.options, "notes": self.notes, "draft": self.draft,
                "draft_vocab": self.draft_vocab}


def check_artifact_output(out: Path, source: Path, *, force: bool) -> None:
    """Raise unless `build` may write `out`: --force replaces only an existing artifact whose
    manifest lists every file in it, unchanged (or an empty folder), never the current folder, a
    parent of it or the source model."""
    from arkinfer.pipeline.manifest import artifact_record

    check_output(out, force=force, what="ArkInfer artifact (a folder with a valid arkinfer.json)",
                 record=artifact_record, protected=[(source, "the source model")])


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
                 calib: CalibSettings | None = None,
                 options: Mapping[str, str] | Iterable[str] | None = None,
                 force: bool = False, draft: str | None = None,
                 draft_vocab: int | None = None) -> BuildPlan:
    """Check every option and return the plan; raises ArkError subclasses naming alternatives.

    `options`: the backend's options as a mapping or the CLI's `KEY=VALUE` strings, checked
    against the keys the backend declares (`arkinfer.backend.check_backend_options`).

    `--quant` is resolved by `arkinfer.resolve` (the same resolver `plan` and `quantize` use),
    then the backend must be registered and installed and its preflight must pass. `draft`
    (`--draft`) and `draft_vocab` (`--draft-vocab`) are checked against the model here too."""
    from arkinfer.targets import load_target

    tgt = load_target(target)
    source = resolve_model_path(model)
    raw = read_config(source)
    r = resolve(quant, raw, tgt, backend)
    name = choose_backend(tgt, r.backend)
    notes = list(r.notes)
    notes += list(get_backend(name).preflight(raw, r.recipe, tgt, r.dtype))  # raises if impossible
    # an unknown, empty or malformed --option fails here, naming the backend's keys, not at lower
    opts = check_backend_options(get_backend(name), options)
    c = calib or CalibSettings()
    if r.recipe is not None:  # checked even when a weight-only recipe does not use them
        from arkinfer.quant.calib_data import check_calibration_size

        check_calibration_size(c.samples, c.seq_len, raw.get("max_position_embeddings"),
                               raw.get("hidden_size"))
        from arkinfer.quant.calib.device import resolve_device

        resolve_device(c.device)  # --device cuda without a GPU: refused before any work
    from .draft_artifact import check_draft_request

    check_draft_request(draft, draft_vocab, raw, name)
    model_name = model_name_of(model, source)
    out = Path(out) if out is not None else default_out(model_name, tgt.id, r.scheme)
    check_artifact_output(out, source, force=force)
    from arkinfer.disk_space import check_free_disk

    from .disk_space import build_disk_bytes

    tokens = c.samples * c.seq_len if r.recipe is not None and c.needed(r.recipe) else 0
    check_free_disk(out, build_disk_bytes(raw, r.recipe or r.scheme, tokens),
                    "the artifact and its work files")
    return BuildPlan(model, source, model_name, raw, tgt, name, r.scheme, r.recipe, r.dtype, out,
                     c, opts, notes, draft, draft_vocab)
