"""A small node builder for ONNX graphs and function bodies: unique value names, constants, and
`op(...)` that appends a NodeProto and returns its output name(s).

    b = NodeBuilder("l0.attn")
    t = b.op("Shape", "q", start=2, end=3)                      # -> "l0.attn/0"
    y = b.op("MatMul", x, b.const(np.eye(4, dtype=np.float32)))
    b.nodes                                                      # list[NodeProto], in order

Integer scalars are kept as 1-D int64 tensors of one element ([1]) so they feed Slice, Reshape,
Range-free arithmetic and Concat of shapes without Unsqueeze; `scalar0` makes a 0-d one where an op
wants it (Range, TopK's K is [1]).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, NodeProto, TensorProto, helper, numpy_helper

OPSET = 21
DOMAIN = "arkinfer"
DOMAIN_VERSION = 1
IR_VERSION = 10

_ATTR_TYPES = {"int": AttributeProto.INT, "float": AttributeProto.FLOAT,
               "string": AttributeProto.STRING, "ints": AttributeProto.INTS}


class NodeBuilder:
    """Appends nodes under a name prefix; every output name is `<prefix>/<n>` (unique)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.nodes: list[NodeProto] = []
        self._n = 0

    def fresh(self, hint: str = "") -> str:
        self._n += 1
        return f"{self.prefix}/{hint}{self._n}"

    def op(self, op_type: str, *inputs: str, outputs: int = 1, domain: str = "",
           out_names: list[str] | None = None, **attrs: Any) -> Any:
        """Append `op_type(inputs) {attrs}`; returns the output name (or list when outputs > 1).
        An input of "" is an omitted optional input."""
        names = out_names or [self.fresh(op_type[:6].lower()) for _ in range(outputs)]
        node = helper.make_node(op_type, list(inputs), names, name=self.fresh("n"),
                                domain=domain or None, **attrs)
        self.nodes.append(node)
        return names[0] if len(names) == 1 else names

    def node(self, node: NodeProto) -> None:
        self.nodes.append(node)

    # ------------------------------------------------------------------------- constants
    def const(self, value: Any, dtype: Any = None) -> str:
        """A Constant node holding `value` (numpy array or Python scalar/list)."""
        arr = np.asarray(value, dtype=dtype)
        return self.op("Constant", value=numpy_helper.from_array(arr))

    def i64(self, *values: int) -> str:
        """1-D int64 constant [len(values)]."""
        return self.const(np.array(values, dtype=np.int64))

    def f32(self, value: float) -> str:
        """0-d float32 constant."""
        return self.const(np.array(value, dtype=np.float32))

    def attr_int(self, name: str) -> str:
        """A 1-D int64 [1] value read from the enclosing function's int attribute `name`."""
        ref = helper.make_attribute_ref("value_int", AttributeProto.INT)
        ref.ref_attr_name = name
        node = helper.make_node("Constant", [], [self.fresh(f"attr_{name}")], name=self.fresh("n"))
        node.attribute.append(ref)
        self.nodes.append(node)
        return self.op("Reshape", node.output[0], self.i64(1))

    def attr_float(self, name: str) -> str:
        """A 0-d float32 value read from the enclosing function's float attribute `name`."""
        ref = helper.make_attribute_ref("value_float", AttributeProto.FLOAT)
        ref.ref_attr_name = name
        node = helper.make_node("Constant", [], [self.fresh(f"attr_{name}")], name=self.fresh("n"))
        node.attribute.append(ref)
        self.nodes.append(node)
        return node.output[0]

    # ------------------------------------------------------------------------- shape helpers
    def dim(self, x: str, axis: int) -> str:
        """x.shape[axis] as int64 [1]."""
        if axis == -1:
            return self.op("Shape", x, start=-1)
        return self.op("Shape", x, start=axis, end=axis + 1)

    def scalar0(self, x: str) -> str:
        """int64 [1] -> 0-d."""
        return self.op("Squeeze", x, self.i64(0))

    def range1(self, start: str, limit: str) -> str:
        """Range(start, limit, 1) of int64 [1] bounds -> int64 [limit - start]."""
        return self.op("Range", self.scalar0(start), self.scalar0(limit), self.const(np.int64(1)))


def value_info(name: str, elem_type: int, shape: list[Any] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


def attribute(name: str, kind: str, default: Any) -> AttributeProto:
    """A function attribute with its default value."""
    attr = helper.make_attribute(name, default)
    if attr.type != _ATTR_TYPES[kind]:
        raise TypeError(f"default of function attribute {name!r} must be {kind}")
    return attr


ELEM = {"f32": TensorProto.FLOAT, "f16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16,
        "i64": TensorProto.INT64, "i32": TensorProto.INT32}
