"""Storage formats: one module per format, each registering an instance in registry.py;
this package imports them all (the registration order) and re-exports the registry.

    from arkinfer.quant.formats import get_format
    fmt = get_format("marlin")
    fmt.check(qw, "model.layers.0.mlp.down_proj")   # FormatError with the reason, or None
    tensors = fmt.pack(qw)                           # {"B": int32 [k/16, 2n], "s": fp16 [...]}
    assert fmt.unpack(tensors, qw.out_features, qw.in_features, group_size=128).equals(qw)

Registered: gptq, awq, marlin, gguf-q4_0, gguf-q4_1, gguf-q5_0, gguf-q5_1, gguf-q8_0, gguf-iq4_nl,
gguf-q4_k, gguf-q5_k, gguf-q6_k, gguf-tq1_0, gguf-tq2_0, mlx, ort, onnx-qdq, ternary, tvm-q4.
Each one's `constraints` (bits, group sizes, sym, act-order, shape rules) is data.
"""

from __future__ import annotations

# Importing the format modules registers them in registry.py (order = listing order).
from . import awq, gguf, gptq, marlin, mlx, onnx_qdq, ort, ternary, tvm_q4  # noqa: F401
from .base import Constraints, Format, FormatError
from .registry import all_formats, get_format, register

__all__ = ["Constraints", "Format", "FormatError", "all_formats", "get_format", "register"]
