"""Free disk checked before writing: an output that would fill the disk stops at the start with the
bytes it needs and the bytes free, not later with a half-written folder.

    check_free_disk(Path("dist/x"), needed, "the artifact and its work files")

What each output needs is estimated where it is written (`arkinfer.pipeline.disk_space` for
builds, the GGUF importer, the 8B fixture).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from arkinfer.errors import ArkError

MARGIN_BYTES = 64 * 2**20  # manifests, tokenizers, rounding


class DiskSpaceError(ArkError):
    """Not enough free disk for an output."""


def check_free_disk(out: Path, needed: int, what: str, hint: str | None = None) -> None:
    """Raise DiskSpaceError when the filesystem that will hold `out` has less than `needed`
    bytes free (checked at the nearest existing parent). `what` names the output in the
    message; `hint` replaces the default next step."""
    probe = Path(out).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    if usage.total == 0 or not os.access(probe, os.W_OK):
        return  # not a disk (sysfs, procfs) or not writable: the write itself names the path
    free = usage.free
    if free < needed:
        raise DiskSpaceError(
            f"{what}: about {_gb(needed)} ({needed:,} bytes) needed under {probe}, "
            f"{_gb(free)} ({free:,} bytes) free",
            hint or f"free {_gb(needed - free)} there or write elsewhere (-o PATH on a larger "
                    "disk)")


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
