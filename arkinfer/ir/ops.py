"""The IR's op set: one enum, grouped, each op with its operands and attributes written down as data.

Shapes: B batch, T new tokens, S keys in the cache after this call, H hidden, Hq / Hkv heads,
D head_dim, V vocab, I ffn width, Pmax = rows of a RoPE table (max positions).

Weights never flow through the graph as values: ops that read one name it in an attribute
(`weight="model.layers.0.mlp.up_proj.weight"`) and the program's weight store holds it, with
its quant annotation when it has one. Every op's meaning is defined by `arkinfer.ir.interpret`.

    group      op           operands                 attributes
    lookup     embed        ids [..] int             weight [V, H]                     -> [.., H]
    matmul     linear       x [.., K]                weight [N, K], bias? [N]          -> [.., N]
    norm       rms_norm     x [.., H]                weight [H], eps                   -> [.., H]
    position   rope         x [B,H,T,D], pos [T]     inv_freq [D/2], scale (+ long)    -> like x
    position   rope_table   x [B,H,T,D], pos [T]     table [Pmax, D] = cos|sin (+ long) -> like x
    attention  attention    q [B,Hq,T,D], k, v [B,Hkv,S,D]  scale, sparse_config?      -> like q
    binary     add, mul     a, b (broadcast)                                           -> a
    scalar     mul_scalar, div_scalar   x            value                             -> like x
    unary      silu         x                                                          -> like x
    unary      cast         x                        dtype                             -> x as dtype
    movement   reshape      x                        shape (dims, same element count)
    movement   transpose    x                        dim0, dim1
    movement   concat       x0, x1, ...              dim
    movement   slice        x                        dim, start, end (ints, step 1)

LongRoPE (`rope`/`rope_table` with the `*_long` attributes): when `length` (a dim expression, the
total length cache + new tokens of the call) exceeds `long_after`, the long table is used, else
the short one (MiniCPM's `original_max_position_embeddings` rule). `attention` with a
`sparse_config` is InfLLM v2: dense while S < dense_len, sparse from there on (docs/infllmv2.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class OpGroup(StrEnum):
    LOOKUP = "lookup"
    MATMUL = "matmul"
    NORM = "norm"
    POSITION = "position"
    ATTENTION = "attention"
    BINARY = "binary"
    SCALAR = "scalar"
    UNARY = "unary"
    MOVEMENT = "movement"


class Op(StrEnum):
    EMBED = "embed"
    LINEAR = "linear"
    RMS_NORM = "rms_norm"
    ROPE = "rope"
    ROPE_TABLE = "rope_table"
    ATTENTION = "attention"
    ADD = "add"
    MUL = "mul"
    MUL_SCALAR = "mul_scalar"
    DIV_SCALAR = "div_scalar"
    SILU = "silu"
    CAST = "cast"
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    CONCAT = "concat"
    SLICE = "slice"


class AttrKind(StrEnum):
    WEIGHT = "weight"  # name of a tensor in the weight store
    FLOAT = "float"
    INT = "int"
    DIM = "dim"  # int or dim expression ("P+T")
    DIMS = "dims"  # list of dims
    DTYPE = "dtype"  # an ir.types.DType value
    JSON = "json"  # a JSON object (dict) or null


@dataclass(frozen=True)
class Attr:
    name: str
    kind: AttrKind
    required: bool = True


@dataclass(frozen=True)
class OpSpec:
    """Operand names (`variadic`: one or more of the single operand) and attributes of an op."""

    group: OpGroup
    operands: tuple[str, ...]
    attrs: tuple[Attr, ...] = ()
    variadic: bool = False

    def attr(self, name: str) -> Attr | None:
        return next((a for a in self.attrs if a.name == name), None)

    @property
    def weight_attrs(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attrs if a.kind == AttrKind.WEIGHT)


_W, _F, _I, _D = AttrKind.WEIGHT, AttrKind.FLOAT, AttrKind.INT, AttrKind.DIM
# LongRoPE switch, optional on both rope forms; all three present or none (checked by verify).
_LONG = (Attr("long_after", _I, False), Attr("length", _D, False))

SPECS: dict[Op, OpSpec] = {
    Op.EMBED: OpSpec(OpGroup.LOOKUP, ("ids",), (Attr("weight", _W),)),
    Op.LINEAR: OpSpec(OpGroup.MATMUL, ("x",), (Attr("weight", _W), Attr("bias", _W, False))),
    Op.RMS_NORM: OpSpec(OpGroup.NORM, ("x",), (Attr("weight", _W), Attr("eps", _F))),
    Op.ROPE: OpSpec(OpGroup.POSITION, ("x", "positions"),
                    (Attr("inv_freq", _W), Attr("scale", _F), Attr("inv_freq_long", _W, False),
                     *_LONG)),
    Op.ROPE_TABLE: OpSpec(OpGroup.POSITION, ("x", "positions"),
                          (Attr("table", _W), Attr("table_long", _W, False), *_LONG)),
    Op.ATTENTION: OpSpec(OpGroup.ATTENTION, ("q", "k", "v"),
                         (Attr("scale", _F), Attr("sparse_config", AttrKind.JSON, False))),
    Op.ADD: OpSpec(OpGroup.BINARY, ("a", "b")),
    Op.MUL: OpSpec(OpGroup.BINARY, ("a", "b")),
    Op.MUL_SCALAR: OpSpec(OpGroup.SCALAR, ("x",), (Attr("value", _F),)),
    Op.DIV_SCALAR: OpSpec(OpGroup.SCALAR, ("x",), (Attr("value", _F),)),
    Op.SILU: OpSpec(OpGroup.UNARY, ("x",)),
    Op.CAST: OpSpec(OpGroup.UNARY, ("x",), (Attr("dtype", AttrKind.DTYPE),)),
    Op.RESHAPE: OpSpec(OpGroup.MOVEMENT, ("x",), (Attr("shape", AttrKind.DIMS),)),
    Op.TRANSPOSE: OpSpec(OpGroup.MOVEMENT, ("x",), (Attr("dim0", _I), Attr("dim1", _I))),
    Op.CONCAT: OpSpec(OpGroup.MOVEMENT, ("x",), (Attr("dim", _I),), variadic=True),
    Op.SLICE: OpSpec(OpGroup.MOVEMENT, ("x",), (Attr("dim", _I), Attr("start", _I), Attr("end", _I))),
}

LONG_ROPE_ATTRS = {Op.ROPE: ("inv_freq_long", "long_after", "length"),
                   Op.ROPE_TABLE: ("table_long", "long_after", "length")}


def ops_in(group: OpGroup) -> tuple[Op, ...]:
    """The ops of one group, in enum order."""
    return tuple(op for op, spec in SPECS.items() if spec.group == group)


def parse_op(text: str) -> Op:
    from arkinfer.ir.errors import IRVerifyError

    try:
        return Op(text)
    except ValueError:
        raise IRVerifyError(f"op {text!r} is not an IR op",
                          hint=f"IR ops: {', '.join(o.value for o in Op)}") from None
