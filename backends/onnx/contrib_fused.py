"""The host runner's fused-op fast path: swap the fn_fused.py functions one for one for
onnxruntime's contrib ops (ContribOperators.md; wired as onnxruntime-genai's model builder wires
them), in memory at load time; the artifact on disk keeps the portable functions.

    arkinfer.RMSNorm(x, w)           -> SimplifiedLayerNormalization(x, w) {axis=-1, epsilon,
                                        stash_type=1}                     (onnx domain, ORT-only)
    arkinfer.SkipRMSNorm(x, s, w)    -> com.microsoft.SkipSimplifiedLayerNormalization(x, s, w)
                                        {epsilon} -> (y, -, -, x + s)
    arkinfer.RotaryGQA(q, k, v, past_k, past_v, positions, inv_freq)
        -> com.microsoft.GroupQueryAttention(q, k, v, past_k, past_v, seqlens_k, total_seq_len,
           cos_cache, sin_cache) {num_heads, kv_num_heads, scale, do_rotary=1}

GroupQueryAttention (CPU) takes past/present in BNSH like the graph, derives the RoPE positions
from seqlens_k (= P+T-1: positions P..P+T-1, which is what the runner feeds), and reads cos/sin
rows [max_positions, D/2] built here from the node's inv_freq initializer exactly as the rope op
computes them (fp32 angle = fp32 position x fp32 frequency, times rope_scale). LongRoPE's
frequency switch (a Where over two initializers) becomes the same Where over two caches.
seqlens_k and total_seq_len are computed once from the last of the positions (P+T-1; every layer's
cache holds the same P tokens). A node stays a function (and is reported) when the op
cannot take it: head_dim not a multiple of 16, or frequencies that are not initializers.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from . import fn_fused
from .contrib import MS_DOMAIN, attr, ensure_ms_opset, keep_read_initializers
from .onnx_build import DOMAIN, NodeBuilder


def _caches(inv: np.ndarray, scale: float, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) f32 [rows, D/2] as arkinfer.ops.rope computes them (fp32 angles)."""
    angles = torch.arange(rows).to(torch.float32)[:, None] * torch.from_numpy(inv)[None, :]
    return ((angles.cos() * scale).numpy(), (angles.sin() * scale).numpy())


