"""Run ArkInfer's processes with glibc's transparent-huge-page malloc (Linux, glibc >= 2.35).

A decode step reads every weight once: ~100 MB a token for a 4-bit SmolLM2-135M on onnxruntime,
25 thousand 4 KiB pages, so the core spends part of each token walking page tables. With
transparent huge pages in `madvise` mode (Debian's and most distributions' default) memory only
gets 2 MiB pages where a program asks, and onnxruntime, torch and numpy do not ask. glibc asks
for every block malloc maps when its tunable `glibc.malloc.hugetlb=1` is set, which it reads
once, when the process starts; so the `arkinfer` command (arkinfer/entry.py) starts itself again
with the tunable added, before importing anything heavy (~30 ms):

    reexec_with_huge_page_malloc()      # returns where it does not apply; else never returns

SmolLM2-135M 4-bit on onnxruntime with int8 activations decoded 2.5-14 % faster this way in
our runs (benchmarks/onnx_vs_llamacpp.py; BENCHMARKS.md). Values are unchanged: only the page
size behind them. Children inherit the variable; `without_huge_page_malloc()` gives an
environment without it (the benchmarks time both). It does nothing with ARKINFER_HUGE_PAGES=0,
off Linux, with glibc before 2.35, with THP set to `never`, or when GLIBC_TUNABLES already names
the tunable (a user's own choice wins).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb"
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_REEXEC_MARK = "ARKINFER_HUGE_PAGES_REEXEC"   # set in the restarted process: never twice


def thp_mode() -> str | None:
    """The selected word of /sys/kernel/mm/transparent_hugepage/enabled (always, madvise or
    never), or None where the file is absent (not Linux, or THP compiled out)."""
    try:
        text = THP_SETTING.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the C library when it is glibc, else None."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        major, minor = version.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else None
    except (AttributeError, ValueError, OSError):
        return None


def _tunables(env: dict[str, str]) -> list[str]:
    """GLIBC_TUNABLES as its name=value items."""
    return [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t]


def _ours(item: str) -> bool:
    return item.startswith(f"{TUNABLE}=")


def status(environ: dict[str, str] | None = None) -> dict[str, object]:
    """Whether this process's malloc asks for huge pages, and why (not): `arkinfer doctor` and
    the benchmarks' machine records print it. {"on": bool, "why": str}"""
    env = os.environ if environ is None else environ
    if any(t in (f"{TUNABLE}=1", f"{TUNABLE}=2") for t in _tunables(env)):
        return {"on": True, "why": f"GLIBC_TUNABLES={env['GLIBC_TUNABLES']} (THP {thp_mode()})"}
    return {"on": False, "why": _why_not(env) or "the process was not started by `arkinfer`"}


def _why_not(env: dict[str, str]) -> str | None:
    """Why huge-page malloc cannot or should not be switched on here (None: it can)."""
    if env.get("ARKINFER_HUGE_PAGES", "1") == "0":
        return "ARKINFER_HUGE_PAGES=0"
    if not sys.platform.startswith("linux"):
        return f"not Linux ({sys.platform})"
    version = glibc_version()
    if version is None or version < (2, 35):
        return f"needs glibc >= 2.35 (this C library: {os.confstr('CS_GNU_LIBC_VERSION')})"
    mode = thp_mode()
    if mode in (None, "never"):
        return f"transparent huge pages are {'absent' if mode is None else 'set to never'}"
    if any(_ours(t) for t in _tunables(env)):
        return f"GLIBC_TUNABLES already sets {TUNABLE} ({env['GLIBC_TUNABLES']})"
    return None


def huge_page_env(environ: dict[str, str] | None = None) -> dict[str, str] | None:
    """`environ` (default: this process's) with glibc.malloc.hugetlb=1 added to GLIBC_TUNABLES,
    for a child process to start with; None where it does not apply (see `status`)."""
    env = dict(os.environ if environ is None else environ)
    if _why_not(env) is not None:
        return None
    env["GLIBC_TUNABLES"] = ":".join([*_tunables(env), f"{TUNABLE}=1"])
    return env


def without_huge_page_malloc(environ: dict[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: this process's) without glibc.malloc.hugetlb in GLIBC_TUNABLES: a
    child started with it runs on glibc's default allocation (benchmarks compare both)."""
    env = dict(os.environ if environ is None else environ)
    kept = [t for t in _tunables(env) if not _ours(t)]
    env.pop(_REEXEC_MARK, None)
    if kept:
        env["GLIBC_TUNABLES"] = ":".join(kept)
    else:
        env.pop("GLIBC_TUNABLES", None)
    return env


def reexec_with_huge_page_malloc() -> None:
    """Start this very command again (same interpreter, flags and arguments) with huge-page
    malloc, unless it does not apply or this process is already the restart. Call it first
    thing: whatever ran before is run again."""
    if os.environ.get(_REEXEC_MARK) == "1" or not sys.executable:
        return
    env = huge_page_env()
    if env is None:
        return
    env[_REEXEC_MARK] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    argv = list(getattr(sys, "orig_argv", [])) or [sys.executable, *sys.argv]
    try:
        os.execve(sys.executable, [sys.executable, *argv[1:]], env)
    except OSError:   # cannot start the interpreter again: go on with the default malloc
        return
