"""The interpreter: what every IR op means, in plain torch. Backends are compared with it.

`interpret(program, "prefill", {"tokens": ids, "positions": pos, "cache.0.k": k0, ...})` binds the
entry's named dims from the input shapes (T, P, S), checks ranges and constraints, runs the nodes in
order (checking each result against its declared type) and returns the named outputs. Values are
freed after their last use, so peak memory is the live set, not the whole graph.

Where an op is one of ArkInfer's custom ops (rms_norm, rope, attention) the interpreter calls that
op's reference implementation, so the IR and the reference model cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from arkinfer.errors import NotAvailableError
from arkinfer.ir import dims
from arkinfer.ir.errors import InterpretError
from arkinfer.ir.graph import Graph, Node, Program
from arkinfer.ir.ops import Op
from arkinfer.ir.types import DType, TensorType
from arkinfer.ir.weights import WeightStore
from arkinfer.ops import attention as _attention  # noqa: F401 - registers arkinfer::attention
from arkinfer.ops import norm as _norm  # noqa: F401
from arkinfer.ops import rope as _rope  # noqa: F401


class Context:
    """What kernels may read besides their operands: weights and the bound dim sizes."""

    def __init__(self, weights: WeightStore, env: dict[str, int]) -> None:
        self.weights, self.env = weights, env

    def w(self, name: str | None) -> Tensor | None:
        return None if name is None else self.weights.tensor(name)

    def long_variant(self, node: Node, key: str) -> Tensor:
        """The short or long LongRoPE weight of a rope node, chosen by the call's total length."""
        a = node.attrs
        if a.get("long_after") is not None and dims.evaluate(a["length"], self.env) > a["long_after"]:
            return self.weights.tensor(a[f"{key}_long"])
        return self.weights.tensor(a[key])


Kernel = Callable[[Node, list[Tensor], Context], Tensor]


def _rope_table(node: Node, x: Tensor, positions: Tensor, ctx: Context) -> Tensor:
    """x [B,H,T,D]; table [Pmax, D] = cat(cos(p * inv_freq), sin(p * inv_freq)) * scale."""
    table = ctx.long_variant(node, "table")
    if positions.numel() and int(positions.max()) >= table.shape[0]:
        raise InterpretError(f"%{node.name}: position {int(positions.max())} is beyond the RoPE table"
                             f" ({table.shape[0]} rows)", hint="positions must be < max positions")
    rows = table[positions]  # [T, D]
    half = rows.shape[-1] // 2
    cos = torch.cat([rows[:, :half], rows[:, :half]], dim=-1)
    sin = torch.cat([rows[:, half:], rows[:, half:]], dim=-1)
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