class _Swap:
    def __init__(self, model: onnx.ModelProto, max_positions: int) -> None:
        self.model, self.rows = model, max_positions
        self.inits = {t.name: t for t in model.graph.initializer}
        self.producer = {o: n for n in model.graph.node for o in n.output}
        self.new_inits: list[TensorProto] = []
        self.tables: dict[tuple[str, float], tuple[str, str]] = {}
        self.lengths: tuple[str, str] | None = None
        self.prelude: list[onnx.NodeProto] = []

    def table(self, inv_name: str, scale: float) -> tuple[str, str]:
        key = (inv_name, scale)
        if key not in self.tables:
            cos, sin = _caches(numpy_helper.to_array(self.inits[inv_name]).astype(np.float32),
                               scale, self.rows)
            names = (f"{inv_name}.cos_cache.{len(self.tables)}",
                     f"{inv_name}.sin_cache.{len(self.tables)}")
            self.new_inits += [numpy_helper.from_array(cos, names[0]),
                               numpy_helper.from_array(sin, names[1])]
            self.tables[key] = names
        return self.tables[key]

    def rope_caches(self, inv: str, scale: float, b: NodeBuilder) -> tuple[str, str]:
        """cos/sin caches for a frequency value: an initializer, or LongRoPE's
        Where(cond, long, short) over two initializers."""
        if inv in self.inits:
            return self.table(inv, scale)
        if (inv, scale) not in self.tables:  # built once, before the first node that reads it
            w = self.producer[inv]
            long, short = self.table(w.input[1], scale), self.table(w.input[2], scale)
            self.tables[(inv, scale)] = (b.op("Where", w.input[0], long[0], short[0]),
                                         b.op("Where", w.input[0], long[1], short[1]))
        return self.tables[(inv, scale)]

    def seq_lengths(self, node: onnx.NodeProto, b: NodeBuilder) -> tuple[str, str]:
        """(seqlens_k i32 [1] = P+T-1, total_seq_len i32 [1] = P+T) from the last position
        (not from past_key's shape: a preallocated cache is longer than P), built once."""
        if self.lengths is None:
            last = b.op("Slice", node.input[5], b.i64(-1), b.i64(np.iinfo(np.int64).max))
            seqlens = b.op("Cast", last, to=TensorProto.INT32)
            total = b.op("Add", seqlens, b.const(np.array([1], np.int32)))
            self.lengths = (seqlens, total)
        return self.lengths

    def gqa(self, node: onnx.NodeProto, b: NodeBuilder) -> str | None:
        """GroupQueryAttention nodes into b for one RotaryGQA; None (+ why) when it cannot."""
        hq, hkv = int(attr(node, "num_heads")), int(attr(node, "kv_num_heads"))
        inv, kept = node.input[6], f"{node.name} (RotaryGQA) kept as an ONNX function"
        where = self.producer.get(inv)
        src = inv if inv in self.inits else where.input[1] if where is not None and \
            where.op_type == "Where" and all(i in self.inits for i in where.input[1:]) else None
        if src is None:
            return f"{kept}: inv_freq {inv!r} is neither an initializer nor a Where of two; " \
                   "GroupQueryAttention needs constant cos/sin caches"
        head = 2 * int(numpy_helper.to_array(self.inits[src]).size)
        if head % 16:
            return f"{kept}: head_dim={head}; GroupQueryAttention's rotary needs a multiple of 16"
        caches = self.rope_caches(inv, float(attr(node, "rope_scale", 1.0)), b)
        seqlens, total = self.seq_lengths(node, b)
        b.node(helper.make_node(
            "GroupQueryAttention", [*node.input[:5], seqlens, total, *caches],
            list(node.output), name=node.name, domain=MS_DOMAIN, num_heads=hq, kv_num_heads=hkv,
            scale=float(attr(node, "scale")), do_rotary=1, rotary_interleaved=0,
            local_window_size=-1))
        return None


def _norm(node: onnx.NodeProto) -> onnx.NodeProto:
    eps = float(attr(node, "epsilon", 1e-6))
    if node.op_type == fn_fused.RMS_NORM:
        return helper.make_node("SimplifiedLayerNormalization", list(node.input), list(node.output),
                                name=node.name, axis=-1, epsilon=eps, stash_type=1)
    y, total = node.output
    return helper.make_node("SkipSimplifiedLayerNormalization", list(node.input),
                            [y, "", "", total], name=node.name, domain=MS_DOMAIN, epsilon=eps)


def _drop_dead(nodes: list[onnx.NodeProto], candidates: set[str]) -> list[onnx.NodeProto]:
    """nodes without those of `candidates` (value names: LongRoPE's frequency Where that only
    RotaryGQA read) that nothing reads any more."""
    used = {i for n in nodes for i in n.input}
    return [n for n in nodes if not (set(n.output) <= candidates and not set(n.output) & used)]


def use_fused_ops(model: onnx.ModelProto, max_positions: int) -> tuple[dict[str, int], list[str]]:
    """Rewrite in place; returns (nodes replaced per function name, notes on nodes kept)."""
    swap, count, notes, freqs = _Swap(model, max_positions), {}, [], set()
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.domain != DOMAIN or node.op_type not in fn_fused.FUNCTIONS:
            nodes.append(node)
            continue
        if node.op_type == fn_fused.ROTARY_GQA:
            b = NodeBuilder(f"{node.name}/gqa")
            why = swap.gqa(node, b)
            if why is not None:
                notes.append(why)
                nodes.append(node)
                continue
            nodes += b.nodes
            freqs.add(node.input[6])
        else:
            nodes.append(_norm(node))
        count[node.op_type] = count.get(node.op_type, 0) + 1
    del model.graph.node[:]
    model.graph.node.extend(_drop_dead(nodes, freqs))
    keep_read_initializers(model, swap.new_inits)
    if count:
        ensure_ms_opset(model)
    return count, notes
