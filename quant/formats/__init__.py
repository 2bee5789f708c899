"""Storage formats: one module per format, each registering an instance here.

    from arkinfer.quant.formats import get_format
    fmt = get_format("marlin")
    fmt.check(qw, "model.layers.0.mlp.down_proj")   # FormatError with the reason, or None
    tensors = fmt.pack(qw)                           # {"B": int32 [k/16, 2n], "s": fp16 [...]}
    assert fmt.unpack(tensors, qw.out_features, qw.in_features, group_size=128).equals(qw)

Registered: gptq, awq, marlin, gguf-q4_0, gguf-q4_1, gguf-q5_0, gguf-q5_1, gguf-q8_0, gguf-iq4_nl,
gguf-q4_k, gguf-q5_k, gguf-q6_k, gguf-tq1_0, gguf-tq2_0, mlx, ort, onnx-qdq, ternary. Each one's `constraints` (bits, group sizes, sym, act-order, shape rules) is
data.
"""

from __future__ import annotations

from .base import Constraints, Format, FormatError

_REGISTRY: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add a format instance under `fmt.name` (module import time); names are unique."""
    if fmt.name in _REGISTRY:
        raise ValueError(f"storage format {fmt.name!r} is registered twice")
    _REGISTRY[fmt.name] = fmt
    return fmt


def get_format(name: str) -> Format:
    """The registered format called `name`; FormatError listing the registered ones otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise FormatError(f"unknown storage format {name!r}; registered: {sorted(_REGISTRY)}",
                          "pick one of the registered formats") from None


def all_formats() -> tuple[Format, ...]:
    """Every registered format, in registration order."""
    return tuple(_REGISTRY.values())


# Importing the modules registers them (order = listing order).
from . import awq, gguf, gptq, marlin, mlx, onnx_qdq, ort, ternary  # noqa: F401

__all__ = ["Constraints", "Format", "FormatError", "all_formats", "get_format", "register"]
