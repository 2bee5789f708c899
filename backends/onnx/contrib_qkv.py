"""Packed QKV for the host fast path: the q, k and v projections of one attention, three
com.microsoft.MatMulNBits nodes reading the same activations, become one MatMulNBits with
N = Nq + Nk + Nv whose output GroupQueryAttention takes as its packed `query` (key and value
omitted), as onnxruntime-genai's model builder writes it. One kernel call instead of three per
layer; the arithmetic per output column is unchanged (each row of B, its scales and zero points
are concatenated as they are: MatMulNBits' layouts are row-major in N)

    B [N, K/block, block/2] -> concat on axis 0; scales [N*K/block] and zero_points
    [N*ceil(K/block/2)] (per-row padded) -> concat

Runs after contrib.use_matmul_nbits and contrib_fused.use_fused_ops, in memory at load time.
Projections with a bias (an Add between the MatMulNBits and GroupQueryAttention), different
K / block_size / accuracy_level or only some with zero points stay as they are.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .contrib import MS_DOMAIN, attr, keep_read_initializers, readers

_SAME = ("K", "bits", "block_size", "accuracy_level")


def _packable(nodes: list[onnx.NodeProto | None], users: dict[str, int]) -> bool:
    if any(n is None or n.op_type != "MatMulNBits" or n.domain != MS_DOMAIN or len(n.input) > 4
           for n in nodes):
        return False
    if len({n.input[0] for n in nodes}) != 1 or len({len(n.input) for n in nodes}) != 1:
        return False
    if any(users.get(n.output[0]) != 1 for n in nodes):
        return False
    return all(len({attr(n, a) for n in nodes}) == 1 for a in _SAME)


def pack_qkv(model: onnx.ModelProto) -> int:
    """Rewrite in place; returns the number of GroupQueryAttention nodes now fed packed QKV."""
    inits = {t.name: t for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    users = readers(model)
    dropped, packed, new_inits = set(), 0, []
    for gqa in model.graph.node:
        if gqa.op_type != "GroupQueryAttention" or not gqa.input[1]:
            continue
        mms = [producer.get(i) for i in gqa.input[:3]]
        if not _packable(mms, users) or not all(i in inits for m in mms for i in m.input[1:]):
            continue
        name = f"{gqa.name}/qkv"
        tensors = []
        for slot in range(1, len(mms[0].input)):  # B, scales, zero_points
            arrays = [numpy_helper.to_array(inits[m.input[slot]]) for m in mms]
            tensors.append(numpy_helper.from_array(np.concatenate(arrays, axis=0),
                                                   f"{name}.{slot}"))
        new_inits += tensors
        n_total = sum(int(attr(m, "N")) for m in mms)
        mm = helper.make_node("MatMulNBits", [mms[0].input[0], *(t.name for t in tensors)],
                              [f"{name}/out"], name=name, domain=MS_DOMAIN, N=n_total,
                              **{a: attr(mms[0], a) for a in _SAME})
        mms[0].CopyFrom(mm)                      # the q projection's slot, before the GQA
        for m in mms[1:]:
            dropped.add(m.name)
        gqa.input[0], gqa.input[1], gqa.input[2] = mm.output[0], "", ""
        packed += 1
    if packed:
        keep = [n for n in model.graph.node if n.name not in dropped]
        del model.graph.node[:]
        model.graph.node.extend(keep)
        keep_read_initializers(model, new_inits)
    return packed
