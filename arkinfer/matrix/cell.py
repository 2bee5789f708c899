"""Run one ready cell: `arkinfer build`, `arkinfer verify`, `arkinfer bench`, each in its own process.

The cell calls the CLI verbs themselves (`python -m arkinfer.cli.main VERB ... --json`), so a
matrix artifact is exactly what `arkinfer build` writes, and a crash, an out-of-memory kill or a
failed gate ends only that cell. The steps:

    build   unless the artifact is current (preflight.stale_reason); `--force` only replaces an
            ArkInfer artifact (build's own -o rules). Its verify stage is the parity gate.
    verify  for a current artifact with --reverify: re-measured against the float source; a
            failure rebuilds the cell
    bench   `arkinfer bench ARTIFACT --json BENCH_ARGS`, unless the previous run's rows are for
            this same artifact (manifest sha256) and the same arguments (and not --rebench)

Every process's output is appended to `logs/CELL.log`; a failure's reason is the CLI's own
`error:` / `hint:` lines (or the exit signal).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arkinfer.matrix.preflight import stale_reason

_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()  # set by terminate_children: start no further process


@dataclass(frozen=True)
class CellJob:
    """Everything a ready cell needs. `plan`: its BuildPlan; `threshold_items`: the `K=V`
    overrides for this cell; `previous`: its entry in the last index.json (or None)."""

    plan: Any
    model: str
    log: Path
    threshold_items: tuple[str, ...] = ()
    build_args: tuple[str, ...] = ()
    bench_args: tuple[str, ...] = ()
    force: bool = False
    reverify: bool = False
    rebench: bool = False
    previous: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class CellOutcome:
    """What ran and what came out; `entry_fields` fills the index entry (index.py)."""

    status: str = "built"  # built | up_to_date | failed
    reason: str | None = None
    manifest: dict[str, Any] | None = None
    verify: dict[str, Any] | None = None
    bench_rows: list[dict[str, Any]] | None = None
    seconds: dict[str, float] = field(default_factory=dict)


class StepFailed(Exception):
    def __init__(self, step: str, reason: str) -> None:
        super().__init__(f"{step}: {reason}")
        self.step, self.reason = step, reason


def run_cell(job: CellJob) -> CellOutcome:
    """Build (if needed), verify (with --reverify), bench; never raises for a cell's failure."""
    from arkinfer.pipeline.verify import parse_threshold_overrides

    out = CellOutcome()
    plan = job.plan
    overrides = parse_threshold_overrides(list(job.threshold_items))
    try:
        why = "--force" if job.force else stale_reason(plan, overrides)
        if why is None and job.reverify:
            try:
                out.verify = _verify(job, out)
            except StepFailed as exc:
                why = f"re-verification failed ({exc.reason})"
        if why is None:
            out.status, out.reason = "up_to_date", None
        else:  # a first build needs no reason; a rebuild says why
            out.reason = why if plan.out.exists() else None
            out.manifest = _build(job, out, replace=plan.out.exists())
        out.manifest = out.manifest or _read_manifest(plan.out, "verify")
        if out.verify is None:
            out.verify = {"how": "build" if out.status == "built" else "recorded",
                          **_verification(out.manifest)}
        out.bench_rows = _bench(job, out)
    except StepFailed as exc:
        out.status, out.reason = "failed", f"{exc.step}: {exc.reason}"
    return out


def _read_manifest(folder: Path, step: str) -> dict[str, Any]:
    from arkinfer.errors import ArkError
    from arkinfer.pipeline.manifest import read_manifest

    try:
        return read_manifest(folder)
    except ArkError as exc:
        raise StepFailed(step, exc.message) from None


def _verification(manifest: dict[str, Any]) -> dict[str, Any]:
    v = manifest["verification"]
    return {"passed": v["passed"], "thresholds": v["thresholds"], "metrics": v["metrics"],
            "failures": v["failures"]}


def _thresholds(job: CellJob) -> list[str]:
    return [a for item in job.threshold_items for a in ("--threshold", item)]


