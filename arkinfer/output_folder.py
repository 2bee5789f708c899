"""Folders ArkInfer writes for a user (`build -o`, `quantize -o`, `import OUT_DIR`, matrix
folders): what may be replaced, and replacing without ever losing a file.

The rules, the same for every command:

* An output path that does not exist, or an empty folder, is always fine.
* A non-empty folder is replaced only with `--force`, and only when ArkInfer wrote every entry in
  it: the folder's record (`record(folder)`: an artifact's arkinfer.json, a quantised folder's
  quant_summary.json, an import's arkinfer_import.json) lists every file with its sha256, and the
  folder holds nothing else (`owned_folder.foreign_entries`). Anything unlisted or changed is
  named and refused, even with `--force`.
* Never the current folder, one of its parents, the file system root, a mount point, a protected
  input (the source model), a folder containing one, or a folder inside another ArkInfer output.

New output is assembled in a hidden sibling `.NAME.<stage>-PID[-xxxxxxxx]` (`make_staging`), which
holds the marker file `.arkinfer-staging` while it is being written, and is swapped in by
`replace_folder`: an atomic exchange of the two folders where the OS has one (Linux
`renameat2(RENAME_EXCHANGE)`), else rename-old-aside, rename-new-in, delete-old. Either way the
complete old or the complete new folder is always present at the path (or, for the few
microseconds between two renames on other systems, in `.NAME.old-PID`, from where
`remove_leftovers` puts it back). `remove_leftovers` cleans what a `kill -9` left behind: only
folders with exactly those names, of a process that is gone, holding ArkInfer's marker (or
nothing at all) — never a folder by its name alone.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from arkinfer.errors import ArkError
from arkinfer.owned_folder import foreign_entries, summarise

# Stages of the hidden sibling folders: build staging, calibration work, quantised export,
# GGUF import, and a replaced folder set aside.
LEFTOVER_STAGES = ("building", "work", "exporting", "importing", "old")
# Written into every staging and work folder while ArkInfer owns it; `remove_leftovers` deletes
# nothing without it. Removed from a staging folder just before the folder is swapped in.
MARKER = ".arkinfer-staging"
# The record files that make a folder an ArkInfer output (owners: pipeline/manifest.py,
# quant/export.py, frontend/gguf_import.py); no output is written inside a folder holding one.
RECORD_NAMES = ("arkinfer.json", "quant_summary.json", "arkinfer_import.json")

# {relative path: sha256 or None} of an output folder's own files, from its record; None when
# the folder has no valid record of that kind.
Record = Callable[[Path], Mapping[str, str | None] | None]
_NEW_FOLDER = "choose a new, separate output folder with -o"


class OutputError(ArkError):
    """The output path cannot be written or replaced (names the path and the reason)."""


def check_output(out: Path, *, force: bool, what: str, record: Record,
                 protected: Iterable[tuple[Path, str]] = ()) -> None:
    """Raise OutputError unless `out` may be written (see the module docstring).

    what: the kind of output for messages, e.g. "ArkInfer artifact (a folder with arkinfer.json)".
    record(folder): the files that kind of output lists for itself, or None (not that kind).
    protected: (path, description) pairs that `out` must neither be nor contain.
    """
    out = Path(out)
    real = out.expanduser().resolve()
    cwd = Path.cwd().resolve()
    refusals = [(cwd, "the current folder")]
    refusals += [(Path(p).expanduser().resolve(), desc) for p, desc in protected]
    for inside, desc in refusals:
        if real == inside or real in inside.parents:
            name = "is" if real == inside else "contains"
            raise OutputError(f"output {out} {name} {desc} ({inside}); writing there would "
                              "delete it", hint=_NEW_FOLDER)
    if real.parent == real:
        raise OutputError(f"output {out} is the file system root", hint=_NEW_FOLDER)
    for parent in real.parents:
        held = [name for name in RECORD_NAMES if (parent / name).is_file()]
        if held:
            raise OutputError(f"output {out} is inside {parent}, an ArkInfer output (it holds "
                              f"{held[0]}); writing there would break that output's file list",
                              hint="choose an -o folder outside it")
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise OutputError(f"output {out} exists and is not a folder",
                          hint="choose another -o path, or move that file away yourself")
    if os.path.ismount(real):
        raise OutputError(f"output {out} is a mount point; ArkInfer replaces an output by renaming "
                          "a finished folder onto it, which a mount point cannot take",
                          hint="choose a folder inside it, e.g. -o " + str(out / "artifact"))
    if not any(out.iterdir()):
        return
    files = record(out)
    if files is None:
        raise OutputError(f"output folder {out} is not empty and is not an {what}; ArkInfer "
                          "replaces only its own output, even with --force",
                          hint="choose another -o folder, or empty or remove that one yourself")
    foreign = foreign_entries(out, files)
    if foreign:
        raise OutputError(f"output folder {out} holds entries ArkInfer did not write: "
                          f"{summarise(foreign)}; --force replaces only a folder that holds "
                          "nothing but the files its record lists, unchanged",
                          hint="move those entries out of it yourself, or choose another -o folder")
    if not force:
        raise OutputError(f"output {out} already exists",
                          hint="pass --force to replace it, or choose another -o folder")


def child_folder(root: Path, name: object, what: str) -> Path:
    """`root / name` for a `name` read from a file (a matrix index's model): one plain folder
    name, never a path. OutputError naming `what` and the value otherwise."""
    ok = (isinstance(name, str) and 0 < len(name) <= 255 and name not in (".", "..")
          and not any(c in name for c in "/\\\0") and name.isprintable())
    if not ok:
        raise OutputError(f"{what} {name!r} is not a plain folder name; ArkInfer writes only inside "
                          f"{root}", hint="fix that value in the file (a name like 'MiniCPM4.1-8B', "
                          "no '/', '..' or control characters)")
    return Path(root) / name


def staging_path(out: Path, stage: str, suffix: str = "") -> Path:
    """The hidden sibling `.NAME.STAGE-PID[SUFFIX]` that `remove_leftovers` recognises
    (SUFFIX: empty or '-' and 8 hex digits)."""
    assert stage in LEFTOVER_STAGES, stage
    assert suffix == "" or re.fullmatch(r"-[0-9a-f]{8}", suffix), suffix
    return out.parent / f".{out.name}.{stage}-{os.getpid()}{suffix}"


def make_staging(out: Path, stage: str, suffix: str = "") -> Path:
    """Create the hidden sibling for `stage` (see staging_path), with ArkInfer's marker in it."""
    return fresh_work_folder(staging_path(out, stage, suffix))


def fresh_work_folder(folder: Path) -> Path:
    """Create `folder` empty with ArkInfer's marker in it (parents too). An existing one is
    emptied only when ArkInfer made it (it holds the marker) or it is empty; a folder of the
    user's (`quantize --work-dir ~/Documents`) is refused, never deleted."""
    folder = Path(folder)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise OutputError(f"work folder {folder} exists and is not a folder",
                          hint="choose another --work-dir, or move that file away yourself")
    if folder.is_dir():
        if any(folder.iterdir()) and not _marked(folder):
            raise OutputError(f"work folder {folder} holds files ArkInfer did not write (it has "
                              f"no {MARKER}); ArkInfer empties only its own work folders",
                              hint="choose another --work-dir, or empty that folder yourself")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / MARKER).write_text(json.dumps({"pid": os.getpid()}) + "\n", encoding="utf-8")
    return folder


