"""The InfLLM v2 compressed-key caches an ONNX graph carries, and how to cut them back.

Each `arkinfer.InfLLMv2Attention` node (fn_infllmv2.py) reads two caches besides its K/V:

    past.{i}.fine    f32 [1, Hkv, n_kernels(P, kernel, stride), D]   mean-pooled keys (§2)
    past.{i}.coarse  f32 [1, Hkv, n_kernels(P, 4 kernel, 4 stride), D]

Kernel j pools the keys j*stride .. j*stride + kernel - 1 and nothing later, so the caches of the
first n positions are the first n_kernels(n, ...) rows of those of any longer prefix: truncating
the KV cache to n positions truncates them by slicing, and the next call appends exactly the
kernels its new keys complete (the node pools kernels have .. n(S) - 1 only). This is what lets
speculative decoding roll an InfLLM v2 graph back past a rejected draft.

    kernels = compressed_kernels(model)        # {"past.0.fine": (32, 16), "past.0.coarse": (128, 64), ...}
    rows = kept_rows("past.0.fine", 100, kernels)   # 5: positions 0..99 complete fine kernels 0..4
"""

from __future__ import annotations

import onnx
from onnx import helper

from arkinfer.ops.infllmv2.common import n_kernels

from .fn_infllmv2 import COARSE_FACTOR, NAME
from .onnx_build import DOMAIN


def compressed_kernels(model: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """{past input name: (kernel, stride)} of every InfLLM v2 node's fine and coarse cache
    inputs (its inputs 3 and 4); {} for a dense graph."""
    kernels: dict[str, tuple[int, int]] = {}
    for node in model.graph.node:
        if (node.domain, node.op_type) != (DOMAIN, NAME):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        kernel, stride = int(attrs["kernel_size"]), int(attrs["kernel_stride"])
        kernels[node.input[3]] = (kernel, stride)
        kernels[node.input[4]] = (COARSE_FACTOR * kernel, COARSE_FACTOR * stride)
    return kernels


def kept_rows(name: str, positions: int, kernels: dict[str, tuple[int, int]]) -> int:
    """Rows of cache `name` that the first `positions` positions fill: the positions themselves
    for a K/V cache, the kernels they complete for a compressed-key cache."""
    if name not in kernels:
        return positions
    return n_kernels(positions, *kernels[name])
