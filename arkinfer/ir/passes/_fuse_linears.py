"""Fusing sibling linears: projections that read the same value become one wider linear.

`x -> q_proj, k_proj, v_proj` turns into `x -> qkv_proj` followed by one `slice` per original
projection along the last dim. The slices keep the original nodes' names, so no user of q, k or v
changes. The fused weight is the row-concatenation `cat([Wq, Wk, Wv], 0)` (biases likewise),
added to the store once and shared by every entry point; it is built lazily on first use, and as
a meta tensor when the program is shape-only. Projections fuse only when they agree on dtype,
bias presence and quant annotation (a fused weight has one quant layout).
"""

from __future__ import annotations

import re

import torch

from arkinfer.ir.graph import Graph, Node, Program
from arkinfer.ir.ops import Op
from arkinfer.ir.types import TensorType
from arkinfer.ir.weights import Weight, WeightStore


def _concat_weight(store: WeightStore, name: str, parts: list[str]) -> None:
    """Add `name` = rows of `parts` concatenated (or check the one already there)."""
    ws = [store[p] for p in parts]
    rows = sum(int(w.type.shape[0]) for w in ws)
    t = TensorType(ws[0].type.dtype, (rows, *ws[0].type.shape[1:]))
    if name in store:
        if store[name].type != t:
            raise ValueError(f"fused weight '{name}' exists with type {store[name].type}, not {t}")
        return
    if all(w.has_data for w in ws):
        store.add(Weight(name, t, loader=lambda: torch.cat([w.tensor() for w in ws], 0),
                         quant=ws[0].quant))
    else:
        store.add(Weight(name, t, data=torch.empty(t.concrete({}), dtype=t.dtype.torch,
                                                   device="meta"), quant=ws[0].quant))


def _fusable(nodes: list[Node], store: WeightStore) -> bool:
    weights = [store[n.attrs["weight"]] for n in nodes]
    has_bias = {n.attrs.get("bias") is not None for n in nodes}
    return (len(has_bias) == 1 and len({w.type.dtype for w in weights}) == 1
            and len({w.quant for w in weights}) == 1
            and len({w.type.shape[1:] for w in weights}) == 1)


def _fuse_graph(graph: Graph, store: WeightStore, parts: tuple[str, ...], fused: str) -> None:
    pattern = re.compile(rf"^(.*)\.({'|'.join(map(re.escape, parts))})\.weight$")
    groups: dict[tuple[str, str], dict[str, Node]] = {}
    for node in graph.nodes:
        m = pattern.match(node.attrs.get("weight", "")) if node.op == Op.LINEAR else None
        if m:
            groups.setdefault((node.inputs[0], m.group(1)), {})[m.group(2)] = node
    replace: dict[str, list[Node]] = {}  # first member's name -> fused linear + slices
    dropped: set[str] = set()
    reserved: set[str] = set()
    for (x, prefix), members in groups.items():
        nodes = [members.get(p) for p in parts]
        if any(n is None for n in nodes) or not _fusable(nodes, store):  # type: ignore[arg-type]
            continue
        weight = f"{prefix}.{fused}.weight"
        _concat_weight(store, weight, [n.attrs["weight"] for n in nodes])
        bias = None
        if nodes[0].attrs.get("bias") is not None:
            bias = f"{prefix}.{fused}.bias"
            _concat_weight(store, bias, [n.attrs["bias"] for n in nodes])
        x_type = graph.types()[x]
        rows = int(store[weight].type.shape[0])
        name = graph.fresh_name(f"{fused}_", reserved)
        reserved.add(name)
        attrs = {"weight": weight} | ({"bias": bias} if bias else {})
        source = nodes[0].source.rsplit(".", 1)[0] + f".{fused}" if nodes[0].source else None
        new = [Node(name, Op.LINEAR, [x], attrs, x_type.with_shape(x_type.shape[:-1] + (rows,)),
                    source)]
        start, last = 0, x_type.rank - 1
        for n in nodes:
            end = start + int(n.type.shape[-1])
            new.append(Node(n.name, Op.SLICE, [name], {"dim": last, "start": start, "end": end},
                            n.type, n.source))
            start = end
        replace[nodes[0].name] = new
        dropped.update(n.name for n in nodes)
    if replace:
        out: list[Node] = []
        for node in graph.nodes:
            if node.name in replace:
                out += replace[node.name]
            elif node.name not in dropped:
                out.append(node)
        graph.nodes = out


def fuse_linears(program: Program, parts: tuple[str, ...], fused: str) -> Program:
    """Fuse every group `<prefix>.{parts}.weight` of linears reading one value into `fused`."""
    out = program.copy()
    for graph in out.entries.values():
        _fuse_graph(graph, out.weights, parts, fused)
    return out