def remove_work_folder(folder: Path) -> None:
    """Delete a work folder ArkInfer made (it holds the marker); anything else stays."""
    if Path(folder).is_dir() and not Path(folder).is_symlink() and _marked(folder):
        shutil.rmtree(folder, ignore_errors=True)


def _marked(folder: Path) -> bool:
    marker = Path(folder) / MARKER
    return marker.is_file() and not marker.is_symlink()


def replace_folder(new: Path, out: Path) -> None:
    """Move the complete folder `new` to `out`, replacing `out` if it exists, never leaving `out`
    half-written: exchange atomically where possible, else set the old one aside first. The
    marker leaves `new` first: the folder that lands at `out` holds only the output."""
    (new / MARKER).unlink(missing_ok=True)
    if not out.exists():
        os.replace(new, out)
        return
    if _exchange(new, out):  # `new` now holds the old content, checked by the caller as ours
        shutil.rmtree(new, ignore_errors=True)
        return
    old = staging_path(out, "old")
    os.replace(out, old)
    try:
        os.replace(new, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def remove_leftovers(out: Path) -> list[Path]:
    """Clean the hidden siblings of `out` whose process is gone; returns what was touched.

    Only folders named exactly as `staging_path` names them are looked at. A set-aside old
    folder (`.NAME.old-PID`) is put back when `out` is missing (the process was killed between
    its two renames); any other is deleted only when it holds ArkInfer's marker or nothing."""
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.({'|'.join(LEFTOVER_STAGES)})-(\d+)"
                         r"(-[0-9a-f]{8})?$")
    touched: list[Path] = []
    if not out.parent.is_dir():
        return touched
    for p in sorted(out.parent.iterdir()):
        m = pattern.match(p.name)
        if not m or p.is_symlink() or not p.is_dir() or _alive(int(m.group(2))):
            continue
        if m.group(1) == "old" and not out.exists():
            os.replace(p, out)
        elif _marked(p) or not any(p.iterdir()):
            shutil.rmtree(p, ignore_errors=True)
        else:
            continue
        touched.append(p)
    return touched


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with Linux's renameat2(RENAME_EXCHANGE); False where the C
    library or the file system does not support it (the caller falls back to two renames)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))