def _build(job: CellJob, out: CellOutcome, *, replace: bool) -> dict[str, Any]:
    plan = job.plan
    args = ["build", job.model, "-t", plan.target.path if _is_file_profile(plan) else
            plan.target.id, "-q", plan.quant, "-b", plan.backend, "-o", str(plan.out), "--json",
            *_thresholds(job), *job.build_args, *(["--force"] if replace else [])]
    data = _cli(job, "build", args, out)
    data.pop("path", None)
    return data


def _is_file_profile(plan: Any) -> bool:
    """A user's own profile (`-t ./board.toml`) is passed on by path, a shipped one by id."""
    return bool(plan.target.path) and Path(plan.target.path).is_absolute()


def _verify(job: CellJob, out: CellOutcome) -> dict[str, Any]:
    result = _cli(job, "verify", ["verify", str(job.plan.out), "--source", str(job.plan.source),
                                  "--json", *_thresholds(job)], out)
    return {"how": "verify", "passed": result["passed"], "thresholds": result["thresholds"],
            "metrics": result["metrics"], "failures": result["failures"]}


def _bench(job: CellJob, out: CellOutcome) -> list[dict[str, Any]]:
    prev = job.previous or {}
    sha = manifest_sha256(job.plan.out)
    if (out.status == "up_to_date" and not job.rebench and prev.get("manifest_sha256") == sha
            and (prev.get("bench") or {}).get("args") == list(job.bench_args)):
        return prev["bench"]["rows"]
    rows = _cli(job, "bench", ["bench", str(job.plan.out), "--json", *job.bench_args], out)
    bench_file = job.plan.out.parent / f"{job.plan.out.name}.bench.json"
    tmp = bench_file.with_name(f".{bench_file.name}.{os.getpid()}")
    tmp.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, bench_file)
    return rows


def manifest_sha256(folder: Path) -> str | None:
    from arkinfer.pipeline.manifest import MANIFEST_NAME, sha256_file

    path = folder / MANIFEST_NAME
    return sha256_file(path) if path.is_file() else None


def _cli(job: CellJob, step: str, args: list[str], out: CellOutcome) -> Any:
    """Run `arkinfer ARGS` in a child process; its stdout parsed as JSON. StepFailed with the
    CLI's error/hint lines (or the signal) when it exits non-zero."""
    cmd = [sys.executable, "-m", "arkinfer.cli.main", *args]
    t0 = time.perf_counter()
    job.log.parent.mkdir(parents=True, exist_ok=True)
    with open(job.log, "a", encoding="utf-8") as log:
        log.write(f"$ arkinfer {' '.join(args)}\n")
        log.flush()
        with _LIVE_LOCK:  # checked under the lock: no process starts after terminate_children
            if _STOPPING.is_set():
                raise StepFailed(step, "the matrix run was interrupted")
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                    env={**os.environ, **job.env})
            _LIVE.add(proc)
        try:
            stdout, _ = proc.communicate()
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(proc)
        log.write(f"[exit {proc.returncode}]\n")
    out.seconds[step] = round(out.seconds.get(step, 0.0) + time.perf_counter() - t0, 3)
    if proc.returncode != 0:
        raise StepFailed(step, _failure_reason(job.log, proc.returncode))
    try:
        return json.loads(stdout)
    except ValueError:
        raise StepFailed(step, f"its --json output is not JSON: {stdout[:200]!r}") from None


def _failure_reason(log: Path, code: int) -> str:
    """The last run's `error:` and `hint:` lines from the log, else how the process ended."""
    text = log.read_text(encoding="utf-8", errors="replace")
    last = text[text.rfind("\n$ arkinfer ") + 1:]
    lines = [ln.strip() for ln in last.splitlines()]
    picked = [ln for ln in lines if ln.startswith(("error:", "hint:"))]
    if picked:
        return " ".join(picked[-2:])
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    tail = [ln for ln in lines if ln and not ln.startswith(("$ arkinfer", "[exit"))]
    return f"exit code {code}" + (f": {tail[-1]}" if tail else "")


def terminate_children() -> None:
    """SIGTERM every cell process still running (builds clean up their staging folders)."""
    with _LIVE_LOCK:
        _STOPPING.set()
        procs = list(_LIVE)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
