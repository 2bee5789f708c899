"""One error formatter for every command: a known error becomes a message and a hint.

    error: <what is wrong, naming the object and the bad value>
    hint: <the next step>

`ArkError`s carry both; an `OSError` from the filesystem (read-only folder, disk full, name too
long, ...) names the path and the system's reason; a usage error (unknown option, missing
argument, bad value) names the problem and the usage line (exit code 2, as click uses). Only an
unexpected exception type is reported as a bug. A traceback is printed only with `ARKINFER_DEBUG=1`.
"""

from __future__ import annotations

import errno
import functools
import os
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


def print_error(message: str, hint: str | None) -> None:
    """The two-line `error:` / `hint:` format on stderr (text printed literally)."""
    _stderr.print(f"[bold red]error:[/] {escape(message)}", markup=True)
    if hint:
        _stderr.print(f"[yellow]hint:[/] {escape(hint)}", markup=True)


def os_error_message(exc: OSError) -> tuple[str, str]:
    """(message, hint) for an OSError: the path(s) it names, the system's reason, what to do."""
    reason = exc.strerror or str(exc)
    code = errno.errorcode.get(exc.errno, "") if exc.errno is not None else ""
    paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
    where = f"{paths}: " if paths else ""
    message = f"{where}{reason}" + (f" ({code})" if code else "")
    hint = _OS_HINTS.get(exc.errno, "check the path and the disk; rerun with ARKINFER_DEBUG=1 for "
                                    "the traceback")
    return message, hint


def report(exc: BaseException) -> None:
    """Print `exc` for a user: `error: <message>` and `hint: <next step>`."""
    if isinstance(exc, ArkError):
        print_error(exc.message, exc.hint)
    elif isinstance(exc, OSError) and exc.errno is not None:
        print_error(*os_error_message(exc))
    else:
        print_error(f"{type(exc).__name__}: {exc}", "this is a bug in ArkInfer; rerun with "
                    "ARKINFER_DEBUG=1 for the traceback and report it")


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
