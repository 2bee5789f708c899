"""The coreml backend's `--option KEY=VALUE`s (artifact.py's docstring explains each).

Declared here, below both readers: the backend object (backend.py, which checks `context=` at
plan time) and the lowering (artifact.py's options_of, which checks them all at lower), so
neither imports the other for them.
"""

from __future__ import annotations

from arkinfer.backend import BackendOption
from arkinfer.errors import ArkError

OPTIONS = {
    "context": BackendOption("tokens the KV state holds, a multiple of 64; default the model's "
                             "positions, at most 4096", example="2048"),
    "compute": BackendOption("compute dtype; default fp16, fp32 for f32 builds",
                             ("fp16", "fp32")),
    "compress": BackendOption("coremltools' own quantiser over a float build's linears",
                              ("none", "linear8", "palettize4")),
}


def context_option(value: str | None, max_len: int | None) -> int | None:
    """`context=`: a positive multiple of 64 and at most `max_len` (when known); absent: the
    model's `max_len` capped at 4096 (None when `max_len` is not known yet)."""
    if value is None:
        return None if max_len is None else min(int(max_len), 4096)
    try:
        context = int(value)
    except ValueError:
        raise ArkError(f"--option context={value!r} is not an integer",
                       hint="e.g. --option context=2048") from None
    if context <= 0 or context % 64 or (max_len is not None and context > max_len):
        limit = f"at most the model's {max_len} positions" if max_len is not None else \
            "at most the model's positions"
        raise ArkError(f"--option context={context}: must be a positive multiple of 64 and "
                       f"{limit}", hint="e.g. --option context=2048")
    return context
