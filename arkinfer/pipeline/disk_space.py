"""Disk a build or quantisation needs, checked before any work (`arkinfer.disk_space`): one that
would fill the disk stops at the start with the bytes it needs, not hours later.

    needed = build_disk_bytes(raw_config, recipe_or_scheme, calib_tokens=128 * 512)
    check_free_disk(Path("dist/x"), needed, "the artifact and its work files")

Estimate (an upper bound, not a prediction of the artifact's exact size): the stored weights in
the chosen scheme (`arkinfer.latency.cost.ModelCost`, the figure `plan` prints) written twice
while a quantised build runs (the quantised folder in the work area, then the artifact), plus the
calibration work files (one block's float32 inputs, [tokens, hidden], kept to resume), plus a
64 MiB margin for manifests, tokenizers and rounding.
"""

from __future__ import annotations

from typing import Any

from arkinfer.disk_space import MARGIN_BYTES


def build_disk_bytes(raw_config: dict[str, Any], quant: Any, calib_tokens: int = 0) -> int:
    """Bytes a build of `raw_config` with `quant` (a QuantRecipe or a float scheme name) may
    write: see the module docstring. `calib_tokens`: calibration tokens (0 = no calibration)."""
    from arkinfer.latency.cost import ModelCost

    cost = ModelCost.from_config(raw_config, quant)
    copies = 1 if isinstance(quant, str) else 2
    hidden = calib_tokens * int(raw_config.get("hidden_size", 0)) * 4
    return copies * cost.weight_bytes + hidden + MARGIN_BYTES
