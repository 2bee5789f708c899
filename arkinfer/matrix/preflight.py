"""Decide a cell before any work, in about a second: can it run here, and is its artifact current?

`decide` resolves the cell exactly as `arkinfer build` does (`pipeline.plan.resolve_plan`: the
--quant resolver, the backend registry, the backend's preflight, the -o safety rules), so what
it calls skipped or refused is what `build` would refuse:

    skipped  the backend is not installed or not implemented here (NotAvailableError): the
             reason and the next step (the install command); never a failure
    refused  the target or the backend cannot take this model in this preset (TargetError and
             the other preflight errors): the model does not fit the cell; never a failure
    failed   the output folder is in the way (a folder ArkInfer did not write): nothing built
    ready    `plan` is the BuildPlan the cell's `arkinfer build` will follow

`stale_reason` says why an existing artifact must be rebuilt, or None when it is current: its
files match its manifest, it was built by this ArkInfer from the same source files for the same
target, backend and recipe, and its recorded parity gate passed under the thresholds this run
applies. Those are all the inputs of verify, so a current artifact verifies as it did (pass
--reverify to re-measure anyway).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from arkinfer.errors import ArkError, NotAvailableError
from arkinfer.matrix.table import Cell
from arkinfer.output_folder import OutputError

Status = Literal["ready", "skipped", "refused", "failed"]


@dataclass(frozen=True)
class Decision:
    status: Status
    reason: str | None = None
    hint: str | None = None  # the next step: for a missing backend, its install command
    plan: Any = None  # arkinfer.pipeline.plan.BuildPlan when ready


def decide(cell: Cell, model: str, out: Path) -> Decision:
    """The cell's fate before any work (see the module docstring); `out` is its artifact folder."""
    from arkinfer.pipeline.plan import resolve_plan

    try:
        plan = resolve_plan(model, target=cell.target_arg, quant=cell.preset, out=out,
                            force=True)  # an existing artifact is replaced only when stale
    except NotAvailableError as exc:
        return Decision("skipped", exc.message, exc.hint)
    except OutputError as exc:
        return Decision("failed", exc.message, exc.hint)
    except ArkError as exc:
        return Decision("refused", exc.message, exc.hint)
    return Decision("ready", plan=plan)


@functools.cache
def source_hashes(source: Path) -> dict[str, str]:
    """sha256 of every file at the top of the source folder, as the manifest records them
    (computed once per run: an 8B checkpoint is 16 GB)."""
    from arkinfer.pipeline.manifest import source_file_hashes

    return source_file_hashes(source)


def stale_reason(plan: Any, overrides: dict[str, float]) -> str | None:
    """Why the artifact at `plan.out` must be rebuilt, or None when it is current."""
    from arkinfer import __version__
    from arkinfer.pipeline.manifest import check_files, read_manifest, recipe_of
    from arkinfer.pipeline.verify import thresholds_for

    if not plan.out.exists():
        return "no artifact yet"
    try:
        m = read_manifest(plan.out)
        problems = check_files(plan.out, m)
        recipe = recipe_of(m)
    except (ArkError, TypeError, ValueError) as exc:
        return f"the existing artifact is unreadable ({getattr(exc, 'message', exc)})"
    if problems:
        return f"its files changed since the build ({problems[0]})"
    wanted = thresholds_for(plan.recipe, plan.dtype, overrides).as_dict()
    for what, recorded, now in (
            ("ArkInfer version", m["arkinfer_version"], __version__),
            ("target", m["target"]["id"], plan.target.id),
            ("backend", m["backend"]["name"], plan.backend),
            ("quant scheme", m["quant"]["scheme"], plan.quant),
            ("recipe", recipe, plan.recipe),
            ("source files", m["source"]["files"], source_hashes(plan.source)),
            ("parity thresholds", m["verification"]["thresholds"], wanted)):
        if recorded != now:
            return f"the {what} changed since the build"
    if not m["verification"]["passed"]:
        return "its recorded verification failed"
    return None
