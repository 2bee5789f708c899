"""A readable text form of a Program (what `arkinfer inspect --ir` shows and the golden files hold).

    prefill(tokens: i64[1,T], positions: i64[T], cache.0.k: f32[1,2,P,32], ...)
      dims T in [1,4096], P in [0,4095]; P+T <= 4096
      %0: f32[1,T,128] = embed(%tokens) weight=model.embed_tokens.weight
      %1: f32[1,T,128] = mul_scalar(%0) value=12.0
      ...
      return logits=%60, cache.0.k=%9, cache.0.v=%10, ...

Values are renumbered %0, %1, ... in graph order when printed (stored names are arbitrary), so
the text depends only on the graph's structure; inputs keep their names.
"""

from __future__ import annotations

import json
import re
from typing import Any

from arkinfer.ir.graph import Graph, Program


def _attr(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list) and all(isinstance(v, (int, str)) for v in value):
        return f"[{','.join(str(v) for v in value)}]"  # dims: [1,T,4,32]
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def _natural(name: str) -> list[Any]:
    """Sort key putting model.layers.2 before model.layers.10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def print_graph(graph: Graph, sources: bool = False) -> str:
    """One entry point as text; `sources=True` appends the nn.Module each node came from."""
    shown = {i.name: f"%{i.name}" for i in graph.inputs}
    for k, node in enumerate(graph.nodes):
        shown[node.name] = f"%{k}"
    sig = ",\n    ".join(f"{i.name}: {i.type}" for i in graph.inputs)
    lines = [f"{graph.name}(\n    {sig})"]
    ranges = ", ".join(f"{d} in [{lo},{hi}]" for d, (lo, hi) in graph.dims.items())
    constraints = "; ".join(f"{e} <= {b}" for e, b in graph.constraints)
    lines.append(f"  dims {ranges}" + (f"; {constraints}" if constraints else ""))
    for node in graph.nodes:
        args = ", ".join(shown.get(i, f"%{i}?") for i in node.inputs)
        attrs = " ".join(f"{k}={_attr(v)}" for k, v in node.attrs.items() if v is not None)
        line = f"  {shown[node.name]}: {node.type} = {node.op.value}({args})" + (
            f" {attrs}" if attrs else "")
        if sources and node.source:
            line += f"  # {node.source}"
        lines.append(line)
    outs = ", ".join(f"{name}={shown.get(v, '%' + v)}" for name, v in graph.outputs.items())
    lines.append(f"  return {outs}")
    return "\n".join(lines)


def print_ir(program: Program, weights: bool = True, sources: bool = False) -> str:
    """The whole program: a header, the weight store (names, types, quant) and every entry point."""
    m = program.meta
    head = (f"# ArkInfer IR: {m.get('model_type', '?')}, {m.get('dtype', '?')}, batch "
            f"{m.get('batch', '?')}, {program.num_layers} layers, max_len {m.get('max_len', '?')}, "
            f"{len(program.weights)} weights ({program.weights.num_elements():,} elements)")
    lines = [head]
    if m.get("sparse_config"):
        lines.append(f"# sparse_config (InfLLM v2): {_attr(m['sparse_config'])}")
    if weights:
        lines.append("weights:")
        width = max((len(w.name) for w in program.weights), default=0)
        for w in sorted(program.weights, key=lambda w: _natural(w.name)):
            quant = f"  quant={_attr(w.quant.to_json())}" if w.quant else ""
            lines.append(f"  {w.name.ljust(width)}  {w.type}{quant}")
    for graph in program.entries.values():
        lines += ["", print_graph(graph, sources)]
    return "\n".join(lines) + "\n"
