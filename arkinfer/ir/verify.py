"""The verifier: run on every traced graph and after every pass.

Checks, per entry point: named dims declared with sane ranges and every symbol used is declared;
value names unique; every operand defined before use; ops known, with the right number of operands
and exactly their attributes, of the right kinds; every weight referenced exists in the store;
every node's declared type equals the type inferred from its operands (dtypes and symbolic shapes);
outputs defined; the KV-cache inputs and outputs listed in the program metadata present.
All problems are reported in one IRVerifyError.
"""

from __future__ import annotations

from typing import Any

from arkinfer.ir import dims
from arkinfer.ir.errors import IRError, IRVerifyError
from arkinfer.ir.graph import Graph, Program
from arkinfer.ir.infer import infer_type
from arkinfer.ir.ops import LONG_ROPE_ATTRS, SPECS, AttrKind, Op
from arkinfer.ir.types import DType, TensorType
from arkinfer.ir.weights import WeightStore

_MAX_SHOWN = 25


def _attr_problem(kind: AttrKind, value: Any, store: WeightStore, declared: set[str]) -> str | None:
    if kind == AttrKind.WEIGHT:
        if not isinstance(value, str):
            return f"must name a weight, got {value!r}"
        return None if value in store else f"names weight '{value}', which is not in the store"
    if kind == AttrKind.FLOAT:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else f"must be a number, got {value!r}"
    if kind == AttrKind.INT:
        return None if isinstance(value, int) and not isinstance(value, bool) else \
            f"must be an int, got {value!r}"
    if kind in (AttrKind.DIM, AttrKind.DIMS):
        items = value if kind == AttrKind.DIMS else [value]
        if not isinstance(items, list):
            return f"must be a list of dims, got {value!r}"
        for d in items:
            if not isinstance(d, (int, str)) or isinstance(d, bool):
                return f"dim {d!r} is neither an int nor an expression"
            unknown = dims.symbols(d) - declared
            if unknown:
                return f"dim {d!r} uses undeclared {sorted(unknown)}"
        return None
    if kind == AttrKind.DTYPE:
        return None if value in {d.value for d in DType} else f"unknown dtype {value!r}"
    if kind == AttrKind.JSON:
        return None if value is None or isinstance(value, dict) else f"must be a dict, got {value!r}"
    return f"unknown attribute kind {kind}"


def graph_problems(graph: Graph, store: WeightStore) -> list[str]:
    """Every rule `graph` breaks, as human-readable lines."""
    problems: list[str] = []
    declared = set(graph.dims)
    for name, rng in graph.dims.items():
        if not dims.is_name(name) or len(rng) != 2 or not 0 <= rng[0] <= rng[1]:
            problems.append(f"dim {name!r} has invalid name or range {rng}")
    for expr, bound in graph.constraints:
        try:
            unknown = dims.symbols(expr) - declared
        except IRError as exc:
            problems.append(f"constraint {expr!r}: {exc.message}")
            continue
        if unknown or not isinstance(bound, int):
            problems.append(f"constraint {expr} <= {bound} uses undeclared {sorted(unknown)}")
    types: dict[str, TensorType] = {}
    for inp in graph.inputs:
        if inp.name in types:
            problems.append(f"input '{inp.name}' is declared twice")
        if inp.type.symbols() - declared:
            problems.append(f"input '{inp.name}' {inp.type} uses undeclared dims")
        types[inp.name] = inp.type

    def weight_type(name: str) -> TensorType:
        if name not in store:
            raise IRVerifyError(f"weight '{name}' is not in the weight store")
        return store[name].type

    for node in graph.nodes:
        where = f"%{node.name} ({getattr(node.op, 'value', node.op)})"
        before = len(problems)
        spec = SPECS.get(node.op) if isinstance(node.op, Op) else None
        if spec is None:
            problems.append(f"{where}: unknown op")
            continue
        if node.name in types:
            problems.append(f"{where}: the name '{node.name}' is defined twice")
        missing = [i for i in node.inputs if i not in types]
        if missing:
            problems.append(f"{where}: uses {missing} before definition (or never defined)")
        n = len(node.inputs)
        if (spec.variadic and n < 1) or (not spec.variadic and n != len(spec.operands)):
            problems.append(f"{where}: takes {'1 or more' if spec.variadic else len(spec.operands)}"
                            f" operands ({', '.join(spec.operands)}), got {n}")
        known = {a.name for a in spec.attrs}
        for key in node.attrs:
            if key not in known:
                problems.append(f"{where}: unknown attribute '{key}' (allowed: {sorted(known)})")
        for attr in spec.attrs:
            value = node.attrs.get(attr.name)
            if value is None:
                if attr.required:
                    problems.append(f"{where}: missing attribute '{attr.name}' ({attr.kind.value})")
                continue
            problem = _attr_problem(attr.kind, value, store, declared)
            if problem:
                problems.append(f"{where}: attribute '{attr.name}' {problem}")
        if node.op in LONG_ROPE_ATTRS:
            present = [node.attrs.get(k) is not None for k in LONG_ROPE_ATTRS[node.op]]
            if any(present) and not all(present):
                problems.append(f"{where}: LongRoPE needs all of {LONG_ROPE_ATTRS[node.op]} or none")
        if node.type.symbols() - declared:
            problems.append(f"{where}: type {node.type} uses undeclared dims")
        if len(problems) == before:  # type rules only make sense on a well-formed node
            try:
                inferred = infer_type(node.op, [types[i] for i in node.inputs], node.attrs,
                                      weight_type)
                if not inferred.same_as(node.type):
                    problems.append(f"{where}: declared {node.type} but the operands give {inferred}")
            except (IRError, KeyError, TypeError, IndexError) as exc:
                problems.append(f"{where}: {getattr(exc, 'message', exc)}")
        types[node.name] = node.type
    for out, value in graph.outputs.items():
        if value not in types:
            problems.append(f"output '{out}' refers to undefined value '{value}'")
    return [f"{graph.name}: {p}" for p in problems]


def verify(program: Program, after: str | None = None) -> Program:
    """Raise IRVerifyError listing every problem of every entry point; return `program` if valid."""
    problems: list[str] = []
    if not program.entries:
        problems.append("the program has no entry points")
    for name, graph in program.entries.items():
        if graph.name != name:
            problems.append(f"entry '{name}' holds a graph named '{graph.name}'")
        problems += graph_problems(graph, program.weights)
        inputs = {i.name for i in graph.inputs}
        for pair in program.cache_names():
            for cache_name in pair:
                if cache_name not in inputs or cache_name not in graph.outputs:
                    problems.append(f"{name}: cache '{cache_name}' must be both input and output")
    if problems:
        shown = problems[:_MAX_SHOWN] + ([f"... and {len(problems) - _MAX_SHOWN} more"]
                                         if len(problems) > _MAX_SHOWN else [])
        stage = f" after pass '{after}'" if after else ""
        raise IRVerifyError(f"the IR is invalid{stage} ({len(problems)} problem(s)):\n  "
                          + "\n  ".join(shown),
                          hint=f"this is a bug in '{after}'" if after else
                          "the graph was built or edited by hand, or by a buggy lowering")
    return program
