"""Output helpers: every command prints data either for humans (rich) or as JSON.

Both consoles print text literally (`markup=False`): paths, prompts and tensor names may hold `[`
and `]`, which rich would otherwise read as markup (`-o 'out[/x]'` raised MarkupError, `[x]`
vanished). A line that wants colour passes `markup=True` and escapes everything it interpolates;
a status spinner gets a `rich.text.Text` (a spinner parses a plain string as markup).
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console(highlight=False, soft_wrap=True, markup=False)
err_console = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def print_json(data: Any) -> None:
    """Machine-readable output on stdout (nothing else is printed there in --json mode)."""
    print(json.dumps(data, indent=2, sort_keys=False, default=str))


def print_table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    """A table on a terminal; plain tab-separated lines, never truncated, when stdout is a pipe
    or a file (`arkinfer targets | grep ID` finds whole ids)."""
    if not console.is_terminal:
        if title:
            print(f"# {title}")
        for line in [columns, *rows]:
            print("\t".join(str(x) for x in line))
        return
    table = Table(title=title, show_header=True, header_style="bold")
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*[str(x) for x in row])
    console.print(table)


def print_kv(title: str, items: list[tuple[str, Any]]) -> None:
    """A two-column key/value block (plain `key: value` lines when stdout is not a terminal)."""
    if not console.is_terminal:
        print(title)
        for key, value in items:
            print(f"  {key}: {value}")
        return
    table = Table(title=title, show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in items:
        table.add_row(key, str(value))
    console.print(table)


def progress_bar(label: str, field: str):
    """A transient stderr progress bar: `label`, bar, done/total, elapsed, then the task's `field`
    (pass it to add_task/update as a keyword, e.g. name=... or info=...)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(TextColumn(f"[bold]{escape(label)}[/]"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("{task.fields[" + field + "]}", markup=False),
                    console=err_console, transient=True)
