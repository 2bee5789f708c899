"""Lowering from an ExportedProgram (ATen + arkinfer custom ops) to one IR graph.

Every call in the exported graph is either lowered by a handler in `HANDLERS`, recognised as a
symbolic-size computation (its value is a dim expression), an identity (`contiguous`, a same-dtype
`to`, `x * 1`), or an assertion export inserts. Anything else is collected and reported in one
UnsupportedOpError naming each ATen op and the module and source line it came from: lowering
never skips an op silently. Each lowered node's type comes from the IR's own type rules and is
checked against the shape torch.export recorded for it.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from numbers import Number
from typing import Any

import torch
from torch import fx

from arkinfer.ir import (
    _trace_ops,  # noqa: F401 - registers arkinfer_ir::longrope_select
    dims,
)
from arkinfer.ir.errors import IRError, TraceError, UnsupportedOpError
from arkinfer.ir.graph import Graph, Input, Node
from arkinfer.ir.infer import infer_type
from arkinfer.ir.ops import Op
from arkinfer.ir.types import DType, TensorType
from arkinfer.ir.weights import WeightStore
from arkinfer.ops import attention as _attention  # noqa: F401 - registers the arkinfer ops
from arkinfer.ops import norm as _norm  # noqa: F401
from arkinfer.ops import rope as _rope_op  # noqa: F401

aten = torch.ops.aten


@dataclass(frozen=True)
class Value:
    name: str


@dataclass(frozen=True)
class WeightRef:
    name: str


@dataclass(frozen=True)
class Sym:
    dim: dims.Dim


@dataclass(frozen=True)
class Switch:  # LongRoPE: short / long inv_freq chosen by `length > threshold`
    short: str
    long: str
    length: dims.Dim
    threshold: int


@dataclass
class EntrySpec:
    """How to name what torch.export produced for one entry point."""

    entry: str
    input_names: list[str]  # user inputs, flattened in export order
    output_names: list[str]  # user outputs, flattened
    input_dims: dict[str, dict[int, str]]  # input name -> {axis: dim name}
    dims: dict[str, tuple[int, int]]
    constraints: list[tuple[str, int]]
    weight_names: dict[str, str]  # export parameter/buffer target -> store name
    sparse_config: dict[str, Any] | None = None
    module_prefix: str = "model."


_SKIP = {aten._assert_tensor_metadata.default, aten._assert_scalar.default,
         aten.sym_constrain_range_for_size.default}
_SYM = {aten.sym_size.int, operator.add, operator.sub, operator.mul, operator.neg,
        operator.floordiv}
_IDENTITY = {aten.contiguous.default, aten.clone.default, aten.alias.default, aten.detach.default,
             aten.detach_.default}
_CASTS = {aten.to.dtype, aten._to_copy.default, aten.to.dtype_layout}


class _Lowering:
    def __init__(self, ep: torch.export.ExportedProgram, spec: EntrySpec, store: WeightStore):
        self.ep, self.spec, self.store = ep, spec, store
        self.env: dict[fx.Node, Any] = {}
        self.types: dict[str, TensorType] = {}
        self.nodes: list[Node] = []
        self.inputs: list[Input] = []
        self.symbols: dict[Any, Any] = {}
        self.unsupported: list[tuple[str, str]] = []

    # -- helpers used by handlers --------------------------------------------------------------
    def value(self, arg: Any, node: fx.Node) -> str:
        got = self.env.get(arg) if isinstance(arg, fx.Node) else None
        if isinstance(got, Value):
            return got.name
        what = f"the parameter '{got.name}'" if isinstance(got, WeightRef) else repr(arg)
        raise _Unsupported(f"{node.target} applied to {what} (the IR takes weights only as "
                           "the weight of embed/linear/rms_norm/rope)")

    def weight(self, arg: Any, node: fx.Node) -> str:
        got = self.env.get(arg) if isinstance(arg, fx.Node) else None
        if isinstance(got, WeightRef):
            return got.name
        raise _Unsupported(f"{node.target} with a computed (non-parameter) weight operand")

    def emit(self, node: fx.Node, op: Op, inputs: list[str], **attrs: Any) -> Value:
        attrs = {k: v for k, v in attrs.items() if v is not None}
        t = infer_type(op, [self.types[i] for i in inputs], attrs, lambda n: self.store[n].type)
        expected = self.type_of(node.meta.get("val"))
        if expected is not None and not t.same_as(expected):
            raise IRError(f"lowering bug at {node.format_node()}: the IR types {op.value} as {t}, "
                          f"torch.export recorded {expected}", hint="report this with the model")
        name = node.name
        self.nodes.append(Node(name, op, inputs, attrs, t, self.source(node)[0] or None))
        self.types[name] = t
        return Value(name)

    def dim(self, size: Any) -> dims.Dim:
        if isinstance(size, int):
            return size
        expr = size.node.expr if isinstance(size, torch.SymInt) else size
        unknown = expr.free_symbols - set(self.symbols)
        if unknown:
            raise TraceError(f"size {expr} of entry '{self.spec.entry}' depends on {unknown}, which "
                             "is not one of the entry's named dims (a data-dependent shape?)",
                             hint="the IR supports shapes that depend on T, P, S only")
        return dims.from_sympy(expr.xreplace(self.symbols))

    def type_of(self, val: Any) -> TensorType | None:
        if not isinstance(val, torch.Tensor):
            return None
        return TensorType(DType.from_torch(val.dtype), tuple(self.dim(s) for s in val.shape))

    def source(self, node: fx.Node) -> tuple[str, str]:
        """(module path, 'Class at file:line `code`') of an FX node, as far as export recorded."""
        stack = node.meta.get("nn_module_stack") or {}
        path, cls = next(reversed(stack.values())) if stack else ("", "")
        path = path.removeprefix(self.spec.module_prefix.rstrip(".")).lstrip(".")
        if isinstance(cls, type):
            cls = f"{cls.__module__}.{cls.__qualname__}"
        frames = re.findall(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)',
                            node.meta.get("stack_trace") or "")
        where = f" at {frames[-1][0].rsplit('/', 1)[-1]}:{frames[-1][1]} `{frames[-1][2].strip()}`" \
            if frames else ""
        return path, f"{cls}{where}"

    # -- the walk ------------------------------------------------------------------------------
    def run(self) -> Graph:
        spec, sig = self.spec, self.ep.graph_signature
        placeholders = [n for n in self.ep.graph.nodes if n.op == "placeholder"]
        user = iter(spec.input_names)
        user_nodes: list[tuple[str, fx.Node]] = []
        for node, ispec in zip(placeholders, sig.input_specs):
            kind = ispec.kind.name
            if kind in ("PARAMETER", "BUFFER"):
                self.env[node] = WeightRef(spec.weight_names[ispec.target])
            elif kind == "USER_INPUT":
                user_nodes.append((next(user), node))
            else:
                raise TraceError(f"entry '{spec.entry}': the model creates the tensor constant "
                                 f"'{ispec.target}' inside forward ({self.source(node)[1]})",
                                 hint="register it as a buffer so it lands in the weight store")
        for name, node in user_nodes:
            shape = node.meta["val"].shape
            for axis, dim_name in spec.input_dims.get(name, {}).items():
                size = shape[axis]
                if not isinstance(size, torch.SymInt) or not size.node.expr.is_Symbol:
                    raise TraceError(f"entry '{spec.entry}': torch.export specialised axis {axis} of "
                                     f"'{name}' ({dim_name}) to {size}", hint="some code in the "
                                     "model branches on the sequence or cache length; run with "
                                     "TORCH_LOGS=+dynamic to see the guard")
                self.symbols[size.node.expr] = dims.parse(dim_name)
        for name, node in user_nodes:
            t = self.type_of(node.meta["val"])
            self.inputs.append(Input(name, t))
            self.types[name] = t
            self.env[node] = Value(name)
        outputs: dict[str, str] = {}
        for node in self.ep.graph.nodes:
            if node.op == "call_function":
                self._call(node)
            elif node.op == "output":
                flat = list(node.args[0])
                if len(flat) != len(spec.output_names):
                    raise TraceError(f"entry '{spec.entry}' returns {len(flat)} tensors, expected "
                                     f"{len(spec.output_names)} ({spec.output_names})")
                if not self.unsupported:
                    for out_name, arg in zip(spec.output_names, flat):
                        got = self.env.get(arg)
                        if not isinstance(got, Value):
                            raise TraceError(f"output '{out_name}' is not a tensor computed by "
                                             f"the graph ({got})")
                        outputs[out_name] = got.name
        if self.unsupported:
            self._raise_unsupported()
        return Graph(spec.entry, self.inputs, self.nodes, outputs, dict(spec.dims),
                     list(spec.constraints))

    def _call(self, node: fx.Node) -> None:
        target = node.target
        if target in _SKIP:
            return
        if target in _SYM or isinstance(node.meta.get("val"), torch.SymInt):
            if target not in _SYM:
                self.unsupported.append((str(target), self.describe(node)))
                return
            self.env[node] = Sym(self.dim(node.meta["val"]))
            return
        handler = HANDLERS.get(target)
        if handler is None:
            self.unsupported.append((str(target), self.describe(node)))
            return
        if any(isinstance(a, fx.Node) and a not in self.env for a in node.all_input_nodes):
            return  # an operand could not be lowered; that op is already reported
        try:
            self.env[node] = handler(self, node)
        except _Unsupported as exc:
            self.unsupported.append((f"{target} ({exc})", self.describe(node)))

    def describe(self, node: fx.Node) -> str:
        path, where = self.source(node)
        return f"in {path or '<top level>'} ({where.strip()})"

    def _raise_unsupported(self) -> None:
        by_op: dict[str, list[str]] = {}
        for op, where in self.unsupported:
            by_op.setdefault(op, []).append(where)
        lines = [f"{op}: {len(ws)} use(s), first {ws[0]}" for op, ws in by_op.items()]
        raise UnsupportedOpError(
            f"entry '{self.spec.entry}': the IR lowering does not support "
            f"{', '.join(by_op)}:\n  " + "\n  ".join(lines),
            hint="rewrite that code with supported ops, or add a handler to HANDLERS in "
            f"arkinfer/ir/lower_aten.py; supported: {', '.join(sorted(map(str, HANDLERS)))}")


class _Unsupported(Exception):
    """A known op used in a way the IR cannot express (reported like an unknown op)."""


def _scalar_or_tensor(lw: _Lowering, node: fx.Node, tensor_op: Op, scalar_op: Op | None) -> Any:
    a, b = node.args[0], node.args[1]
    if isinstance(a, Number) and tensor_op == Op.MUL:
        a, b = b, a
    if isinstance(b, Number) and not isinstance(b, bool):
        x = lw.value(a, node)
        if b == 1 and lw.types[x].dtype.is_float:
            return Value(x)  # x * 1 and x / 1 are exact identities
        if scalar_op is None:
            raise _Unsupported("with a scalar operand")
        return lw.emit(node, scalar_op, [x], value=float(b))
    if tensor_op is None:
        raise _Unsupported("of two tensors")
    if node.kwargs.get("alpha", 1) != 1:
        raise _Unsupported("with alpha != 1")
    return lw.emit(node, tensor_op, [lw.value(a, node), lw.value(b, node)])


def _reshape(lw: _Lowering, node: fx.Node) -> Any:
    x = lw.value(node.args[0], node)
    shape = lw.type_of(node.meta["val"]).shape
    if lw.types[x].shape == shape:
        return Value(x)
    return lw.emit(node, Op.RESHAPE, [x], shape=list(shape))


def _cast(lw: _Lowering, node: fx.Node) -> Any:
    x = lw.value(node.args[0], node)
    dtype = DType.from_torch(node.meta["val"].dtype)
    return Value(x) if lw.types[x].dtype == dtype else lw.emit(node, Op.CAST, [x], dtype=dtype.value)


def _slice(lw: _Lowering, node: fx.Node) -> Any:
    x = lw.value(node.args[0], node)
    args = list(node.args[1:]) + [None] * 4
    dim, start, end, step = args[0] or 0, args[1], args[2], 1 if args[3] is None else args[3]
    rank = lw.types[x].rank
    size = lw.types[x].shape[dim % rank]
    if step != 1 or not isinstance(size, int) or not all(
            v is None or isinstance(v, int) for v in (start, end)):
        raise _Unsupported("with a step, or along a symbolic dim")
    start, end = slice(start, end).indices(size)[:2]
    return lw.emit(node, Op.SLICE, [x], dim=dim % rank, start=start, end=max(start, end))


def _rope(lw: _Lowering, node: fx.Node) -> Any:
    x, pos, freq, scale = node.args
    f = lw.env.get(freq)
    common = {"scale": float(scale)}
    if isinstance(f, WeightRef):
        return lw.emit(node, Op.ROPE, [lw.value(x, node), lw.value(pos, node)], inv_freq=f.name,
                       **common)
    if isinstance(f, Switch):
        return lw.emit(node, Op.ROPE, [lw.value(x, node), lw.value(pos, node)], inv_freq=f.short,
                       inv_freq_long=f.long, long_after=f.threshold, length=f.length, **common)
    raise _Unsupported("with frequencies computed in the graph (pass a buffer)")


def _switch(lw: _Lowering, node: fx.Node) -> Any:
    short, long, length, threshold = node.args
    sym = lw.env.get(length)
    size = sym.dim if isinstance(sym, Sym) else length
    return Switch(lw.weight(short, node), lw.weight(long, node), dims.canon(size), int(threshold))


def _transpose(lw: _Lowering, node: fx.Node) -> Any:
    x = lw.value(node.args[0], node)
    rank = lw.types[x].rank
    return lw.emit(node, Op.TRANSPOSE, [x], dim0=node.args[1] % rank, dim1=node.args[2] % rank)


def _cat(lw: _Lowering, node: fx.Node) -> Any:
    xs = [lw.value(a, node) for a in node.args[0]]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    return Value(xs[0]) if len(xs) == 1 else lw.emit(node, Op.CONCAT, xs,
                                                     dim=dim % lw.types[xs[0]].rank)


def _linear(lw: _Lowering, node: fx.Node) -> Any:
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    return lw.emit(node, Op.LINEAR, [lw.value(node.args[0], node)],
                   weight=lw.weight(node.args[1], node),
                   bias=lw.weight(bias, node) if bias is not None else None)


HANDLERS = {
    aten.embedding.default: lambda lw, n: lw.emit(n, Op.EMBED, [lw.value(n.args[1], n)],
                                                  weight=lw.weight(n.args[0], n)),
    aten.linear.default: _linear,
    aten.view.default: _reshape,
    aten.reshape.default: _reshape,
    aten._unsafe_view.default: _reshape,
    aten.transpose.int: _transpose,
    aten.cat.default: _cat,
    aten.slice.Tensor: _slice,
    aten.mul.Tensor: lambda lw, n: _scalar_or_tensor(lw, n, Op.MUL, Op.MUL_SCALAR),
    aten.mul.Scalar: lambda lw, n: _scalar_or_tensor(lw, n, Op.MUL, Op.MUL_SCALAR),
    aten.div.Tensor: lambda lw, n: _scalar_or_tensor(lw, n, None, Op.DIV_SCALAR),
    aten.add.Tensor: lambda lw, n: _scalar_or_tensor(lw, n, Op.ADD, None),
    aten.silu.default: lambda lw, n: lw.emit(n, Op.SILU, [lw.value(n.args[0], n)]),
    **{c: _cast for c in _CASTS},
    **{i: (lambda lw, n: Value(lw.value(n.args[0], n))) for i in _IDENTITY},
    torch.ops.arkinfer.rms_norm.default: lambda lw, n: lw.emit(
        n, Op.RMS_NORM, [lw.value(n.args[0], n)], weight=lw.weight(n.args[1], n),
        eps=float(n.args[2])),
    torch.ops.arkinfer.rope.default: _rope,
    torch.ops.arkinfer.attention.default: lambda lw, n: lw.emit(
        n, Op.ATTENTION, [lw.value(a, n) for a in n.args[:3]], scale=float(n.args[3]),
        sparse_config=lw.spec.sparse_config),
    torch.ops.arkinfer_ir.longrope_select.default: _switch,
}


def lower(ep: torch.export.ExportedProgram, spec: EntrySpec, store: WeightStore) -> Graph:
    """The IR graph of one exported entry point; weights must already be in `store`."""
    return _Lowering(ep, spec, store).run()
