"""One error formatter for every command: a known error becomes a message and a hint.

A traceback is printed only with `ARKINFER_DEBUG=1`.
"""

from __future__ import annotations

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


def debug_enabled() -> bool:
    return os.environ.get("ARKINFER_DEBUG", "") not in ("", "0", "false")


def report(exc: BaseException) -> None:
    """Print `exc` for a user: `error: <message>` and `hint: <next step>`."""
    if isinstance(exc, ArkError):
        _stderr.print(f"[bold red]error:[/] {escape(exc.message)}", markup=True)
        if exc.hint:
            _stderr.print(f"[yellow]hint:[/] {escape(exc.hint)}", markup=True)
    else:
        _stderr.print(f"[bold red]error:[/] {type(exc).__name__}: {escape(str(exc))}", markup=True)
        _stderr.print("[yellow]hint:[/] this is a bug in ArkInfer; rerun with ARKINFER_DEBUG=1 "
                      "for the traceback and report it", markup=True)


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
