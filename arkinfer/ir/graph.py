"""Graphs of typed values: one graph per entry point (prefill, decode), one shared weight store.

A `Node` is an SSA value: it has a unique name, an op, operand value names, attributes and the
type of the value it produces. A `Graph` lists its inputs (typed), its nodes in a valid order
and its named outputs; its named dims ("T", "P", "S") have ranges and may be bound by constraints
such as `P+T <= 65536`. A `Program` is the entry points plus the weight store and metadata
(architecture, dtype, the cache layout).

Entry-point convention (functional KV cache; the same names in and out):

    prefill(tokens i64[B,T], positions i64[T], cache.{i}.k/v [B,Hkv,P,D])
        -> logits f32[B,T,V], cache.{i}.k/v [B,Hkv,P+T,D]
    decode(tokens i64[B,1], positions i64[1], cache.{i}.k/v [B,Hkv,S,D])
        -> logits f32[B,1,V], cache.{i}.k/v [B,Hkv,S+1,D]
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any

from arkinfer.ir.errors import IRError
from arkinfer.ir.ops import SPECS, Op
from arkinfer.ir.types import TensorType
from arkinfer.ir.weights import WeightStore

ENTRY_POINTS = ("prefill", "decode")


@dataclass
class Input:
    name: str
    type: TensorType


@dataclass
class Node:
    """`name = op(inputs...) {attrs} : type`; `source` is the nn.Module path it was lowered from."""

    name: str
    op: Op
    inputs: list[str]
    attrs: dict[str, Any]
    type: TensorType
    source: str | None = None

    def weight_refs(self) -> list[str]:
        """Names of the store weights this node reads (its weight attributes that are set)."""
        spec = SPECS.get(self.op)
        if spec is None:
            return []
        return [self.attrs[a] for a in spec.weight_attrs if self.attrs.get(a) is not None]


@dataclass
class Graph:
    name: str
    inputs: list[Input]
    nodes: list[Node]
    outputs: dict[str, str]  # output name -> value name (ordered)
    dims: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> inclusive range
    constraints: list[tuple[str, int]] = field(default_factory=list)  # (dim expr, upper bound)

    def types(self) -> dict[str, TensorType]:
        """Every value's type: inputs and nodes."""
        out = {i.name: i.type for i in self.inputs}
        out.update((n.name, n.type) for n in self.nodes)
        return out

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise IRError(f"graph '{self.name}' has no node '{name}'")

    def users(self) -> dict[str, list[Node]]:
        """Value name -> nodes that read it."""
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                out.setdefault(i, []).append(n)
        return out

    def fresh_name(self, prefix: str, reserved: set[str] | None = None) -> str:
        """A value name starting with `prefix` used by no input, node or name in `reserved`."""
        taken = {i.name for i in self.inputs} | {n.name for n in self.nodes} | (reserved or set())
        for k in itertools.count():
            name = f"{prefix}{k}"
            if name not in taken:
                return name
        raise AssertionError("unreachable")

    def weight_refs(self) -> set[str]:
        return {w for n in self.nodes for w in n.weight_refs()}

    def copy(self) -> Graph:
        return Graph(self.name, [Input(i.name, i.type) for i in self.inputs],
                     [Node(n.name, n.op, list(n.inputs), copy.deepcopy(n.attrs), n.type, n.source)
                      for n in self.nodes],
                     dict(self.outputs), dict(self.dims), list(self.constraints))


@dataclass
class Program:
    """Entry points sharing one weight store. `meta` is JSON-able (see trace.program_meta)."""

    entries: dict[str, Graph]
    weights: WeightStore
    meta: dict[str, Any] = field(default_factory=dict)

    def entry(self, name: str) -> Graph:
        if name not in self.entries:
            raise IRError(f"the program has no entry point {name!r}",
                          hint=f"entry points: {', '.join(self.entries)}")
        return self.entries[name]

    def copy(self) -> Program:
        """Graphs copied, weights shared (a new store dict holding the same Weight objects)."""
        return Program({k: g.copy() for k, g in self.entries.items()}, self.weights.copy(),
                       copy.deepcopy(self.meta))

    @property
    def num_layers(self) -> int:
        return len(self.meta.get("cache", []))

    def cache_names(self) -> list[tuple[str, str]]:
        """(k, v) input/output names of every layer's cache, in layer order."""
        return [tuple(pair) for pair in self.meta.get("cache", [])]  # type: ignore[misc]
