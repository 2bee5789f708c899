"""`arkinfer matrix` — one verified, benchmarked artifact per (target, preset) cell."""

from __future__ import annotations

import shlex
import signal
from pathlib import Path
from typing import Annotated, Any

import typer

from arkinfer.cli._errors import handle_errors
from arkinfer.cli._options import ForceOpt, JsonOpt
from arkinfer.cli._output import console, err_console, print_json, print_table, terminal_safe

HELP = ("Build the matrix: every (target, preset) cell with `arkinfer build`, then a short "
        "`arkinfer bench`, each cell in its own process so one failure never stops the others. "
        "The cells are each target's [matrix] presets (`--quant default`, from targets/*.toml) or "
        "the --quant list for every --targets target. Cells whose backend is not installed here "
        "are skipped with the install command, cells the target cannot take for this model are "
        "refused, both decided before any build. Writes OUT/MODEL/TARGET.PRESET/ artifacts, "
        "index.json (schema: arkinfer/matrix/index.schema.json), summary.md and summary.png. A "
        "rerun skips cells whose artifact is current (--force rebuilds, --reverify re-measures "
        "parity); a killed run resumes. Exits 1 when any cell that could run failed.")
EXAMPLES = [
    "arkinfer matrix demo --targets all --quant default -j 2",
    "arkinfer matrix ./smollm2-hf --targets host,rpi5 --quant q4_0,q8_0 -o dist",
    "arkinfer matrix demo --targets jetson-orin --quant marlin --build-args '--samples 16'",
    "arkinfer matrix demo --targets host --threshold host.q8_0:top1=0.95 --json",
    "arkinfer matrix demo --list --json",
    "arkinfer matrix --merge downloaded/ -o dist",
]

TargetsOpt = Annotated[str, typer.Option(
    "--targets", "-t", help="Comma list of target ids, aliases or .toml profiles, or 'all'.")]
QuantsOpt = Annotated[str, typer.Option(
    "--quant", "-q", help="Comma list of --quant values, or 'default': each target's [matrix] "
    "presets.")]


def _args(text: str, flag: str) -> tuple[str, ...]:
    from arkinfer.errors import ArkError

    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise ArkError(f"{flag} {text!r} is not a command line: {exc}",
                       hint=f"quote it as one argument, e.g. {flag} '-p 64 -n 16'") from None


def _line(entry: dict[str, Any]) -> None:
    """One progress line per finished cell on stderr."""
    mark = {"built": "✓", "up_to_date": "✓", "skipped": "-", "refused": "-",
            "failed": "✗"}.get(entry["status"], "?")
    what = entry["status"].replace("_", " ")
    why = f": {entry['reason']}" if entry["reason"] and entry["status"] != "built" else ""
    err_console.print(terminal_safe(f"{mark} {entry['name']:<32} {what} "
                                    f"({entry['seconds']['total']:.1f} s){why}"))


def _table(index: dict[str, Any]) -> None:
    rows = []
    for e in index["cells"]:
        d = e["decode"] or {}
        rows.append([e["name"], e["status"].replace("_", " "), e["backend"] or "-",
                     "-" if not d else f"{d['measured_ts']:.1f}",
                     "-" if not d.get("predicted_ts") else f"{d['predicted_ts']:.0f}",
                     f"{e['seconds']['total']:.1f}",
                     (e["reason"] or "") + (f" (hint: {e['hint']})" if e["hint"] else "")])
    print_table(f"matrix {index['model']}", ["cell", "status", "backend", "decode t/s",
                                              "predicted", "seconds", "reason"], rows)


def _list(model: str, cells, out: Path, json_out: bool) -> None:
    from arkinfer.matrix.preflight import decide
    from arkinfer.matrix.run import matrix_folder

    folder, _ = matrix_folder(model, out, cells)
    listed = []
    for cell in cells:
        d = decide(cell, model, folder / cell.name)
        listed.append({"name": cell.name, "target": cell.target, "preset": cell.preset,
                       "backend": d.plan.backend if d.plan else None, "status": d.status,
                       "reason": d.reason, "hint": d.hint,
                       "device_labels": list(cell.device_labels)})
    if json_out:
        print_json({"model": folder.name, "cells": listed, "github": _github_matrix(listed)})
        return
    print_table(f"matrix {folder.name}", ["cell", "backend", "status", "device runner",
                                          "reason"],
                [[c["name"], c["backend"] or "-", c["status"],
                  ",".join(c["device_labels"]) or "-",
                  (c["reason"] or "") + (f" (hint: {c['hint']})" if c["hint"] else "")]
                 for c in listed])


