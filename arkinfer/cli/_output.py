"""Output helpers: every command prints data either for humans (rich) or as JSON.

Both consoles print text literally (`markup=False`): paths, prompts and tensor names may hold `[`
and `]`, which rich would otherwise read as markup (`-o 'out[/x]'` raised MarkupError, `[x]`
vanished). A line that wants colour passes `markup=True` and escapes everything it interpolates;
a status spinner gets a `rich.text.Text` (a spinner parses a plain string as markup).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

# Characters a terminal acts on instead of showing: C0 controls (ESC starts a sequence that can
# clear the screen or move the cursor; \r and \n fake new lines), DEL, C1 controls (\x9b is a
# one-byte CSI), the line/paragraph separators and the bidirectional overrides that reorder text
# ("Trojan Source"), and lone surrogates (the undecodable bytes of a file name).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e"
                     "\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if 0xDC80 <= code <= 0xDCFF:  # a byte Python could not decode (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(text: Any, keep: str = "") -> str:
    """`str(text)` with every character a terminal would act on shown as a visible escape (ESC ->
    `\\x1b`, a newline -> `\\n`, an undecodable file-name byte -> `\\xff`), except those in
    `keep` (e.g. "\\n\\t" for generated text). Apply it to every string that comes from a file
    or a model folder (manifest fields, config names, paths) before a human format prints it."""
    text = str(text)
    if not _UNSAFE.search(text):
        return text
    return _UNSAFE.sub(lambda m: m.group() if m.group() in keep else _visible(m), text)


console = Console(highlight=False, soft_wrap=True, markup=False)
err_console = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def print_json(data: Any) -> None:
    """Machine-readable output on stdout (nothing else is printed there in --json mode)."""
    print(json.dumps(data, indent=2, sort_keys=False, default=str))


def print_table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    """A table on a terminal; plain tab-separated lines, never truncated, when stdout is a pipe
    or a file (`arkinfer targets | grep ID` finds whole ids). Every title and cell is printed
    `terminal_safe` (a tab or newline inside a cell cannot split it either)."""
    title = None if title is None else terminal_safe(title)
    columns = [terminal_safe(c) for c in columns]
    rows = [[terminal_safe(x) for x in row] for row in rows]
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
    """A two-column key/value block (plain `key: value` lines when stdout is not a terminal);
    title, keys and values printed `terminal_safe`."""
    title = terminal_safe(title)
    items = [(terminal_safe(key), terminal_safe(value)) for key, value in items]
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
    """A transient stderr progress bar: `label`, bar, done/total, elapsed, time left, then the
    task's `field` (pass it to add_task/update as a keyword, e.g. name=... or info=...). When
    stderr is not a terminal (piped, a CI log) every update is a plain line instead."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    if not err_console.is_terminal:
        return PlainProgress(label, field)
    return Progress(TextColumn(f"[bold]{escape(terminal_safe(label))}[/]"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                    TextColumn("{task.fields[" + field + "]}", markup=False),
                    console=err_console, transient=True)


class PlainProgress:
    """progress_bar's stand-in off a terminal: a line with done/total, elapsed seconds, an
    estimate of the time left and the task's field, at most every `every` seconds (and when the
    task completes)."""

    def __init__(self, label: str, field: str, every: float = 2.0) -> None:
        self.label, self.field, self.every = label, field, every
        self.tasks: dict[int, dict] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def add_task(self, description: str, total: float | None = None, **fields) -> int:
        import time

        task = len(self.tasks)
        now = time.perf_counter()
        self.tasks[task] = {"total": total, "completed": 0, "t0": now, "shown": now, **fields}
        return task

    def update(self, task: int, *, completed: float | None = None, total: float | None = None,
               advance: float | None = None, **fields) -> None:
        import time

        t = self.tasks[task]
        if total is not None:
            t["total"] = total
        if advance is not None:
            t["completed"] += advance
        if completed is not None:
            t["completed"] = completed
        t.update(fields)
        now = time.perf_counter()
        done, whole = t["completed"], t["total"]
        if now - t["shown"] < self.every and not (whole and done >= whole):
            return
        t["shown"], elapsed = now, now - t["t0"]
        left = (f", about {elapsed / done * (whole - done):.0f} s left"
                if whole and 0 < done < whole else "")
        count = f"{done:g}/{whole:g}" if whole else f"{done:g}"
        err_console.print(terminal_safe(f"{self.label}: {count} ({elapsed:.0f} s{left}) "
                                        f"{t.get(self.field, '')}").rstrip(),
                          markup=False, highlight=False)
