"""Reading files of a model folder or artifact safely.

A path written inside a model folder or artifact (an index's `weight_map`, a manifest's file list)
is data, not a location the author may choose: it must be relative, without `..`, and must not
leave the folder through a symlink. `resolve_inside` is the one check; every reader of such a path
calls it. Only regular files are opened (`require_regular_file`): a FIFO named config.json would
block forever. `read_limited` is the one way to read a small input file whole (a target profile,
a config, a chat template, a calibration file): regular files only, size bounded before and while
reading. `read_json_object` reads a JSON object file with these rules applied.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, BinaryIO

from arkinfer.errors import ArkError

#: Upper bound for a small JSON input (config.json, generation_config.json, tokenizer_config.json
#: with an embedded chat template): the largest seen on the Hub are well under 1 MiB.
JSON_MAX_BYTES = 16 << 20


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


def _kind(mode: int) -> str:
    """What a non-regular file is, in words, for error messages."""
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "not a regular file")


def _regular_mode(path: Path, what: str, error: type[ArkError]) -> os.stat_result:
    """`os.stat(path)` when it is a regular file (symlinks followed), else raise `error`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"cannot read {what} {path}: it does not exist",
                    hint="check the path; the file must exist") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise error(f"{what} {path} cannot be read: {getattr(exc, 'strerror', None) or exc}",
                    hint="check the path and the file's permissions") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {path} is {_kind(st.st_mode)}, not a regular file",
                    hint="replace it with the real file (ArkInfer opens only regular files)")
    return st


def require_regular_file(path: Path, what: str, error: type[ArkError] = ArkError) -> Path:
    """Return `path` if it is a regular file (symlinks followed), else raise `error`.

    Opening a FIFO blocks forever and a directory raises IsADirectoryError; both are refused here,
    before any open, with a message naming `what`, the path and what it is instead.
    """
    _regular_mode(path, what, error)
    return Path(path)


def _size_error(path: Path, what: str, size: str, max_bytes: int, error: type[ArkError],
                hint: str | None) -> ArkError:
    return error(f"{what} {path} is {size} bytes; the limit is {max_bytes:,} bytes",
                 hint=hint or f"a {what} is a small file: check that this is the right file")


def open_regular(path: Path, what: str, error: type[ArkError] = ArkError) -> BinaryIO:
    """`path` opened for binary reading (unbuffered), refused like `require_regular_file` before
    the open. The open is non-blocking (a FIFO swapped in after the stat cannot block it) and the
    open descriptor is checked again, so what is read is the regular file that was checked."""
    _regular_mode(path, what, error)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"{what} {path} cannot be read: {exc.strerror or exc}",
                    hint="check the file's permissions") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(f"{what} {path} is {_kind(mode)}, not a regular file",
                    hint="replace it with the real file (ArkInfer opens only regular files)")
    return os.fdopen(fd, "rb", buffering=0)


def read_limited(path: Path, what: str, max_bytes: int, error: type[ArkError] = ArkError,
                 hint: str | None = None) -> bytes:
    """The whole content of regular file `path`, at most `max_bytes` long, else raise `error`.

    `what` names the file's role ("target profile", "--calib file"). Refused before any byte is
    read: a missing path, a directory, FIFO, socket or device (/dev/zero never ends, a FIFO blocks
    the open) and a file whose stat size is over `max_bytes`. Opened with `open_regular`, and at
    most `max_bytes + 1` bytes are read, so a file that grows meanwhile is refused, not read whole.
    `hint` replaces the default hint of the too-large error.
    """
    size = _regular_mode(path, what, error).st_size
    if size > max_bytes:
        raise _size_error(path, what, f"{size:,}", max_bytes, error, hint)
    with open_regular(path, what, error) as fh:
        chunks, left = [], max_bytes + 1
        try:
            while left > 0 and (chunk := fh.read(min(left, 1 << 20))):
                chunks.append(chunk)
                left -= len(chunk)
        except OSError as exc:
            raise error(f"{what} {path} cannot be read: {exc.strerror or exc}",
                        hint="check the file and the disk") from None
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise _size_error(path, what, f"more than {max_bytes:,}", max_bytes, error, hint)
    return data


def decode_text(raw: bytes, path: Path, what: str, error: type[ArkError] = ArkError) -> str:
    """`raw` (the bytes of file `path`) as UTF-8 text with universal newlines, as
    `Path.read_text` gives it; invalid UTF-8 is one `error` naming the file and the byte."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text (byte {exc.start}: {exc.reason})",
                    hint="convert it to UTF-8") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_limited_text(path: Path, what: str, max_bytes: int,
                      error: type[ArkError] = ArkError) -> str:
    """`read_limited` then `decode_text`: a small UTF-8 text file, bounded before it is read."""
    return decode_text(read_limited(path, what, max_bytes, error), path, what, error)


def read_json_object(path: Path, error: type[ArkError] = ArkError,
                     max_bytes: int = JSON_MAX_BYTES) -> dict[str, Any]:
    """The JSON object in file `path`; `error` (naming the file) for anything else.

    Read with `read_limited` (a regular file of at most `max_bytes`); invalid UTF-8 or JSON,
    nesting too deep for Python's parser and a top level that is not an object are each one
    `error`."""
    raw = read_limited(path, path.name, max_bytes, error)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        reason = "it is nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise error(f"{path} is not valid JSON: {reason}",
                    hint="fix the file or download it again") from None
    if not isinstance(data, dict):
        raise error(f"{path} must hold a JSON object, found {type(data).__name__}",
                    hint="fix the file or download it again")
    return data
