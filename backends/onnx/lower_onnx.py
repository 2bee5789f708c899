"""IR -> ONNX: one graph (the IR's `prefill` entry: T >= 1 new tokens over a P-token cache) that
serves prefill and decode (T = 1) alike, emitted op by op from a table like the IR interpreter's.

    inputs   tokens i64 [1, T], positions i64 [T],
             past.{i}.k / past.{i}.v f32 [1, Hkv, P, D]
             past.{i}.fine / past.{i}.coarse f32 [1, Hkv, N1|N2, D]   (InfLLM v2 models only)
    outputs  logits f32 [1, T, V], present.{i}.k / .v [1, Hkv, P+T, D], present.{i}.fine / .coarse

Activations are float32 (the host runs them in fp32; TensorRT builds fp16 engines from the same
graph with --fp16). Float weights are stored in the build dtype and cast once; quantised linears
keep their checkpoint tensors and become `arkinfer.MarlinLinear` / `arkinfer.Int4Linear` nodes;
attention with a sparse_config becomes `arkinfer.InfLLMv2Attention` with the layer's compressed-key
caches; dense attention together with its RoPE, cache concat and head reshapes becomes one
`arkinfer.RotaryGQA` (groups.py finds them; off that pattern it is emitted inline), and RMSNorm
`arkinfer.RMSNorm` / `arkinfer.SkipRMSNorm` (with the residual add before it): functions with
standard-op bodies (fn_fused.py) that the host runner swaps for onnxruntime's fused contrib ops.

Why from the IR and not from the torch model: the IR is already the verified, length-generic graph
(every op's meaning fixed by the interpreter), its 16 ops map one-to-one to a few ONNX nodes, and
weights stay outside the graph by name, so quantised tensors are substituted without re-tracing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from arkinfer.errors import NotAvailableError
from arkinfer.ir import dims
from arkinfer.ir.graph import Node, Program
from arkinfer.ir.ops import Op
from arkinfer.lowering.source_weights import PackedLinear

from . import fn_fused, fn_infllmv2, fn_linear
from .groups import AttentionGroup, find_groups
from .onnx_build import DOMAIN, DOMAIN_VERSION, IR_VERSION, OPSET, NodeBuilder
from .weights import FolderWeights, tensor_proto


def io_names(layers: int, sparse: bool) -> tuple[list[str], list[str]]:
    """(cache input names, cache output names) in the graph's order."""
    kinds = ("k", "v", "fine", "coarse") if sparse else ("k", "v")
    return ([f"past.{i}.{k}" for i in range(layers) for k in kinds],
            [f"present.{i}.{k}" for i in range(layers) for k in kinds])