def _github_matrix(listed: list[dict[str, Any]]) -> dict[str, Any]:
    """The `strategy.matrix` values .github/workflows/artifacts.yml fans out over: a hosted job per
    cell (a skipped or refused one finishes in a minute and still reports itself in index.json),
    and an on-device job per ready cell whose target names a self-hosted runner."""
    hosted = [{"name": c["name"], "target": c["target"], "preset": c["preset"]} for c in listed]
    device = [{**h, "labels": c["device_labels"]} for h, c in zip(hosted, listed)
              if c["device_labels"] and c["status"] == "ready"]
    return {"hosted": {"include": hosted}, "device": {"include": device},
            "device_count": len(device)}


def _finish(folder: Path, index: dict[str, Any], json_out: bool,
            selected: set[str] | None = None) -> None:
    """Write the summary, print the result, raise when a cell of this run (`selected`; None =
    every cell, for --merge) failed. Entries kept from earlier runs do not fail this one."""
    from arkinfer.errors import ArkError
    from arkinfer.matrix.summary import write_summary

    paths, plot_note = write_summary(folder, index)
    if json_out:
        print_json(index)
    else:
        _table(index)
        console.print(terminal_safe(f"index: {folder / 'index.json'}; summary: "
                                    + ", ".join(str(p) for p in paths)))
        if plot_note:
            err_console.print(terminal_safe(f"note: plot {plot_note}"))
    ran = [e for e in index["cells"] if selected is None or e["name"] in selected]
    failed = [e["name"] for e in ran if e["status"] == "failed"]
    if failed:
        raise ArkError(f"{len(failed)} of {len(ran)} cells failed: {', '.join(failed)}",
                       hint=f"the reasons are in {folder / 'summary.md'} and the logs in "
                       f"{folder / 'logs'}; fix them and rerun (finished cells are kept)")


def _terminate_as_interrupt() -> None:
    """SIGTERM (CI cancelling the job, `kill`) stops the run like Ctrl-C: children are stopped
    and index.json keeps the unfinished cells as pending."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


@handle_errors
def command(
    model: Annotated[str, typer.Argument(help="HF folder, .gguf file, or 'demo'.")] = "demo",
    targets: TargetsOpt = "all",
    quant: QuantsOpt = "default",
    out: Annotated[Path, typer.Option("-o", "--out", help="Output root: artifacts go to "
                                      "OUT/MODEL/TARGET.PRESET/.")] = Path("dist"),
    jobs: Annotated[int, typer.Option("-j", "--jobs", help="Cells run at once.")] = 1,
    bench_args: Annotated[str, typer.Option(
        "--bench-args", help="Arguments for each cell's `arkinfer bench`.")
    ] = "-p 64 -n 16 -r 2 --warmup 1",
    build_args: Annotated[str, typer.Option(
        "--build-args", help="Extra arguments for each cell's `arkinfer build`, e.g. "
        "'--samples 16 --seq-len 256'.")] = "",
    threshold: Annotated[list[str] | None, typer.Option(
        "--threshold", help="Override a parity threshold, for every cell or one: "
        "[TARGET.PRESET:]KEY=VALUE (KEY: top1, kl, ppl_delta; repeatable).")] = None,
    force: ForceOpt = False,
    reverify: Annotated[bool, typer.Option(
        "--reverify", help="Re-measure parity of current artifacts with `arkinfer verify` "
        "(default: current = same inputs and files, recorded gate passed).")] = False,
    rebench: Annotated[bool, typer.Option(
        "--rebench", help="Bench current artifacts again (e.g. on the device) instead of "
        "keeping the rows recorded when they were built.")] = False,
    list_only: Annotated[bool, typer.Option(
        "--list", help="Print the cells and what would happen to each; build nothing.")] = False,
    merge: Annotated[list[Path] | None, typer.Option(
        "--merge", help="Merge these index.json files (or folders holding them) into "
        "OUT/MODEL/ and write the summary; build nothing (repeatable).")] = None,
    json_out: JsonOpt = False,
) -> None:
    from arkinfer.errors import ArkError
    from arkinfer.matrix import MatrixSettings, run_matrix, select_cells
    from arkinfer.matrix.run import merge_into

    if merge:
        folder, index = merge_into(merge, out)
        _finish(folder, index, json_out)
        return
    if jobs < 1:
        raise ArkError(f"-j {jobs}: run at least one cell at a time", hint="e.g. -j 2")
    cells = select_cells(targets, quant)
    if list_only:
        _list(model, cells, out, json_out)
        return
    settings = MatrixSettings(jobs=jobs, force=force, reverify=reverify, rebench=rebench,
                              thresholds=tuple(threshold or ()),
                              build_args=_args(build_args, "--build-args"),
                              bench_args=_args(bench_args, "--bench-args"))
    if not json_out:
        err_console.print(f"matrix: {len(cells)} cells, {jobs} at a time")
    _terminate_as_interrupt()
    folder, index = run_matrix(model, cells, out, settings,
                               on_cell=None if json_out else _line)
    _finish(folder, index, json_out, {c.name for c in cells})
