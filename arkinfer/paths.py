"""Reading files of a model folder or artifact safely.

A path written inside a model folder or artifact (an index's `weight_map`, a manifest's file list)
is data, not a location the author may choose: it must be relative, without `..`, and must not
leave the folder through a symlink. `resolve_inside` is the one check; every reader of such a path
calls it. Only regular files are opened (`require_regular_file`): a FIFO named config.json would
block forever. `read_json_object` reads a JSON object file with both rules applied.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from arkinfer.errors import ArkError


def resolve_inside(folder: Path, relative: str, what: str) -> Path:
    """Return `folder / relative` resolved (symlinks followed), or raise ArkError.

    `what` names where the path came from (e.g. "weight_map entry 'lm_head.weight' of
    model.safetensors.index.json"). Refused: a non-string or empty value, an absolute path (POSIX
    or Windows), a `..` component, a NUL byte, and a path whose resolved target is outside the
    resolved `folder` (a symlink escaping it).
    """
    root = Path(folder).resolve()
    hint = f"paths listed in {what} must be relative file names inside {root}; fix or re-create the file"
    if not isinstance(relative, str) or not relative or "\0" in relative:
        raise ArkError(f"{what}: path {relative!r} is not a file name inside {root}", hint=hint)
    posix, windows = PurePosixPath(relative), PureWindowsPath(relative)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or relative.startswith(("/", "\\")):
        raise ArkError(f"{what}: path {relative!r} is absolute; only paths inside {root} are allowed",
                       hint=hint)
    if ".." in posix.parts or ".." in windows.parts:
        raise ArkError(f"{what}: path {relative!r} contains '..'; only paths inside {root} are allowed",
                       hint=hint)
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise ArkError(f"{what}: path {relative!r} resolves to {target}, outside {root} "
                       "(a symlink leaves the folder)", hint=hint)
    return target


def require_regular_file(path: Path, what: str, error: type[ArkError] = ArkError) -> Path:
    """Return `path` if it is a regular file (symlinks followed), else raise `error`.

    Opening a FIFO blocks forever and a directory raises IsADirectoryError; both are refused here,
    before any open, with a message naming `what`, the path and what it is instead.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise error(f"{what} not found: {path}", hint="check the path; the file must exist") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be read: {exc.strerror or exc}",
                    hint="check the file's permissions") from None
    if not stat.S_ISREG(mode):
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode)
                or stat.S_ISBLK(mode) else "not a regular file")
        raise error(f"{what} {path} is {kind}, not a regular file",
                    hint="replace it with the real file (ArkInfer opens only regular files)")
    return Path(path)


def read_json_object(path: Path, error: type[ArkError] = ArkError) -> dict[str, Any]:
    """The JSON object in file `path`; `error` (naming the file) for anything else.

    Only a regular file is opened; invalid UTF-8 or JSON, nesting too deep for Python's parser
    and a top level that is not an object are each one `error`."""
    require_regular_file(path, path.name, error)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        reason = "it is nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise error(f"{path} is not valid JSON: {reason}",
                    hint="fix the file or download it again") from None
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}",
                    hint="check the file's permissions") from None
    if not isinstance(data, dict):
        raise error(f"{path} must hold a JSON object, found {type(data).__name__}",
                    hint="fix the file or download it again")
    return data