def _attention_kernel(node: Node, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Dense causal GQA; InfLLM v2 when sparse_config is set and S >= dense_len (or dense_len -1).

    The sparse path recompresses the whole cache on every call (state=None): the IR's functional
    cache carries K and V only, and the spec guarantees incremental == full recompression.
    """
    scale, sc = float(node.attrs["scale"]), node.attrs.get("sparse_config")
    total = k.shape[2]
    dense_len = int(sc.get("dense_len", 8192)) if sc else None
    if dense_len is None or (dense_len >= 0 and total < dense_len):
        return torch.ops.arkinfer.attention(q, k, v, scale)
    from arkinfer.ops.infllmv2 import SparseConfig, infllmv2_attention

    config = SparseConfig.from_dict(sc)
    if config.use_nope:
        raise NotAvailableError(f"%{node.name}: sparse_config.use_nope=true scores blocks with "
                                "pre-RoPE q/k, which the IR attention op does not carry yet",
                                hint="trace with dense=True, or use a config with use_nope=false")
    out, _state, _idx = infllmv2_attention(q, k, v, config=config, scale=scale,
                                           cache_len=total - q.shape[2], state=None)
    return out


KERNELS: dict[Op, Kernel] = {
    Op.EMBED: lambda n, a, c: F.embedding(a[0], c.w(n.attrs["weight"])),
    Op.LINEAR: lambda n, a, c: F.linear(a[0], c.w(n.attrs["weight"]), c.w(n.attrs.get("bias"))),
    Op.RMS_NORM: lambda n, a, c: torch.ops.arkinfer.rms_norm(a[0], c.w(n.attrs["weight"]),
                                                             float(n.attrs["eps"])),
    Op.ROPE: lambda n, a, c: torch.ops.arkinfer.rope(a[0], a[1], c.long_variant(n, "inv_freq"),
                                                     float(n.attrs["scale"])),
    Op.ROPE_TABLE: lambda n, a, c: _rope_table(n, a[0], a[1], c),
    Op.ATTENTION: lambda n, a, c: _attention_kernel(n, *a),
    Op.ADD: lambda n, a, c: a[0] + a[1],
    Op.MUL: lambda n, a, c: a[0] * a[1],
    Op.MUL_SCALAR: lambda n, a, c: a[0] * n.attrs["value"],
    Op.DIV_SCALAR: lambda n, a, c: a[0] / n.attrs["value"],
    Op.SILU: lambda n, a, c: F.silu(a[0]),
    Op.CAST: lambda n, a, c: a[0].to(DType(n.attrs["dtype"]).torch),
    Op.RESHAPE: lambda n, a, c: a[0].reshape([dims.evaluate(d, c.env) for d in n.attrs["shape"]]),
    Op.TRANSPOSE: lambda n, a, c: a[0].transpose(n.attrs["dim0"], n.attrs["dim1"]),
    Op.CONCAT: lambda n, a, c: torch.cat(a, dim=n.attrs["dim"]),
    Op.SLICE: lambda n, a, c: a[0].narrow(n.attrs["dim"], n.attrs["start"],
                                          n.attrs["end"] - n.attrs["start"]),
}


def bind_dims(graph: Graph, inputs: Mapping[str, Any]) -> dict[str, int]:
    """Sizes of the named dims, read from the inputs; checks names, dtypes, shapes and ranges."""
    names = [i.name for i in graph.inputs]
    unknown = sorted(set(inputs) - set(names))
    missing = [n for n in names if n not in inputs]
    if unknown or missing:
        raise InterpretError(f"entry '{graph.name}': missing inputs {missing}, unknown {unknown}",
                             hint=f"inputs are: {', '.join(names)}")
    env: dict[str, int] = {}
    for inp in graph.inputs:
        t = inputs[inp.name]
        if not isinstance(t, Tensor) or t.dim() != inp.type.rank or \
                t.dtype != inp.type.dtype.torch:
            got = TensorType.of(t) if isinstance(t, Tensor) else type(t).__name__
            raise InterpretError(f"entry '{graph.name}': input '{inp.name}' must be {inp.type}, "
                                 f"got {got}")
        for d, size in zip(inp.type.shape, t.shape):
            if isinstance(d, str) and dims.is_name(d) and d not in env:
                env[d] = int(size)
    for inp in graph.inputs:
        got = tuple(inputs[inp.name].shape)
        if got != inp.type.concrete(env):
            raise InterpretError(f"entry '{graph.name}': input '{inp.name}' has shape {list(got)}, "
                                 f"expected {inp.type} with {env}")
    for name, (lo, hi) in graph.dims.items():
        if name in env and not lo <= env[name] <= hi:
            raise InterpretError(f"entry '{graph.name}': {name}={env[name]} is outside [{lo}, {hi}]")
    for expr, bound in graph.constraints:
        if dims.evaluate(expr, env) > bound:
            raise InterpretError(f"entry '{graph.name}': {expr}={dims.evaluate(expr, env)} exceeds "
                                 f"{bound} with {env}", hint="the model supports at most "
                                 f"{bound} tokens (max positions, or its sliding window)")
    return env


def interpret(program: Program, entry: str, inputs: Mapping[str, Tensor],
              check_types: bool = True) -> dict[str, Tensor]:
    """Run entry point `entry` on named inputs; returns the named outputs (see graph.py)."""
    graph = program.entry(entry)
    env = bind_dims(graph, inputs)
    ctx = Context(program.weights, env)
    values: dict[str, Tensor] = {i.name: inputs[i.name] for i in graph.inputs}
    last_use = {name: i for i, node in enumerate(graph.nodes) for name in node.inputs}
    keep = set(graph.outputs.values())
    with torch.no_grad():
        for i, node in enumerate(graph.nodes):
            out = KERNELS[node.op](node, [values[n] for n in node.inputs], ctx)
            if check_types and (tuple(out.shape) != node.type.concrete(env)
                                or out.dtype != node.type.dtype.torch):
                raise InterpretError(f"%{node.name} ({node.op.value}) produced "
                                     f"{TensorType.of(out)}, declared {node.type} with {env}",
                                     hint="the op's type rule (ir/infer.py) and its kernel disagree")
            values[node.name] = out
            for name in node.inputs:
                if last_use.get(name) == i and name not in keep:
                    values.pop(name, None)
    return {out: values[v] for out, v in graph.outputs.items()}


def empty_cache(program: Program, entry: str = "prefill") -> list[tuple[Tensor, Tensor]]:
    """Zero-length cache tensors for every layer, typed as the entry's cache inputs."""
    graph = program.entry(entry)
    types = {i.name: i.type for i in graph.inputs}
    env = {d: 0 for d in graph.dims}

    def zeros(name: str) -> Tensor:
        return torch.zeros(types[name].concrete(env), dtype=types[name].dtype.torch)

    return [(zeros(k), zeros(v)) for k, v in program.cache_names()]


def step(program: Program, entry: str, tokens: Tensor, positions: Tensor,
         cache: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
    """The reference model's calling convention on the IR: (logits, new cache)."""
    names = program.cache_names()
    if len(cache) != len(names):
        raise InterpretError(f"cache has {len(cache)} layers, the program has {len(names)}")
    inputs = {"tokens": tokens, "positions": positions}
    for (k_name, v_name), (k, v) in zip(names, cache):
        inputs[k_name], inputs[v_name] = k, v
    out = interpret(program, entry, inputs)
    return out["logits"], [(out[k], out[v]) for k, v in names]
