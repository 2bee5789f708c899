"""One error formatter for every command: a known error becomes a message and a hint.

    error: <what is wrong, naming the object and the bad value>
    hint: <the next step>

`ArkError`s carry both; an `OSError` from the filesystem (read-only folder, disk full, name too
long, ...) names the path and the system's reason, and so does a library's own I/O error that
carries the system's error number (safetensors: "No space left on device (os error 28)"); running
out of memory, and text or a path that is not UTF-8 where UTF-8 is needed, are ordinary errors
too. A usage error (unknown option, missing argument, bad value) names the problem and the usage
line (exit code 2, as click uses). Only an unexpected exception type is reported as a bug. A
traceback is printed only with `ARKINFER_DEBUG=1`.
"""

from __future__ import annotations

import errno
import functools
import os
import re
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from arkinfer.errors import ArkError

F = TypeVar("F", bound=Callable[..., Any])

_stderr = Console(stderr=True, highlight=False, soft_wrap=True)

# The next step for the filesystem errors a user causes and can fix (errno -> hint).
_OS_HINTS = {
    errno.EROFS: "the folder is on a read-only file system; choose a writable folder (e.g. -o)",
    errno.EACCES: "you may not write or read there; choose a folder you own (e.g. -o) or fix "
                  "its permissions",
    errno.EPERM: "the operation is not permitted there; choose a folder you own (e.g. -o)",
    errno.ENOSPC: "the disk is full; free space or write to another disk (e.g. -o, or "
                  "ARKINFER_CACHE for the cache)",
    errno.EDQUOT: "your disk quota is used up; free space or write to another disk (e.g. -o)",
    errno.ENAMETOOLONG: "use a shorter file or folder name",
    errno.ENOENT: "check the path: a folder on the way does not exist",
    errno.ENOTDIR: "check the path: part of it is a file, not a folder",
    errno.EISDIR: "the path is a folder where a file is needed; check the path",
    errno.EEXIST: "something already exists at that path; choose another path",
    errno.EMFILE: "too many open files; raise the limit (`ulimit -n`) and rerun",
}


def debug_enabled() -> bool:
    return os.environ.get("ARKINFER_DEBUG", "") not in ("", "0", "false")


def _safe_lines(text: str) -> str:
    """`text` printed `terminal_safe` (messages quote file names and values read from files).
    A message's own continuation lines are indented ("\\n  " + item); every other newline, like
    every control character, is shown as an escape, so no text in a message can start a line
    that looks like another `error:` or `hint:`."""
    from arkinfer.cli._output import terminal_safe

    return "\n  ".join(terminal_safe(line) for line in text.split("\n  "))


def print_error(message: str, hint: str | None) -> None:
    """The two-line `error:` / `hint:` format on stderr (text printed literally, control
    characters shown as escapes)."""
    _stderr.print(f"[bold red]error:[/] {escape(_safe_lines(message))}", markup=True)
    if hint:
        _stderr.print(f"[yellow]hint:[/] {escape(_safe_lines(hint))}", markup=True)


_DISK_HINT = ("check free disk space (`df -h`) and the path; rerun with ARKINFER_DEBUG=1 for "
              "the traceback")
# A library's I/O error that carries the system's error number in its text: Rust's io::Error
# (safetensors, tokenizers) ends "(os error 28)"; numpy's short write says "N requested and M
# written" (a full disk, with no errno).
_OS_ERROR_IN_TEXT = re.compile(r"\(os error (\d+)\)")
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def os_error_message(exc: OSError) -> tuple[str, str]:
    """(message, hint) for an OSError: the path(s) it names, the system's reason, what to do."""
    reason = exc.strerror or str(exc)
    code = errno.errorcode.get(exc.errno, "") if exc.errno is not None else ""
    paths = " -> ".join(os.fsdecode(p) for p in (exc.filename, exc.filename2) if p is not None)
    where = f"{paths}: " if paths else ""
    message = f"{where}{reason}" + (f" ({code})" if code else "")
    if exc.errno is None and _SHORT_WRITE.search(reason):
        message += " (a write stopped short: the disk is probably full)"
        return message, _OS_HINTS[errno.ENOSPC]
    return message, _OS_HINTS.get(exc.errno, _DISK_HINT)


def unicode_error_message(exc: UnicodeError) -> tuple[str, str]:
    """(message, hint) for text or a path that is not UTF-8 where UTF-8 is needed, naming it."""
    obj, start, end = (getattr(exc, k, None) for k in ("object", "start", "end"))
    if isinstance(obj, (bytes, bytearray)) and isinstance(start, int):
        message = (f"text is not valid {getattr(exc, 'encoding', 'UTF-8')}: bytes "
                   f"{bytes(obj[start:end])!r} at offset {start} ({exc.reason})")
    elif isinstance(obj, str) and isinstance(start, int):
        shown = obj if len(obj) <= 200 else obj[:200] + "..."
        message = (f"'{shown}' holds bytes that are not UTF-8 ({obj[start:end]} at position "
                   f"{start}); this step needs UTF-8")
    else:
        message = f"text is not valid UTF-8: {exc}"
    return message, ("rename the file or folder to a UTF-8 name, or save the text as UTF-8 "
                     "(e.g. `iconv -t UTF-8`)")


def error_message(exc: BaseException) -> tuple[str, str]:
    """(message, hint) for any exception: ordinary conditions get their own, the rest is a bug."""
    if isinstance(exc, ArkError):
        return exc.message, exc.hint or ""
    if isinstance(exc, OSError) and (exc.errno is not None or _SHORT_WRITE.search(str(exc))):
        return os_error_message(exc)
    if isinstance(exc, MemoryError):
        detail = f" ({exc})" if str(exc) else ""
        return (f"not enough memory to finish{detail}",
                "free memory (close other programs) or ask for less: a smaller model or quant, "
                "fewer tokens (-p, -n, --ctx), fewer --samples or a shorter --seq-len")
    if isinstance(exc, UnicodeError):
        return unicode_error_message(exc)
    if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):  # a process limit
        return ("the system refused to start another thread (can't start new thread)",
                f"use fewer threads (e.g. --threads {os.cpu_count() or 1}, this machine's CPUs) or "
                "raise the limit (`ulimit -u`)")
    found = _OS_ERROR_IN_TEXT.search(str(exc))
    if found and int(found.group(1)) in errno.errorcode:
        code = int(found.group(1))
        return (f"{exc} ({errno.errorcode[code]})", _OS_HINTS.get(code, _DISK_HINT))
    return (f"{type(exc).__name__}: {exc}", "this is a bug in ArkInfer; rerun with "
            "ARKINFER_DEBUG=1 for the traceback and report it")


def report(exc: BaseException) -> None:
    """Print `exc` for a user: `error: <message>` and `hint: <next step>`."""
    print_error(*error_message(exc))  # print_error shows undecodable bytes as `\xff`


def report_usage_error(message: str, usage: str | None, command_path: str) -> None:
    """A usage error (unknown option, missing argument, bad value) in the same format."""
    see = f"see `{command_path} --help`"
    print_error(message, f"{usage.strip()}; {see}" if usage else see)


def handle_errors(fn: F) -> F:
    """Decorator for command functions: known errors exit with code 1 and no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except BrokenPipeError:  # `arkinfer ... | head` closed the pipe: not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            raise typer.Exit(code=0) from None
        except Exception as exc:  # noqa: BLE001 - the CLI owns the terminal
            if debug_enabled():
                raise
            report(exc)
            raise typer.Exit(code=1) from None

    return wrapper  # type: ignore[return-value]
