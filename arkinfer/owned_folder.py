"""Which entries of a folder ArkInfer wrote: the test `--force` applies before anything is
replaced, and the listing `verify` compares with a manifest.

Every folder ArkInfer writes for a user carries a record of what it wrote — an artifact's
`arkinfer.json`, a quantised folder's `quant_summary.json`, an import's `arkinfer_import.json` —
whose `files` map gives every file (a POSIX path relative to the folder) with its sha256. A folder
is ArkInfer's to replace only when it holds those files, each unchanged, and nothing else:

    hashes = {"model.gguf": "9f2c…", "arkinfer.json": None}   # None: the record itself
    foreign_entries(folder, hashes)
    # [] or ["MY_NOTES.txt (not written by ArkInfer)", "mydata/ (a folder ArkInfer did not write)",
    #        "model.gguf (changed since ArkInfer wrote it)", "rootlink (a symlink)"]

A path ending in "/" in `hashes` admits a whole subtree unchecked (a matrix folder's cell
artifacts, each governed by its own manifest when it is rebuilt). Folders are listed without ever
following a symlink (`walk`), so a `link -> /` inside a folder is one entry, not the whole disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

# How many foreign entries an error names before "and N more".
SHOWN = 5


@dataclass(frozen=True)
class Entry:
    """One entry under a folder: `rel` its POSIX path relative to the folder, `kind` one of
    "file", "folder", "symlink", "FIFO", "socket", "device", "special file"."""

    rel: str
    kind: str


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def walk(folder: Path) -> list[Entry]:
    """Every entry under `folder`, sorted, parents before children; symlinks are listed as
    entries of their own and never followed."""
    entries: list[Entry] = []

    def visit(path: str, prefix: str) -> None:
        with os.scandir(path) as it:
            for e in sorted(it, key=lambda e: e.name):
                entry = Entry(prefix + e.name, _kind(e.stat(follow_symlinks=False).st_mode))
                entries.append(entry)
                if entry.kind == "folder":
                    visit(e.path, entry.rel + "/")

    visit(os.fspath(folder), "")
    return entries


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "folder"), (stat.S_ISLNK, "symlink"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "device"),
                       (stat.S_ISBLK, "device")):
        if test(mode):
            return kind
    return "special file"


def unlisted_entries(entries: list[Entry], listed: Mapping[str, object]) -> list[Entry]:
    """The entries that are neither a listed regular file, a folder on the way to one, nor inside
    a listed subtree ("NAME/")."""
    subtrees = tuple(rel for rel in listed if rel.endswith("/"))
    on_the_way = {"/".join(rel.rstrip("/").split("/")[:i]) for rel in listed
                  for i in range(1, rel.rstrip("/").count("/") + 1)}
    on_the_way |= {rel.rstrip("/") for rel in subtrees}
    out = []
    for e in entries:
        if e.rel.startswith(subtrees):
            continue
        if e.kind == "folder" and e.rel in on_the_way:
            continue
        if e.kind == "file" and e.rel in listed:
            continue
        out.append(e)
    return out


def describe(entry: Entry) -> str:
    """'NAME (not written by ArkInfer)' for a file, 'NAME/ (a folder ...)', 'NAME (a symlink)'."""
    if entry.kind == "file":
        return f"{entry.rel} (not written by ArkInfer)"
    if entry.kind == "folder":
        return f"{entry.rel}/ (a folder ArkInfer did not write)"
    return f"{entry.rel} (a {entry.kind})"


def foreign_entries(folder: Path, hashes: Mapping[str, str | None]) -> list[str]:
    """Every entry of `folder` that keeps ArkInfer from replacing it: unlisted entries of any
    kind, and listed files whose sha256 differs from `hashes` (None: no hash to compare).
    Listed files that are missing are not foreign: there is nothing of the user's to lose."""
    entries = walk(folder)
    problems = [describe(e) for e in unlisted_entries(entries, hashes)]
    for e in entries:
        expected = hashes.get(e.rel)
        if e.kind == "file" and expected is not None and sha256_file(folder / e.rel) != expected:
            problems.append(f"{e.rel} (changed since ArkInfer wrote it)")
    return problems


def summarise(problems: list[str]) -> str:
    """The first SHOWN problems joined, then 'and N more'."""
    shown = ", ".join(problems[:SHOWN])
    return shown + (f" and {len(problems) - SHOWN} more" if len(problems) > SHOWN else "")


def file_hashes(folder: Path, skip: tuple[str, ...] = (),
                progress: Callable[[str], None] | None = None) -> dict[str, str]:
    """{relative path: sha256} of every regular file under `folder` except the names in `skip`
    (the record itself); what a writer puts in its record's `files`. `progress("hash REL")`
    before each file."""
    out = {}
    for e in walk(folder):
        if e.kind == "file" and e.rel not in skip:
            if progress is not None:
                progress(f"hash {e.rel}")
            out[e.rel] = sha256_file(folder / e.rel)
    return out


def record_files(record: Path) -> dict[str, str | None] | None:
    """The `files` table ({relative path: sha256}) of the JSON record file `record`, plus the
    record itself (None: nothing to compare); None when the file is missing, unreadable, or
    has no such table (another kind of folder, or one written before records listed files)."""
    try:
        data = json.loads(Path(record).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in files.items()):
        return None
    return {**files, Path(record).name: None}
