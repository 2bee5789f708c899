"""Type inference: the output type of every op from its operand types, attributes and weights.

Lowering uses it to type new nodes, passes to type rewritten ones, and the verifier re-runs it on
every node and compares with the declared type. A violated rule raises IRVerifyError with a short
message; callers add the node's name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from arkinfer.ir import dims
from arkinfer.ir.dims import Dim
from arkinfer.ir.errors import IRVerifyError
from arkinfer.ir.ops import Op
from arkinfer.ir.types import DType, TensorType

WeightTypes = Callable[[str], TensorType]
_INT = (DType.I64, DType.I32)


def _need(ok: bool, problem: str) -> None:
    if not ok:
        raise IRVerifyError(problem)


def _same(a: Dim, b: Dim, what: str) -> None:
    _need(dims.equal(a, b), f"{what}: {a} != {b}")


def _promote(a: DType, b: DType) -> DType:
    return DType.from_torch(torch.promote_types(a.torch, b.torch))


def _broadcast(a: TensorType, b: TensorType) -> tuple[Dim, ...]:
    out: list[Dim] = []
    for i in range(1, max(a.rank, b.rank) + 1):
        x = a.shape[-i] if i <= a.rank else 1
        y = b.shape[-i] if i <= b.rank else 1
        if x == 1:
            out.append(y)
        elif y == 1 or dims.equal(x, y):
            out.append(x)
        else:
            raise IRVerifyError(f"shapes {a} and {b} do not broadcast (dim -{i}: {x} vs {y})")
    return tuple(reversed(out))


def _axis(dim: int, rank: int, what: str = "dim") -> int:
    _need(-rank <= dim < rank, f"{what}={dim} is out of range for rank {rank}")
    return dim % rank


def _rope(x: TensorType, pos: TensorType, half: Dim, what: str, a: dict[str, Any],
          wt: WeightTypes, long_key: str) -> TensorType:
    _need(x.rank == 4 and x.dtype.is_float, f"x must be float [B,H,T,D], got {x}")
    _need(pos.rank == 1 and pos.dtype in _INT, f"positions must be int [T], got {pos}")
    _same(pos.shape[0], x.shape[2], "positions length vs T of x")
    _same(half, x.shape[3], f"{what} vs head_dim D of x")
    if a.get(long_key) is not None:
        _need(wt(a[long_key]).shape == wt(a[long_key.removesuffix("_long")]).shape,
              f"{long_key} and {long_key.removesuffix('_long')} differ in shape")
    return x


def infer_type(op: Op, ins: list[TensorType], a: dict[str, Any], wt: WeightTypes) -> TensorType:
    """The type `op` produces; raises IRVerifyError naming the broken rule."""
    if op == Op.EMBED:
        w = wt(a["weight"])
        _need(ins[0].dtype in _INT, f"ids must be integer, got {ins[0]}")
        _need(w.rank == 2, f"embedding weight must be [V, H], got {w}")
        return TensorType(w.dtype, ins[0].shape + (w.shape[1],))
    if op == Op.LINEAR:
        x, w = ins[0], wt(a["weight"])
        _need(w.rank == 2 and x.rank >= 1, f"linear needs x [.., K] and weight [N, K], got {x}, {w}")
        _same(x.shape[-1], w.shape[1], "in_features of x vs weight [N, K]")
        _need(x.dtype == w.dtype, f"x is {x.dtype} but weight '{a['weight']}' is {w.dtype}")
        if a.get("bias") is not None:
            b = wt(a["bias"])
            _need(b.rank == 1 and dims.equal(b.shape[0], w.shape[0]), f"bias {b} vs weight {w}")
        return x.with_shape(x.shape[:-1] + (w.shape[0],))
    if op == Op.RMS_NORM:
        x, w = ins[0], wt(a["weight"])
        _need(w.rank == 1, f"rms_norm weight must be [H], got {w}")
        _same(x.shape[-1], w.shape[0], "last dim of x vs norm weight")
        return x.with_dtype(_promote(x.dtype, w.dtype))
    if op == Op.ROPE:
        w = wt(a["inv_freq"])
        _need(w.rank == 1 and w.dtype.is_float, f"inv_freq must be float [D/2], got {w}")
        return _rope(ins[0], ins[1], dims.add(w.shape[0], w.shape[0]), "2 * len(inv_freq)", a, wt,
                     "inv_freq_long")
    if op == Op.ROPE_TABLE:
        w = wt(a["table"])
        _need(w.rank == 2 and w.dtype.is_float, f"rope table must be float [Pmax, D], got {w}")
        return _rope(ins[0], ins[1], w.shape[1], "table width", a, wt, "table_long")
    if op == Op.ATTENTION:
        q, k, v = ins
        _need(q.rank == k.rank == v.rank == 4, f"attention needs rank-4 q, k, v, got {q}, {k}, {v}")
        _need(k.same_as(v), f"k {k} and v {v} differ")
        _need(q.dtype == k.dtype, f"q is {q.dtype} but k is {k.dtype}")
        _same(q.shape[0], k.shape[0], "batch of q vs k")
        _same(q.shape[3], k.shape[3], "head_dim of q vs k")
        hq, hkv = q.shape[1], k.shape[1]
        _need(isinstance(hq, int) and isinstance(hkv, int) and hkv > 0 and hq % hkv == 0,
              f"query heads {hq} must be a multiple of kv heads {hkv}")
        _need(a.get("sparse_config") is None or isinstance(a["sparse_config"], dict),
              "sparse_config must be a dict or null")
        return q
    if op in (Op.ADD, Op.MUL):
        return TensorType(_promote(ins[0].dtype, ins[1].dtype), _broadcast(ins[0], ins[1]))
    if op in (Op.MUL_SCALAR, Op.DIV_SCALAR, Op.SILU):
        _need(ins[0].dtype.is_float, f"{op.value} needs a float tensor, got {ins[0]}")
        return ins[0]
    if op == Op.CAST:
        return ins[0].with_dtype(DType.parse(a["dtype"]))
    if op == Op.RESHAPE:
        x, shape = ins[0], tuple(dims.canon(d) for d in a["shape"])
        _need(dims.equal(dims.from_sympy(dims.product(x.shape)), dims.from_sympy(dims.product(shape))),
              f"reshape of {x} to [{','.join(map(str, shape))}] changes the element count")
        return x.with_shape(shape)
    if op == Op.TRANSPOSE:
        x = ins[0]
        d0, d1 = _axis(a["dim0"], x.rank), _axis(a["dim1"], x.rank)
        shape = list(x.shape)
        shape[d0], shape[d1] = shape[d1], shape[d0]
        return x.with_shape(shape)
    if op == Op.CONCAT:
        first = ins[0]
        d = _axis(a["dim"], first.rank)
        for t in ins[1:]:
            _need(t.rank == first.rank and t.dtype == first.dtype, f"concat of {first} and {t}")
            for i in range(first.rank):
                if i != d:
                    _same(t.shape[i], first.shape[i], f"concat dim {i}")
        return first.with_shape(first.shape[:d] + (dims.add(*[t.shape[d] for t in ins]),)
                                + first.shape[d + 1:])
    if op == Op.SLICE:
        x = ins[0]
        d = _axis(a["dim"], x.rank)
        size, start, end = x.shape[d], a["start"], a["end"]
        _need(isinstance(size, int), f"slice along symbolic dim {size} is not supported")
        _need(0 <= start <= end <= size, f"slice [{start}:{end}] out of range for size {size}")
        return x.with_shape(x.shape[:d] + (end - start,) + x.shape[d + 1:])
    raise IRVerifyError(f"no type rule for op {op!r}")
