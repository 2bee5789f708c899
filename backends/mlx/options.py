"""The mlx backend's `--option KEY=VALUE`s (README.md, "Tensors").

Declared here, below their readers: the backend object (backend.py, which checks them at plan
time), the tensor plan (tensors.py: `rtn`, `scales`) and the artifact writer (artifact.py:
`shard_mb`), so none of them imports the backend object for them.
"""

from __future__ import annotations

import math

from arkinfer.backend import BackendOption
from arkinfer.errors import ArkError

MAX_SHARD_BYTES = 5 << 30  # mlx-lm's MAX_FILE_SIZE_GB
OPTIONS = {
    "rtn": BackendOption("who rounds an RTN recipe such as mlx4: mx.quantize, the default, "
                         "or ArkInfer's folder", ("mlx", "folder"), ignore_case=True),
    "scales": BackendOption("dtype of a calibrated recipe's scales and biases; default f32, "
                            "exact", ("f32", "f16"), ignore_case=True),
    "shard_mb": BackendOption("MiB per safetensors shard; default 5120, mlx-lm's",
                              example="2048"),
}


def shard_bytes(options: dict[str, str]) -> int:
    """Bytes per shard from `--option shard_mb=N` (a positive, finite number of MiB)."""
    value = options.get("shard_mb")
    if value is None:
        return MAX_SHARD_BYTES
    try:
        mb = float(value)
    except ValueError:
        mb = -1.0
    if not (0 < mb < math.inf):  # also refuses nan
        raise ArkError(f"--option shard_mb={value!r} is not a positive number of MiB",
                       hint="e.g. --option shard_mb=2048 (default 5120, mlx-lm's)")
    return max(1, int(mb * (1 << 20)))