class _Lowering:
    def __init__(self, program: Program, src: FolderWeights, dtype: str) -> None:
        self.program, self.src, self.dtype = program, src, dtype
        self.graph = program.entry("prefill")
        self.b = NodeBuilder("m")
        self.inits: dict[str, TensorProto] = {}
        self.values: dict[str, str] = {}
        self.dim_values: dict[str, str] = {}
        self.dim_inputs: dict[str, tuple[str, int]] = {}  # dim name -> (graph input, axis)
        self.memo: dict[Any, str] = {}
        self.layers: dict[str, str] = {}
        self.sparse = program.meta.get("sparse_config")
        self.cache_layer = {k: i for i, (k, _) in enumerate(program.cache_names())}
        self.producer = {n.name: n for n in self.graph.nodes}
        self.functions: set[str] = set()
        self.groups = find_groups(self.graph)

    # ---------------------------------------------------------------- weights
    def float_weight(self, name: str) -> str:
        """f32 value of a float weight (stored in the build dtype, cast once)."""
        if ("w", name) in self.memo:
            return self.memo[("w", name)]
        if name not in self.inits:
            t = self.program.weights.tensor(name) if name.startswith("rope.") else \
                self.src.tensor(name)
            self.inits[name] = tensor_proto(name, t, None if name.startswith("rope.") else
                                            self.dtype)
        out = name
        if self.inits[name].data_type != TensorProto.FLOAT:
            out = self.b.op("Cast", name, to=TensorProto.FLOAT)
        self.memo[("w", name)] = out
        return out

    def linear(self, x: str, name: str, bias: str | None) -> str:
        shape = self.program.weights[name].type.shape
        q = self.src.packed(name, shape)
        if q is None:
            y = self.b.op("MatMul", x, self.b.op("Transpose", self.float_weight(name), perm=[1, 0]))
        else:
            y = self.quant_linear(x, q)
        return y if bias is None else self.b.op("Add", y, self.float_weight(bias))

    def quant_linear(self, x: str, q: PackedLinear) -> str:
        for key, arr in q.tensors.items():
            self.inits[f"{q.owner}.{key}"] = tensor_proto(f"{q.owner}.{key}", arr)
        attrs = {"in_features": q.in_features, "out_features": q.out_features,
                 "group_size": int(q.params.get("group_size", 128))}
        if q.format == "marlin":
            self.functions.add(fn_linear.MARLIN)
            self.layers[q.owner] = f"marlin 4-bit g{attrs['group_size']} (arkinfer.MarlinLinear)"
            return self.b.op(fn_linear.MARLIN, x, f"{q.owner}.B", f"{q.owner}.s", domain=DOMAIN,
                             **attrs)
        if int(q.params.get("bits", 4)) != 4:
            raise NotAvailableError(f"{q.owner}: {q.format} with {q.params.get('bits')} bits; "
                                    "arkinfer.Int4Linear takes 4-bit weights",
                                    hint="quantise with --bits 4")
        if "g_idx" not in q.tensors:
            group = attrs["group_size"] if attrs["group_size"] > 0 else q.in_features
            g_idx = (np.arange(q.in_features) // group).astype(np.int32)
            self.inits[f"{q.owner}.g_idx"] = tensor_proto(f"{q.owner}.g_idx", g_idx)
        self.functions.add(fn_linear.INT4)
        self.layers[q.owner] = f"{q.format} 4-bit g{attrs['group_size']} (arkinfer.Int4Linear)"
        return self.b.op(fn_linear.INT4, x, *(f"{q.owner}.{k}" for k in
                                              ("qweight", "qzeros", "scales", "g_idx")),
                         domain=DOMAIN, layout=q.format, bits=4, **attrs)

    # ---------------------------------------------------------------- dims
    def dim(self, d: Any) -> str:
        """int64 [1] value of a dim (int or expression over T, P)."""
        key = str(d)
        if key in self.dim_values:
            return self.dim_values[key]
        expr = dims.as_sympy(d)
        if expr.is_Integer:
            out = self.b.i64(int(expr))
        elif expr.is_Symbol and key in self.dim_inputs:
            # a Shape node only where a dim is used: an unread Shape of a cache input would be a
            # second reader of it (the host runner shares the cache only when GQA is the one)
            out = self.b.dim(*self.dim_inputs[key])
        elif expr.is_Symbol:
            raise NotAvailableError(f"dim {key!r} is not bound by a graph input")
        else:
            parts = [self.dim(dims.from_sympy(a)) for a in expr.args]
            op = "Add" if expr.is_Add else "Mul"
            out = parts[0]
            for p in parts[1:]:
                out = self.b.op(op, out, p)
        self.dim_values[key] = out
        return out

    # ---------------------------------------------------------------- ops
    def inv_freq(self, a: dict) -> str:
        """f32 [D/2] frequencies of a rope node (LongRoPE: the long set past `long_after`)."""
        key = ("inv", a["inv_freq"], a.get("inv_freq_long"), a.get("long_after"))
        if key not in self.memo:
            inv = self.float_weight(a["inv_freq"])
            if a.get("inv_freq_long") is not None:
                longer = self.b.op("Greater", self.dim(a["length"]), self.b.i64(int(a["long_after"])))
                inv = self.b.op("Where", longer, self.float_weight(a["inv_freq_long"]), inv)
            self.memo[key] = inv
        return self.memo[key]

    def rope(self, n: Node, x: str, positions: str) -> str:
        b, a = self.b, n.attrs
        key = ("rope", a["inv_freq"], a.get("inv_freq_long"), a.get("long_after"), a["scale"])
        if key not in self.memo:
            self.memo[key] = fn_fused.rope_cos_sin(b, positions, self.inv_freq(a),
                                                   b.f32(float(a["scale"])))
        cos, sin = self.memo[key]
        return fn_fused.rope_apply(b, x, cos, sin, b.i64(n.type.shape[-1] // 2))

    def attention(self, n: Node, q: str, k: str, v: str) -> str:
        b = self.b
        scale = float(n.attrs["scale"])
        sc = n.attrs.get("sparse_config")
        if sc:
            if sc.get("use_nope"):
                raise NotAvailableError(f"%{n.name}: sparse_config.use_nope=true is not supported "
                                        "by arkinfer.InfLLMv2Attention yet",
                                        hint="build with a config that has use_nope=false")
            i = self.layer_of(n)
            self.functions.add(fn_infllmv2.NAME)
            out, *_ = b.op(fn_infllmv2.NAME, q, k, v, f"past.{i}.fine", f"past.{i}.coarse",
                           domain=DOMAIN, out_names=[b.fresh("attn"), f"present.{i}.fine",
                                                     f"present.{i}.coarse", b.fresh("idx")],
                           **fn_infllmv2.node_attrs(sc, scale))
            return out
        return fn_fused.dense_attention(b, q, k, v, b.f32(scale))

    def rotary_gqa(self, g: AttentionGroup) -> str:
        """One arkinfer.RotaryGQA for a whole attention group; its present outputs become the
        values of the group's cache concats."""
        self.functions.add(fn_fused.ROTARY_GQA)
        v = self.values
        out, k_all, v_all = self.b.op(
            fn_fused.ROTARY_GQA, v[g.query], v[g.key], v[g.value], v[g.past_key], v[g.past_value],
            v[g.positions], self.inv_freq(g.rope.attrs), domain=DOMAIN, outputs=3,
            num_heads=g.num_heads, kv_num_heads=g.kv_num_heads,
            scale=float(g.attention.attrs["scale"]), rope_scale=float(g.rope.attrs["scale"]))
        v[g.present_key], v[g.present_value] = k_all, v_all
        return out

    def rms_norm(self, n: Node) -> str:
        """arkinfer.RMSNorm, or arkinfer.SkipRMSNorm when the norm reads a residual add (the add's
        value is then the function's second output)."""
        weight, eps = self.float_weight(n.attrs["weight"]), float(n.attrs["eps"])
        add = self.groups.skip_norm.get(n.name)
        if add is None:
            self.functions.add(fn_fused.RMS_NORM)
            return self.b.op(fn_fused.RMS_NORM, self.values[n.inputs[0]], weight, domain=DOMAIN,
                             epsilon=eps)
        self.functions.add(fn_fused.SKIP_RMS_NORM)
        y, total = self.b.op(fn_fused.SKIP_RMS_NORM, self.values[add.inputs[0]],
                             self.values[add.inputs[1]], weight, domain=DOMAIN, outputs=2,
                             epsilon=eps)
        self.values[add.name] = total
        return y

    def layer_of(self, n: Node) -> int:
        cat = self.producer.get(n.inputs[1])
        if cat is None or cat.op != Op.CONCAT or cat.inputs[0] not in self.cache_layer:
            raise NotAvailableError(f"%{n.name}: attention keys do not come from a cache concat")
        return self.cache_layer[cat.inputs[0]]

    def node(self, n: Node) -> str:
        b, a = self.b, n.attrs
        if n.name in self.groups.attention:
            return self.rotary_gqa(self.groups.attention[n.name])
        if n.op == Op.RMS_NORM:  # before reading x: a fused residual add has no value yet
            return self.rms_norm(n)
        x = [self.values[i] for i in n.inputs]
        if n.op == Op.EMBED:
            return b.op("Gather", self.float_weight(a["weight"]), x[0], axis=0)
        if n.op == Op.LINEAR:
            return self.linear(x[0], a["weight"], a.get("bias"))
        if n.op == Op.ROPE:
            return self.rope(n, x[0], x[1])
        if n.op == Op.ATTENTION:
            return self.attention(n, *x)
        simple = {Op.ADD: "Add", Op.MUL: "Mul"}
        if n.op in simple:
            return b.op(simple[n.op], x[0], x[1])
        if n.op in (Op.MUL_SCALAR, Op.DIV_SCALAR):
            return b.op("Mul" if n.op == Op.MUL_SCALAR else "Div", x[0], b.f32(float(a["value"])))
        if n.op == Op.SILU:
            return b.op("Mul", x[0], b.op("Sigmoid", x[0]))
        if n.op == Op.CAST:  # every float is f32 here; integer casts stay
            if n.type.dtype.is_float:
                return x[0]
            return b.op("Cast", x[0], to=_ELEM_OF[n.type.dtype.value])
        if n.op == Op.RESHAPE:
            return b.op("Reshape", x[0], b.op("Concat", *[self.dim(d) for d in a["shape"]], axis=0))
        if n.op == Op.TRANSPOSE:
            perm = list(range(n.type.rank))
            perm[a["dim0"]], perm[a["dim1"]] = perm[a["dim1"]], perm[a["dim0"]]
            return b.op("Transpose", x[0], perm=perm)
        if n.op == Op.CONCAT:
            return b.op("Concat", *x, axis=int(a["dim"]))
        if n.op == Op.SLICE:
            return b.op("Slice", x[0], b.i64(int(a["start"])), b.i64(int(a["end"])),
                        b.i64(int(a["dim"])))
        raise NotAvailableError(f"%{n.name}: IR op {n.op} has no ONNX lowering",
                                hint="run the IR without the rope-table pass (ir.trace output)")

    # ---------------------------------------------------------------- graph
    def run(self) -> onnx.GraphProto:
        g, f32 = self.graph, TensorProto.FLOAT
        rename = {k: f"past.{i}.{s}" for i, pair in enumerate(self.program.cache_names())
                  for k, s in zip(pair, ("k", "v"))}
        inputs = []
        for inp in g.inputs:
            name = rename.get(inp.name, inp.name)
            elem = f32 if inp.type.dtype.is_float else _ELEM_OF[inp.type.dtype.value]
            inputs.append(helper.make_tensor_value_info(name, elem, [str(d) if isinstance(d, str)
                                                                     else d for d in inp.type.shape]))
            self.values[inp.name] = name
            for axis, d in enumerate(inp.type.shape):
                if isinstance(d, str) and dims.is_name(d) and d not in self.dim_inputs:
                    self.dim_inputs[d] = (name, axis)
        meta = self.program.meta
        if self.sparse:
            for i in range(self.program.num_layers):
                for kind, n in (("fine", "N1"), ("coarse", "N2")):
                    inputs.append(helper.make_tensor_value_info(
                        f"past.{i}.{kind}", f32, [meta["batch"], meta["num_kv_heads"], n,
                                                  meta["head_dim"]]))
        for n in g.nodes:
            if n.name not in self.groups.absorbed:
                self.values[n.name] = self.node(n)
        outputs = []
        for out_name, value in g.outputs.items():
            name = rename.get(out_name, out_name).replace("past.", "present.")
            ty = next(n.type for n in g.nodes if n.name == value)
            self.b.op("Identity", self.values[value], out_names=[name])
            outputs.append(helper.make_tensor_value_info(name, f32, [str(d) if isinstance(d, str)
                                                                     else d for d in ty.shape]))
            if self.sparse and name.endswith(".v"):
                i = name.split(".")[1]
                for kind, n in (("fine", "N1"), ("coarse", "N2")):
                    outputs.append(helper.make_tensor_value_info(
                        f"present.{i}.{kind}", f32, [meta["batch"], meta["num_kv_heads"],
                                                     f"{n}_out", meta["head_dim"]]))
        return helper.make_graph(self.b.nodes, "arkinfer", inputs, outputs,
                                 list(self.inits.values()))


_ELEM_OF = {"i64": TensorProto.INT64, "i32": TensorProto.INT32, "bool": TensorProto.BOOL,
            "u8": TensorProto.UINT8, "i8": TensorProto.INT8}
_FUNCTIONS = {fn_infllmv2.NAME: fn_infllmv2.function, fn_linear.MARLIN: fn_linear.marlin_function,
              fn_linear.INT4: fn_linear.int4_function, **fn_fused.FUNCTIONS}


def lower_to_onnx(program: Program, src: FolderWeights, dtype: str,
                  metadata: dict[str, str]) -> tuple[onnx.ModelProto, dict[str, str]]:
    """(model, per-linear storage) for a traced program whose weights are read from `src`."""
    low = _Lowering(program, src, dtype)
    graph = low.run()
    model = helper.make_model(graph, ir_version=IR_VERSION, producer_name="arkinfer",
                              functions=[_FUNCTIONS[f]() for f in sorted(low.functions)],
                              opset_imports=[helper.make_opsetid("", OPSET),
                                             helper.make_opsetid(DOMAIN, DOMAIN_VERSION)])
    helper.set_model_props(model, metadata)
    return model, low.layers
