"""ArkInfer IR -> a MIL function (iOS 18 opset) with the KV cache as Core ML state.

    fn, layers = build_function(program, src, entry="prefill", context=4096, act="fp16")

Both entry points are emitted from the IR's `prefill` graph (T new tokens over the cache):

    prefill: tokens int32 [1, T] (T in 1 .. context, flexible), start int32 [1]
    decode:  tokens int32 [1, 1] (fully static: what the Neural Engine runs), start int32 [1]
    states:  k_cache_{i}, v_cache_{i} fp16 [1, Hkv, context, D] (ct.StateType), one pair a layer
    output:  logits fp32 [1, T, V]

`start` is the number of tokens already in the cache; the call writes positions
start .. start + T - 1 of every state (`slice_update` + `coreml_update_state`) and attends over
the whole state with a causal mask on absolute positions, so stale entries past start + T are
never read. The IR's functional-cache pattern `concat(cache.i.k, k_new)` is what marks a state
write; the IR's cache outputs are dropped (the state is the cache).

Ops are emitted from `CONVERSIONS` (IR op -> emitter); an op missing there is reported by
`unconverted_ops` before anything is built (preflight.py calls it at plan time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import Function, Var, types
from coremltools.converters.mil.mil.program import get_new_symbol

from arkinfer.errors import NotAvailableError
from arkinfer.ir import dims
from arkinfer.ir.graph import Node, Program
from arkinfer.ir.ops import Op
from arkinfer.ops.infllmv2.config import SparseConfig

from . import composites as C
from .infllmv2 import infllmv2_attention
from .weights import SourceWeights, blockwise_args, mil_name

def _opset():
    import coremltools as ct

    return ct.target.iOS18


class _Emitter:
    """Walks the IR prefill graph inside a MIL Function context."""

    def __init__(self, program: Program, src: SourceWeights, act: str, context: int,
                 start: Var, tokens: Var, states: dict[str, Var], t: Var | int) -> None:
        self.program, self.src, self.act, self.context = program, src, act, context
        self.start, self.tokens, self.states, self.t = start, tokens, states, t
        self.values: dict[str, Var] = {}
        self.consts: dict[str, Var] = {}
        self.layers: dict[str, str] = {}
        self.pos = C.positions(start, t)
        self.rope_memo: dict[Any, tuple[Var, Var]] = {}
        self.cache_inputs = {name: (i, kind) for i, pair in enumerate(program.cache_names())
                             for name, kind in zip(pair, ("k", "v"))}

    # ------------------------------------------------------------------ weights
    def _np_act(self) -> type:
        return np.float16 if self.act == "fp16" else np.float32

    def float_weight(self, name: str, dtype: str | None = None) -> Var:
        """A float weight as a const in `dtype` (default: the compute dtype), one const a name."""
        dtype = dtype or self.act
        key = f"{name}:{dtype}"
        if key not in self.consts:
            arr = (self.program.weights.tensor(name).float().numpy() if name.startswith("rope.")
                   else self.src.tensor(name))
            np_dtype = np.float16 if dtype == "fp16" else np.float32
            self.consts[key] = mb.const(val=arr.astype(np_dtype), name=mil_name(name))
        return self.consts[key]

    def linear_weight(self, name: str) -> Var:
        shape = tuple(self.program.weights[name].type.shape)
        qw = self.src.quantised(name, shape)
        if qw is None:
            return self.float_weight(name)
        if name not in self.consts:
            args = blockwise_args(qw, self.act)
            self.consts[name] = mb.constexpr_blockwise_shift_scale(**args, name=mil_name(name))
            kind = ("int" if qw.sym else "uint") + str(qw.bits)
            group = qw.group_size if qw.group_size > 0 else qw.in_features
            self.layers[name.removesuffix(".weight")] = (
                f"constexpr_blockwise_shift_scale {kind} block [1,{group}] {self.act} scales"
                f"{'' if qw.sym else ' + offset'} ({self.src.format})")
        return self.consts[name]

    # ------------------------------------------------------------------ helpers
    def dim(self, d: Any) -> int:
        """A reshape dim: an int, or -1 for the one symbolic (token-count) dim."""
        expr = dims.as_sympy(d)
        return int(expr) if expr.is_Integer else -1

    def total(self) -> Var:
        return mb.add(x=self.start, y=self.t)                           # [1] int32

    def rope(self, n: Node, x: Var) -> Var:
        a = n.attrs
        key = (a["inv_freq"], a.get("inv_freq_long"), a.get("long_after"), a["scale"])
        if key not in self.rope_memo:
            inv = self.float_weight(a["inv_freq"], "fp32")
            if a.get("inv_freq_long") is not None:
                longer = mb.greater(x=self.total(), y=np.int32(int(a["long_after"])))
                inv = mb.select(cond=longer, a=self.float_weight(a["inv_freq_long"], "fp32"),
                                b=inv)
            self.rope_memo[key] = C.rope_tables(self.pos, inv, float(a["scale"]))
        cos, sin = self.rope_memo[key]
        return C.rope(x, cos, sin, int(n.type.shape[-1]))

    def attention(self, n: Node, q: Var, k: Var, v: Var) -> Var:
        sc = n.attrs.get("sparse_config")
        scale = float(n.attrs["scale"])
        if sc:
            return infllmv2_attention(q, k, v, self.pos, self.start, self.t,
                                      SparseConfig.from_dict(sc), scale, self.act)
        return C.attention(q, k, v, self.pos, scale, self.act)

    def concat(self, n: Node, xs: list[Var]) -> Var:
        first = n.inputs[0]
        if first in self.cache_inputs:  # the functional cache: write the new entries to the state
            layer, kind = self.cache_inputs[first]
            state = self.states[f"{kind}_cache_{layer}"]
            new = C.as_dtype(xs[1], "fp16")
            begin = mb.concat(values=[np.array([0, 0], np.int32), self.start,
                                      np.array([0], np.int32)], axis=0)
            end = mb.add(x=begin, y=mb.shape(x=new))
            full = mb.slice_update(x=mb.read_state(input=state), update=new, begin=begin, end=end)
            mb.coreml_update_state(state=state, value=full)
            return full
        return mb.concat(values=xs, axis=int(n.attrs["dim"]))

    def node(self, n: Node) -> Var:
        emit = CONVERSIONS.get(n.op)
        if emit is None:
            raise NotAvailableError(f"%{n.name}: IR op {n.op} has no Core ML conversion",
                                    hint=f"converted ops: {', '.join(sorted(CONVERSIONS))}")
        # cache inputs have no value: `concat` reads the layer's state instead
        return emit(self, n, [self.values.get(i) for i in n.inputs])


def _cast(e: _Emitter, n: Node, x: list[Var]) -> Var:
    if n.type.dtype.is_float:  # every float activation is the compute dtype
        return C.as_dtype(x[0], e.act)
    return C.as_dtype(x[0], "int32")


def _transpose(e: _Emitter, n: Node, x: list[Var]) -> Var:
    perm = list(range(n.type.rank))
    perm[n.attrs["dim0"]], perm[n.attrs["dim1"]] = perm[n.attrs["dim1"]], perm[n.attrs["dim0"]]
    return mb.transpose(x=x[0], perm=perm)


def _slice(e: _Emitter, n: Node, x: list[Var]) -> Var:
    rank, dim = x[0].rank, int(n.attrs["dim"]) % x[0].rank
    begin, end = [0] * rank, [0] * rank
    begin[dim], end[dim] = int(n.attrs["start"]), int(n.attrs["end"])
    return mb.slice_by_index(x=x[0], begin=begin, end=end,
                             end_mask=[i != dim for i in range(rank)])


def _linear(e: _Emitter, n: Node, x: list[Var]) -> Var:
    bias = n.attrs.get("bias")
    return mb.linear(x=x[0], weight=e.linear_weight(n.attrs["weight"]),
                     bias=e.float_weight(bias) if bias else None)


def _scalar(op: Callable) -> Callable:
    def emit(e: _Emitter, n: Node, x: list[Var]) -> Var:
        return op(x=x[0], y=e._np_act()(n.attrs["value"]))
    return emit


Emitter = Callable[[_Emitter, Node, list[Var]], Var]
CONVERSIONS: dict[Op, Emitter] = {
    Op.EMBED: lambda e, n, x: mb.gather(x=e.float_weight(n.attrs["weight"]), indices=x[0],
                                        axis=0),
    Op.LINEAR: _linear,
    Op.RMS_NORM: lambda e, n, x: C.rms_norm(x[0], e.src.tensor(n.attrs["weight"]),
                                            float(n.attrs["eps"]), e.act),
    Op.ROPE: lambda e, n, x: e.rope(n, x[0]),
    Op.ATTENTION: lambda e, n, x: e.attention(n, *x),
    Op.ADD: lambda e, n, x: mb.add(x=x[0], y=x[1]),
    Op.MUL: lambda e, n, x: mb.mul(x=x[0], y=x[1]),
    Op.MUL_SCALAR: _scalar(mb.mul),
    Op.DIV_SCALAR: _scalar(mb.real_div),
    Op.SILU: lambda e, n, x: mb.silu(x=x[0]),
    Op.CAST: _cast,
    Op.RESHAPE: lambda e, n, x: mb.reshape(x=x[0], shape=[e.dim(d) for d in n.attrs["shape"]]),
    Op.TRANSPOSE: _transpose,
    Op.CONCAT: lambda e, n, x: e.concat(n, x),
    Op.SLICE: _slice,
}
# Not converted: rope_table (made by the fold_rope_tables pass, which this backend does not run:
# the cos/sin tables are computed from positions in fp32 instead of a [max_len, D] constant).


def unconverted_ops(program: Program) -> dict[str, list[str]]:
    """IR op -> nodes (first few) of `program` that have no conversion, plus attributes the
    conversion cannot take (`attention` with sparse_config.use_nope)."""
    out: dict[str, list[str]] = {}
    for graph in program.entries.values():
        for n in graph.nodes:
            if n.op not in CONVERSIONS:
                out.setdefault(str(n.op), []).append(f"{graph.name}:%{n.name}")
            elif n.op == Op.ATTENTION and (n.attrs.get("sparse_config") or {}).get("use_nope"):
                out.setdefault("attention(sparse_config.use_nope=true)", []).append(
                    f"{graph.name}:%{n.name}")
    return out


def build_function(program: Program, src: SourceWeights, *, entry: str, context: int,
                   act: str) -> tuple[Function, dict[str, str]]:
    """The MIL function of `entry` ("prefill": flexible T, "decode": T = 1) and the per-linear
    storage notes (module docstring)."""
    graph = program.entry("prefill")
    meta = program.meta
    hkv, d = int(meta["num_kv_heads"]), int(meta["head_dim"])
    t_dim = get_new_symbol() if entry == "prefill" else 1
    inputs: dict[str, Any] = {
        "tokens": mb.placeholder(shape=(1, t_dim), dtype=types.int32),
        "start": mb.placeholder(shape=(1,), dtype=types.int32)}
    for i in range(program.num_layers):
        for kind in ("k", "v"):
            inputs[f"{kind}_cache_{i}"] = mb.state_tensor_placeholder(
                shape=(1, hkv, context, d), dtype=types.fp16)
    with Function(inputs, opset_version=_opset()) as fn:
        tokens = fn.inputs["tokens"]
        t = mb.squeeze(x=mb.slice_by_index(x=mb.shape(x=tokens), begin=[1], end=[2]), axes=[0]) \
            if entry == "prefill" else 1
        states = {k: v for k, v in fn.inputs.items() if "_cache_" in k}
        em = _Emitter(program, src, act, context, fn.inputs["start"], tokens, states, t)
        for inp in graph.inputs:
            if inp.name == "tokens":
                em.values[inp.name] = tokens
            elif inp.name == "positions":
                em.values[inp.name] = em.pos
        for n in graph.nodes:
            em.values[n.name] = em.node(n)
        logits = em.values[graph.outputs["logits"]]
        fn.set_outputs([mb.cast(x=logits, dtype="fp32", name="logits")
                        if C._dtype_name(logits) != "fp32" else mb.identity(x=logits,
                                                                             name="logits")])
    return fn, em.layers
