"""Disk an output needs, checked before any work: a build or quantisation that would fill the disk
stops at the start with the bytes it needs, not hours later with a half-written folder.

    needed = build_disk_bytes(raw_config, recipe_or_scheme, calib_tokens=128 * 512)
    check_free_disk(Path("dist/x"), needed, "the artifact and its work files")

Estimate (an upper bound, not a prediction of the artifact's exact size): the stored weights in
the chosen scheme (`arkinfer.latency.cost.ModelCost`, the figure `plan` prints) written twice
while a quantised build runs (the quantised folder in the work area, then the artifact), plus the
calibration work files (one block's float32 inputs, [tokens, hidden], kept to resume), plus a
64 MiB margin for manifests, tokenizers and rounding.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from arkinfer.errors import ArkError

MARGIN_BYTES = 64 * 2**20


class DiskSpaceError(ArkError):
    """Not enough free disk for an output."""


def build_disk_bytes(raw_config: dict[str, Any], quant: Any, calib_tokens: int = 0) -> int:
    """Bytes a build of `raw_config` with `quant` (a QuantRecipe or a float scheme name) may
    write: see the module docstring. `calib_tokens`: calibration tokens (0 = no calibration)."""
    from arkinfer.latency.cost import ModelCost

    cost = ModelCost.from_config(raw_config, quant)
    copies = 1 if isinstance(quant, str) else 2
    hidden = calib_tokens * int(raw_config.get("hidden_size", 0)) * 4
    return copies * cost.weight_bytes + hidden + MARGIN_BYTES


def check_free_disk(out: Path, needed: int, what: str, hint: str | None = None) -> None:
    """Raise DiskSpaceError when the filesystem that will hold `out` has less than `needed`
    bytes free (checked at the nearest existing parent). `what` names the output in the
    message; `hint` replaces the default next step."""
    probe = Path(out).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed:
        raise DiskSpaceError(
            f"{what}: about {_gb(needed)} ({needed:,} bytes) needed under {probe}, "
            f"{_gb(free)} ({free:,} bytes) free",
            hint or f"free {_gb(needed - free)} there or write elsewhere (-o PATH on a larger "
                    "disk)")


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
