"""`index.json`: one entry per cell, validated by index.schema.json, written atomically.

    write_index(folder, index)        # validate, write `.index.json.PID`, rename over index.json
    index = read_index(folder)        # None when absent; IndexFileError when damaged
    merged = merge_indexes([a, b])    # CI: one index from every cell job's index

An entry (the schema documents every field):

    {"name": "host.q4_0", "target": "host", "preset": "q4_0", "backend": "gguf",
     "status": "built", "reason": "no artifact yet", "hint": null, "path": "host.q4_0",
     "manifest_sha256": "…", "sizes": {"artifact_bytes", "weights_bytes", "files"},
     "verify": {"how", "passed", "thresholds", "metrics", "failures"},
     "bench": {"args": [...], "file": "host.q4_0.bench.json", "rows": [...]},
     "decode": {"test": "tg16", "measured_ts", "predicted_ts", "predicted_device_ts"},
     "seconds": {"build", "bench", "total"}, "device_labels": []}
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from functools import cache
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from arkinfer.errors import ArkError
from arkinfer.matrix.table import Cell

INDEX_NAME = "index.json"
SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("index.schema.json")
# When two indexes name one cell (CI: a cell job and the plan), the more informative one wins.
_RANK = {"pending": 0, "skipped": 1, "refused": 2, "failed": 3, "up_to_date": 4, "built": 5}


class IndexFileError(ArkError):
    """An index.json cannot be read or does not match its schema."""


@cache
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def validate_index(data: Any, where: str = INDEX_NAME) -> None:
    """Raise IndexFileError listing the first schema violations (JSON path and message)."""
    import jsonschema

    errors = sorted(jsonschema.Draft202012Validator(schema()).iter_errors(data),
                    key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message[:200]}"
                 for e in errors[:10]]
        raise IndexFileError(f"{where} does not match the matrix index schema v{SCHEMA_VERSION}:"
                             "\n  " + "\n  ".join(lines),
                             hint="delete it and rerun `arkinfer matrix` (artifacts that are "
                             "current are kept)")


def new_index(model: str, source: Path, bench_args: tuple[str, ...]) -> dict[str, Any]:
    from arkinfer import __version__

    return {"schema_version": SCHEMA_VERSION, "model": model, "source": str(source),
            "arkinfer_version": __version__, "updated": _now(), "bench_args": list(bench_args),
            "cells": []}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def read_index(folder: Path) -> dict[str, Any] | None:
    path = folder / INDEX_NAME
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise IndexFileError(f"{path} cannot be read: {exc}",
                             hint="delete it and rerun `arkinfer matrix`") from None
    validate_index(data, str(path))
    return data


def matrix_record(folder: Path, run_cells: Iterable[str] = ()) -> dict[str, str | None] | None:
    """The entries a matrix run writes in `folder` (output_folder's `record` for a matrix
    folder): index.json, summary.md / summary.png, and per cell of the index or of this run
    (`run_cells`) its artifact folder (a subtree: each cell's build applies the artifact rules to
    it, so a user's folder there fails that cell and stays untouched), `CELL.bench.json`,
    `logs/CELL.log` and the hidden leftovers of its builds and index writes. None when `folder`
    holds no valid matrix index (a web project's index.json is not one)."""
    from arkinfer.matrix.summary import MARKDOWN_NAME, PLOT_NAME

    try:
        index = read_index(folder)
    except IndexFileError:
        return None
    if index is None:
        return None
    names: dict[str, str | None] = {INDEX_NAME: None, MARKDOWN_NAME: None, PLOT_NAME: None}
    cells = sorted({e["name"] for e in index["cells"]} | set(run_cells))
    for cell in cells:
        names.update({f"{cell}/": None, f"{cell}.bench.json": None, f"logs/{cell}.log": None})
    hidden = re.compile(rf"^\.({'|'.join(map(re.escape, [INDEX_NAME, *cells]))})\.")
    for p in folder.iterdir():
        if hidden.match(p.name):
            names[p.name + ("/" if p.is_dir() and not p.is_symlink() else "")] = None
    return names


def write_index(folder: Path, index: dict[str, Any]) -> Path:
    """Validate, then replace `folder/index.json` atomically (a kill leaves the old or the new)."""
    index["updated"] = _now()
    validate_index(index)
    path = folder / INDEX_NAME
    tmp = folder / f".{INDEX_NAME}.{os.getpid()}"
    tmp.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def blank_entry(cell: Cell, status: str = "pending", *, backend: str | None = None,
                reason: str | None = None, hint: str | None = None) -> dict[str, Any]:
    """An entry with nothing built (pending, skipped, refused, or failed before building)."""
    return {"name": cell.name, "target": cell.target, "preset": cell.preset, "backend": backend,
            "status": status, "reason": reason, "hint": hint, "path": None,
            "manifest_sha256": None, "sizes": None, "verify": None, "bench": None,
            "decode": None, "seconds": {"total": 0.0}, "device_labels": list(cell.device_labels)}


def artifact_fields(folder: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """path, manifest_sha256 and sizes of the artifact in `folder` (next to index.json)."""
    from arkinfer.matrix.cell import manifest_sha256

    files = [p for p in folder.rglob("*") if p.is_file()]
    return {"path": folder.name, "manifest_sha256": manifest_sha256(folder),
            "sizes": {"artifact_bytes": sum(p.stat().st_size for p in files),
                      "weights_bytes": int(manifest["memory"]["weights_bytes"]),
                      "files": len(files)}}


def decode_fields(rows: list[dict[str, Any]], manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The first decode (tg) row at depth 0: measured and predicted tokens/s, plus the manifest's
    prediction for the target device (dense attention, 4096 tokens of context)."""
    tg = [r for r in rows if str(r["test"]).startswith("tg")]
    if not tg:
        return None
    row = min(tg, key=lambda r: r.get("n_depth", 0))
    device = ((manifest.get("prediction") or {}).get("dense") or {}).get("4096") or {}
    return {"test": row["test"], "measured_ts": float(row["avg_ts"]),
            "predicted_ts": row.get("predicted_ts"),
            "predicted_device_ts": device.get("decode_tok_s")}


def merge_indexes(indexes: list[dict[str, Any]]) -> dict[str, Any]:
    """One index from several (CI's cell jobs): per cell the most informative entry (built >
    up_to_date > failed > refused > skipped > pending), cells sorted by name."""
    if not indexes:
        raise IndexFileError("no index.json to merge",
                             hint="point --merge at the folders the cell jobs uploaded")
    models = sorted({i["model"] for i in indexes})
    if len(models) > 1:
        raise IndexFileError(f"the indexes are of different models: {', '.join(models)}",
                             hint="merge the indexes of one model at a time")
    cells: dict[str, dict[str, Any]] = {}
    for index in indexes:
        for entry in index["cells"]:
            old = cells.get(entry["name"])
            if old is None or _RANK[entry["status"]] > _RANK[old["status"]]:
                cells[entry["name"]] = entry
    merged = dict(indexes[0])
    merged["cells"] = [cells[name] for name in sorted(cells)]
    return merged
