"""Packed projections for the host fast path: com.microsoft.MatMulNBits nodes reading the same
activations become one MatMulNBits with N = N1 + N2 + ..., so one kernel call replaces two or
three per layer. The arithmetic per output column is unchanged (each row of B, its scales and
zero points are concatenated as they are: MatMulNBits' layouts are row-major in N, and the
activations are quantised per K block whatever N is), so the packed graph's numbers are the
unpacked graph's, bit for bit.

    B [N, K/block, block/2] -> concat on axis 0; scales [N*K/block] and zero_points
    [N*ceil(K/block/2)] (per-row padded) -> concat

Two rewrites, in this order:
- `pack_qkv`: the q, k and v projections of one GroupQueryAttention; the packed output is GQA's
  packed `query` (key and value omitted), as onnxruntime-genai's model builder writes it.
- `pack_siblings`: every other group of siblings (an MLP's gate and up projections; the q/k/v of
  an attention that is not GQA, such as the InfLLM v2 function); a `Split` on the last axis gives
  each former output back under its own name. onnxruntime-genai's builder keeps gate and up
  apart: packing them made SmolLM2's decode 2-7 % faster here (BENCHMARKS.md).

Runs after contrib.use_matmul_nbits and contrib_fused.use_fused_ops, in memory at load time.
Projections with a bias or act-order g_idx (more than 4 inputs), different K / bits /
block_size / accuracy_level, or only some with zero points stay as they are.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .contrib import MS_DOMAIN, attr, keep_read_initializers, readers

_SAME = ("K", "bits", "block_size", "accuracy_level")


def _plain_nbits(node: onnx.NodeProto | None, inits: dict) -> bool:
    """A MatMulNBits node whose weights are initializers, with no bias or g_idx input."""
    return (node is not None and node.op_type == "MatMulNBits" and node.domain == MS_DOMAIN
            and len(node.input) <= 4 and all(i in inits for i in node.input[1:]))


def _group_key(node: onnx.NodeProto) -> tuple:
    """Nodes with equal keys read the same activations with the same attributes and slots."""
    return (node.input[0], len(node.input), *(attr(node, a) for a in _SAME))


def _packable(nodes: list[onnx.NodeProto | None], inits: dict) -> bool:
    """Two or more plain MatMulNBits nodes that can become one."""
    return len(nodes) >= 2 and all(_plain_nbits(n, inits) for n in nodes) and \
        len({_group_key(n) for n in nodes}) == 1


def _packed(mms: list[onnx.NodeProto], name: str, inits: dict) -> tuple[onnx.NodeProto, list]:
    """One MatMulNBits computing every node of `mms` (outputs side by side in their order), and
    its concatenated initializers."""
    tensors = []
    for slot in range(1, len(mms[0].input)):  # B, scales, zero_points
        arrays = [numpy_helper.to_array(inits[m.input[slot]]) for m in mms]
        tensors.append(numpy_helper.from_array(np.concatenate(arrays, axis=0), f"{name}.{slot}"))
    n_total = sum(int(attr(m, "N")) for m in mms)
    node = helper.make_node("MatMulNBits", [mms[0].input[0], *(t.name for t in tensors)],
                            [f"{name}/out"], name=name, domain=MS_DOMAIN, N=n_total,
                            **{a: attr(mms[0], a) for a in _SAME})
    return node, tensors


def _replace_nodes(model: onnx.ModelProto, replace: dict[str, list], dropped: set[str],
                   new_inits: list) -> None:
    """Put `replace[out]` where the node whose first output is `out` was, drop the nodes whose
    first output is in `dropped`, keep the read weights. Nodes are named by their first output:
    outputs are unique in a graph, node names need not be."""
    keep = []
    for node in model.graph.node:
        out = node.output[0] if node.output else None
        if out in replace:
            keep.extend(replace[out])
        elif out not in dropped:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    keep_read_initializers(model, new_inits)


def pack_qkv(model: onnx.ModelProto) -> int:
    """Rewrite in place; returns the number of GroupQueryAttention nodes now fed packed QKV."""
    inits = {t.name: t for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    users = readers(model)
    replace, dropped, new_inits = {}, set(), []
    for gqa in model.graph.node:
        if gqa.op_type != "GroupQueryAttention" or not gqa.input[1]:
            continue
        mms = [producer.get(i) for i in gqa.input[:3]]
        if not _packable(mms, inits) or any(users.get(m.output[0]) != 1 for m in mms):
            continue
        node, tensors = _packed(mms, f"{gqa.name or gqa.output[0]}/qkv", inits)
        new_inits += tensors
        replace[mms[0].output[0]] = [node]      # the q projection's slot, before the GQA
        dropped.update(m.output[0] for m in mms[1:])
        gqa.input[0], gqa.input[1], gqa.input[2] = node.output[0], "", ""
    if replace:
        _replace_nodes(model, replace, dropped, new_inits)
    return len(replace)


def pack_siblings(model: onnx.ModelProto) -> int:
    """Rewrite in place: each group of MatMulNBits reading the same activations with the same
    attributes becomes one MatMulNBits and a Split whose outputs keep the former names (in the
    first node's place, so every reader still comes after). Returns the number of groups."""
    inits = {t.name: t for t in model.graph.initializer}
    groups: dict[tuple, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        if _plain_nbits(node, inits):
            groups.setdefault(_group_key(node), []).append(node)
    replace, dropped, new_inits = {}, set(), []
    for mms in groups.values():
        if len(mms) < 2:
            continue
        name = f"{mms[0].name or mms[0].output[0]}/packed"
        node, tensors = _packed(mms, name, inits)
        sizes = numpy_helper.from_array(np.array([int(attr(m, "N")) for m in mms], np.int64),
                                        f"{name}/sizes")
        split = helper.make_node("Split", [node.output[0], sizes.name],
                                 [m.output[0] for m in mms], name=f"{name}/split", axis=-1)
        new_inits += [*tensors, sizes]
        replace[mms[0].output[0]] = [node, split]
        dropped.update(m.output[0] for m in mms[1:])
    if replace:
        _replace_nodes(model, replace, dropped, new_inits)
    return len(replace)
