"""The host runner's fast path: replace `arkinfer.MarlinLinear` / `arkinfer.Int4Linear` nodes by
onnxruntime's contrib op `com.microsoft.MatMulNBits` (ContribOperators.md), repacking the stored
integers losslessly: the format's numpy unpack (arkinfer.quant.formats) gives the canonical codes,
scales and zeros, and the `ort` format packs them as MatMulNBits wants them

    B uint8 [N, K/block, block/2], scales f32 [N * K/block], zero_points uint8 (asymmetric only)

A node stays a function call (and is reported) when MatMulNBits cannot take its weight: act-order
g_idx, or a block size that is not a power of two in 16..256. The rewrite runs in memory at load
time; the artifact on disk keeps the portable functions.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from arkinfer.quant.formats import FormatError, get_format
from onnx import helper, numpy_helper

from . import fn_linear
from .onnx_build import DOMAIN
from .weights import tensor_proto

MS_DOMAIN = "com.microsoft"


def attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def readers(model: onnx.ModelProto) -> dict[str, int]:
    """value name -> how many node inputs read it."""
    count: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            count[name] = count.get(name, 0) + 1
    return count


def keep_read_initializers(model: onnx.ModelProto, new: list | tuple = ()) -> None:
    """Drop the initializers no node reads any more (a rewrite's replaced weights), add `new`."""
    read = set(readers(model)) | {o.name for o in model.graph.output}
    keep = [t for t in model.graph.initializer if t.name in read] + list(new)
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)


def ensure_ms_opset(model: onnx.ModelProto) -> None:
    """Import the com.microsoft domain (contrib ops) once."""
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))


def _unpack(node: onnx.NodeProto, arrays: dict[str, np.ndarray]):
    k, n = int(attr(node, "in_features")), int(attr(node, "out_features"))
    group = int(attr(node, "group_size", 128))
    if node.op_type == fn_linear.MARLIN:
        return get_format("marlin").unpack(arrays, n, k, group_size=group)
    layout = attr(node, "layout", b"gptq")
    layout = layout.decode() if isinstance(layout, bytes) else layout
    # the node does not say whether the zero points are all 8 (symmetric): read them
    qw = get_format(layout).unpack(arrays, n, k, bits=4, group_size=group, sym=False)
    if bool((qw.zeros == 8).all()):
        qw = dataclasses.replace(qw, sym=True)
    if layout == "gptq" and not np.array_equal(arrays["g_idx"], np.arange(k) // (group if group > 0
                                                                                   else k)):
        raise FormatError(f"{node.name}: act-order g_idx", "MatMulNBits has no g_idx")
    return qw


def use_matmul_nbits(model: onnx.ModelProto, accuracy_level: int = 0) -> tuple[int, list[str]]:
    """Rewrite in place; returns (nodes replaced, notes on nodes kept as functions)."""
    inits = {t.name: t for t in model.graph.initializer}
    ort_fmt = get_format("ort")
    replaced, notes = 0, []
    for idx, node in enumerate(model.graph.node):
        if node.domain != DOMAIN or node.op_type not in (fn_linear.MARLIN, fn_linear.INT4):
            continue
        keys = ("B", "s") if node.op_type == fn_linear.MARLIN else \
            ("qweight", "qzeros", "scales", "g_idx")
        arrays = {k: numpy_helper.to_array(inits[name]) for k, name in zip(keys, node.input[1:])}
        try:
            qw = _unpack(node, arrays)
            if qw.group_size == -1:
                raise FormatError("per-channel scales", "MatMulNBits needs a block size")
            packed = ort_fmt.pack(qw)
        except FormatError as e:
            notes.append(f"{node.name} ({node.op_type}) kept as an ONNX function: {e.message}")
            continue
        prefix = node.input[1].rsplit(".", 1)[0] + ".nbits"
        names = [f"{prefix}.B", f"{prefix}.scales"]
        new_inits = [tensor_proto(names[0], packed["B"]), tensor_proto(names[1], packed["scales"])]
        if "zero_points" in packed:
            names.append(f"{prefix}.zero_points")
            new_inits.append(tensor_proto(names[2], packed["zero_points"]))
        model.graph.initializer.extend(new_inits)
        new = helper.make_node("MatMulNBits", [node.input[0], *names], list(node.output),
                               name=node.name, domain=MS_DOMAIN, K=qw.in_features,
                               N=qw.out_features, bits=4, block_size=qw.group_size,
                               accuracy_level=accuracy_level)
        model.graph.node[idx].CopyFrom(new)
        replaced += 1
    if replaced:
        # the checkpoint tensors the functions read (before, the bookkeeping of which to drop
        # read the inputs of the already replaced node, so they were all kept in memory)
        keep_read_initializers(model)
        ensure_ms_opset(model)
    return replaced, notes
