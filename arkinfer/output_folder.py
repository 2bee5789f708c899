"""Folders ArkInfer writes for a user (`build -o`, `quantize -o`, `import OUT_DIR`): what may be
replaced, and replacing without ever losing a file.

The rules, the same for every command:

* An output path that does not exist, or an empty folder, is always fine.
* A non-empty folder is replaced only with `--force`, and only when it is ArkInfer's own kind of
  output (`is_ours`: an artifact with a valid `arkinfer.json`, a quantised folder with its
  `quant_summary.json`, an imported GGUF folder). Anything else — a folder of documents — is
  refused even with `--force`.
* Never the current folder, one of its parents, the file system root, a protected input (the
  source model) or a folder containing one.

New output is assembled in a hidden sibling `.NAME.<stage>-PID[-…]` and swapped in by
`replace_folder`: an atomic exchange of the two folders where the OS has one (Linux
`renameat2(RENAME_EXCHANGE)`), else rename-old-aside, rename-new-in, delete-old. Either way the
complete old or the complete new folder is always present at the path (or, for the few
microseconds between two renames on other systems, in `.NAME.old-PID`, from where
`remove_leftovers` puts it back). `remove_leftovers` cleans what a `kill -9` left behind.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from arkinfer.errors import ArkError

# Stages of the hidden sibling folders: build staging, calibration work, quantised export,
# GGUF import, and a replaced folder set aside.
LEFTOVER_STAGES = ("building", "work", "exporting", "importing", "old")


class OutputError(ArkError):
    """The output path cannot be written or replaced (names the path and the reason)."""


def check_output(out: Path, *, force: bool, what: str, is_ours: Callable[[Path], bool],
                 protected: Iterable[tuple[Path, str]] = ()) -> None:
    """Raise OutputError unless `out` may be written (see the module docstring).

    what: the kind of output for messages, e.g. "ArkInfer artifact (a folder with arkinfer.json)".
    is_ours(folder): True when a non-empty existing folder is that kind of output.
    protected: (path, description) pairs that `out` must neither be nor contain.
    """
    real = Path(out).expanduser().resolve()
    cwd = Path.cwd().resolve()
    refusals = [(cwd, "the current folder")]
    refusals += [(Path(p).expanduser().resolve(), desc) for p, desc in protected]
    for inside, desc in refusals:
        if real == inside or real in inside.parents:
            name = "is" if real == inside else "contains"
            raise OutputError(f"output {out} {name} {desc} ({inside}); writing there would "
                              "delete it", hint="choose a new, separate output folder with -o")
    if real.parent == real:
        raise OutputError(f"output {out} is the file system root",
                          hint="choose a new, separate output folder with -o")
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise OutputError(f"output {out} exists and is not a folder",
                          hint="choose another -o path, or move that file away yourself")
    if not any(out.iterdir()):
        return
    if not is_ours(out):
        raise OutputError(f"output folder {out} is not empty and is not an {what}; ArkInfer "
                          "replaces only its own output, even with --force",
                          hint="choose another -o folder, or empty or remove that one yourself")
    if not force:
        raise OutputError(f"output {out} already exists",
                          hint="pass --force to replace it, or choose another -o folder")


def staging_path(out: Path, stage: str, suffix: str = "") -> Path:
    """The hidden sibling `.NAME.STAGE-PID[SUFFIX]` that `remove_leftovers` recognises."""
    assert stage in LEFTOVER_STAGES, stage
    return out.parent / f".{out.name}.{stage}-{os.getpid()}{suffix}"


def replace_folder(new: Path, out: Path) -> None:
    """Move the complete folder `new` to `out`, replacing `out` if it exists, never leaving `out`
    half-written: exchange atomically where possible, else set the old one aside first."""
    if not out.exists():
        os.replace(new, out)
        return
    if _exchange(new, out):  # `new` now holds the old content
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

    A set-aside old folder (`.NAME.old-PID`) is put back when `out` is missing (the process was
    killed between its two renames); every other leftover is deleted."""
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.({'|'.join(LEFTOVER_STAGES)})-(\d+)(-.*)?$")
    touched: list[Path] = []
    if not out.parent.is_dir():
        return touched
    for p in sorted(out.parent.iterdir()):
        m = pattern.match(p.name)
        if not m or _alive(int(m.group(2))):
            continue
        if m.group(1) == "old" and not out.exists():
            os.replace(p, out)
        else:
            shutil.rmtree(p, ignore_errors=True)
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
