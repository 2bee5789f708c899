"""Run the matrix: preflight every cell, run the ready ones N at a time, keep index.json current.

    folder, index = run_matrix("demo", cells, Path("dist"), MatrixSettings(jobs=2),
                               on_cell=lambda entry: ...)

Order of work: the output folder `OUT/MODEL` is checked with the same rules as `build -o`
(output_folder.check_output: never the current folder, a parent of it, the source model or a
non-empty folder ArkInfer did not write); the previous index.json is read (a resumed run reuses
what is current); every cell is decided in-process (preflight.decide, about a second each);
index.json is written with the decided cells and the ready ones `pending`; the ready cells run
in a thread pool of `jobs` threads, each thread driving one cell's child processes; index.json
is rewritten after every cell. Ctrl-C / SIGTERM stop the children (their builds clean up) and
leave an index.json whose unfinished cells are `pending`: rerunning resumes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arkinfer.errors import ArkError
from arkinfer.matrix import index as ix
from arkinfer.matrix.cell import CellJob, run_cell, terminate_children
from arkinfer.matrix.preflight import decide
from arkinfer.matrix.table import Cell

MATRIX_FOLDER = "ArkInfer matrix folder (one with a valid matrix index.json)"
# A short bench: enough for a decode rate per cell, seconds on the demo model.
DEFAULT_BENCH_ARGS = ("-p", "64", "-n", "16", "-r", "2", "--warmup", "1")


@dataclass(frozen=True)
class MatrixSettings:
    """jobs: cells at once; force: rebuild current artifacts; reverify: re-measure parity of
    current artifacts (`arkinfer verify`) instead of trusting their unchanged inputs; rebench:
    bench them again (on-device jobs: the rows recorded are from the machine that built them);
    thresholds: `[CELL:]KEY=VALUE` overrides (CELL = TARGET.PRESET, a target id or a preset);
    build_args / bench_args: passed on to `arkinfer build` / `arkinfer bench`."""

    jobs: int = 1
    force: bool = False
    reverify: bool = False
    rebench: bool = False
    thresholds: tuple[str, ...] = ()
    build_args: tuple[str, ...] = ()
    bench_args: tuple[str, ...] = DEFAULT_BENCH_ARGS


def cell_thresholds(items: tuple[str, ...], cell: Cell) -> tuple[str, ...]:
    """The `KEY=VALUE` overrides that apply to `cell` (no selector: every cell)."""
    out = []
    for item in items:
        selector, sep, rest = item.partition(":")
        if not sep:
            out.append(item)
        elif selector in (cell.name, cell.target, cell.preset):
            out.append(rest)
    return tuple(out)


def check_thresholds(items: tuple[str, ...], cells: list[Cell]) -> None:
    """ArkError for a selector that names no cell or a value `build --threshold` refuses."""
    from arkinfer.pipeline.verify import parse_threshold_overrides

    names = {n for c in cells for n in (c.name, c.target, c.preset)}
    for item in items:
        selector, sep, rest = item.partition(":")
        if sep and selector not in names:
            raise ArkError(f"--threshold {item!r}: {selector!r} names no selected cell; cells: "
                           f"{', '.join(c.name for c in cells)}",
                           hint="write --threshold [TARGET.PRESET:]KEY=VALUE, e.g. "
                           f"--threshold {cells[0].name}:top1=0.5")
        parse_threshold_overrides([rest if sep else item])


def matrix_folder(model: str, out_root: Path, cells: Iterable[Cell] = ()) -> tuple[Path, Path]:
    """(OUT/MODEL, the source checkpoint), after build's -o safety rules for OUT/MODEL: it may be
    new, empty, or a matrix folder ArkInfer wrote (a valid index.json, and nothing but what a
    matrix run of its cells and of `cells` writes: `index.matrix_record`)."""
    from arkinfer.frontend.checkpoint import read_config, resolve_model_path
    from arkinfer.output_folder import check_output, child_folder
    from arkinfer.pipeline.plan import model_name_of

    source = resolve_model_path(model)
    read_config(source)  # not a model (an empty folder, no config.json): the whole run's error
    folder = child_folder(Path(out_root), model_name_of(model, source), "the model's name")
    names = [c.name for c in cells]
    check_output(folder, force=True, what=MATRIX_FOLDER,
                 record=lambda p: ix.matrix_record(p, names),
                 protected=[(source, "the source model")])
    return folder, source


def _child_env(jobs: int) -> dict[str, str]:
    """Cells running side by side share the cores: give each its share of threads (unless the
    user chose OMP_NUM_THREADS), so two cells do not each spin up every core."""
    if jobs <= 1 or "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // jobs))}


def _done_entry(cell: Cell, job: CellJob, outcome, seconds: float) -> dict[str, Any]:
    plan = job.plan
    entry = ix.blank_entry(cell, outcome.status, backend=plan.backend, reason=outcome.reason)
    if outcome.manifest is not None and plan.out.is_dir():
        entry.update(ix.artifact_fields(plan.out, outcome.manifest))
    entry["verify"] = outcome.verify
    if outcome.bench_rows is not None:
        entry["bench"] = {"args": list(job.bench_args), "file": f"{cell.name}.bench.json",
                          "rows": outcome.bench_rows}
        entry["decode"] = ix.decode_fields(outcome.bench_rows, outcome.manifest)
    entry["seconds"] = {**outcome.seconds, "total": round(seconds, 3)}
    return entry


def run_matrix(model: str, cells: list[Cell], out_root: Path, settings: MatrixSettings,
               on_cell: Callable[[dict[str, Any]], None] | None = None
               ) -> tuple[Path, dict[str, Any]]:
    """Build, verify and bench every cell (see the module docstring); returns (OUT/MODEL, the
    final index). Raises ArkError only for problems of the whole run (model, -o, arguments)."""
    check_thresholds(settings.thresholds, cells)
    folder, source = matrix_folder(model, out_root, cells)
    folder.mkdir(parents=True, exist_ok=True)
    previous = ix.read_index(folder)
    index = ix.new_index(folder.name, source, settings.bench_args)
    entries = {e["name"]: e for e in (previous or {}).get("cells", [])}
    report = on_cell or (lambda entry: None)

    def save() -> None:
        index["cells"] = [entries[name] for name in sorted(entries)]
        ix.write_index(folder, index)

    jobs: list[tuple[Cell, CellJob]] = []
    for cell in cells:
        t0 = time.perf_counter()
        d = decide(cell, model, folder / cell.name)
        if d.status != "ready":
            entries[cell.name] = ix.blank_entry(cell, d.status, reason=d.reason, hint=d.hint)
            entries[cell.name]["seconds"]["total"] = round(time.perf_counter() - t0, 3)
            report(entries[cell.name])
            continue
        prev = entries.get(cell.name)
        entries[cell.name] = ix.blank_entry(cell, backend=d.plan.backend)
        jobs.append((cell, CellJob(
            plan=d.plan, model=model, log=folder / "logs" / f"{cell.name}.log",
            threshold_items=cell_thresholds(settings.thresholds, cell),
            build_args=settings.build_args, bench_args=settings.bench_args, force=settings.force,
            reverify=settings.reverify, rebench=settings.rebench, previous=prev, env=_child_env(settings.jobs))))
    save()
    pool = ThreadPoolExecutor(max_workers=max(1, settings.jobs))
    try:
        started = {pool.submit(_timed, job): (cell, job) for cell, job in jobs}
        for future in as_completed(started):
            cell, job = started[future]
            outcome, seconds = future.result()
            entries[cell.name] = _done_entry(cell, job, outcome, seconds)
            save()
            report(entries[cell.name])
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        terminate_children()
        save()
        raise
    pool.shutdown()
    save()
    return folder, index


def _timed(job: CellJob):
    t0 = time.perf_counter()
    outcome = run_cell(job)
    return outcome, time.perf_counter() - t0


def merge_into(paths: list[Path], out_root: Path) -> tuple[Path, dict[str, Any]]:
    """Merge the index.json files at `paths` (files, or folders searched recursively) into
    OUT/MODEL/index.json (same -o rules as a run); what CI's merge job calls. Artifacts stay
    where they are: each entry's `path` is relative to the index that built it."""
    from arkinfer.output_folder import check_output, child_folder

    files: list[Path] = []
    for p in paths:
        found = sorted(Path(p).rglob(ix.INDEX_NAME)) if Path(p).is_dir() else [Path(p)]
        if not found:
            raise ArkError(f"--merge {p}: no {ix.INDEX_NAME} there",
                           hint="point --merge at the folders the cell jobs uploaded")
        files += found
    indexes = []
    for f in files:
        index = ix.read_index(f.parent) if f.name == ix.INDEX_NAME else None
        if index is None:
            raise ArkError(f"--merge {f}: not an {ix.INDEX_NAME}",
                           hint=f"give {ix.INDEX_NAME} files or folders that hold them")
        indexes.append(index)
    merged = ix.merge_indexes(indexes)
    folder = child_folder(Path(out_root), merged["model"], f"the `model` of {files[0]}")
    check_output(folder, force=True, what=MATRIX_FOLDER, record=ix.matrix_record)
    folder.mkdir(parents=True, exist_ok=True)
    ix.write_index(folder, merged)
    return folder, merged
