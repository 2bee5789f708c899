"""Pass `dce`: remove nodes no output depends on, then weights no entry point references."""

from __future__ import annotations

from arkinfer.ir.graph import Program


def dce(program: Program) -> Program:
    out = program.copy()
    for graph in out.entries.values():
        live = set(graph.outputs.values())
        kept = []
        for node in reversed(graph.nodes):
            if node.name in live:
                live.update(node.inputs)
                kept.append(node)
        graph.nodes = kept[::-1]
    used = set().union(*[g.weight_refs() for g in out.entries.values()])
    for name in [n for n in out.weights.names() if n not in used]:
        out.weights.remove(name)
    return out
