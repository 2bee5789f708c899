"""IR -> Relax: every entry point of an ArkInfer IR program (prefill, decode) becomes a Relax
function of the same name, emitted node by node from the op table `LOWERINGS`, like the IR
interpreter's `KERNELS` (`arkinfer/ir/interpret.py` defines what each op means).

    mod, sig = lower_program(program, params)   # params: name -> numpy array (artifact.params)

Calling convention of every function (`sig` records it; tvm_module.json stores it):

    entry(tokens i64 [1, T], positions i64 [T], cache.{i}.k/v f32 [1, Hkv, P, D], ...,
          *params in `sig.params` order)
      -> (logits f32 [1, T, V], cache.{i}.k/v f32 [1, Hkv, P+T, D], ...)

The IR's named dims (T, P, S) become symbolic int64 shape variables, so one compiled function
serves every length; dim expressions ("P+T") become PrimExprs. Activations are fp32; linears
whose weights are packed (weights.py) read their q4 tensors through `kernels_linear.linear_q4`,
except in a host (llvm) module: there prefill's linears (4-bit and float) are the tiled GEMM of
`kernels_gemm.py` and decode's 4-bit ones hand-built GEMVs (`kernels_qact.py` / `kernels_gemv.py`).
The KV cache is functional, as in the IR: `concat(cache, new)`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm import tirx as tir
from tvm.target import Target

from arkinfer.errors import NotAvailableError
from arkinfer.ir import dims
from arkinfer.ir.graph import Graph, Node, Program
from arkinfer.ir.ops import Op
from arkinfer.ir.types import DType
from arkinfer.ops.infllmv2.config import SparseConfig

from . import kernels_attention as ka
from . import kernels_gemm as gm
from . import kernels_gemv as kg
from . import kernels_linear as kl
from . import kernels_norm as kn
from . import kernels_qact as qa
from .infllmv2 import emit_infllmv2
from .weights import q4_names, q8_names

TVM_DTYPE = {DType.F32: "float32", DType.F16: "float16", DType.BF16: "bfloat16",
             DType.I64: "int64", DType.I32: "int32", DType.I8: "int8", DType.U8: "uint8",
             DType.BOOL: "bool"}


@dataclass
class EntrySignature:
    """Argument and result names of one compiled entry point (params follow the inputs)."""

    inputs: list[str]
    outputs: list[str]


@dataclass
class Signature:
    """What a caller needs to drive the module (tvm_module.json holds it as JSON).

    cache: {"layers", "kv_heads", "head_dim", "max_len", "dense_len"} (dense_len: the InfLLM v2
    switch, None for dense models); vocab_size: logits width."""

    entries: dict[str, EntrySignature] = field(default_factory=dict)
    params: list[str] = field(default_factory=list)
    ops: dict[str, str] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    vocab_size: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"entries": {k: {"inputs": e.inputs, "outputs": e.outputs}
                            for k, e in self.entries.items()},
                "params": self.params, "ops": self.ops, "cache": self.cache,
                "vocab_size": self.vocab_size}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Signature:
        return cls({k: EntrySignature(list(e["inputs"]), list(e["outputs"]))
                    for k, e in data["entries"].items()}, list(data["params"]),
                   dict(data.get("ops", {})), dict(data["cache"]), int(data["vocab_size"]))


@dataclass(frozen=True)
class HostDecode:
    """A host (llvm) module: `target` is the llvm target; `activations` is how decode's 4-bit
    linears take their row: "int16" / "int8": rounded per 32 values (kernels_qact.py, x86 only;
    other hosts fall back to fp32), "f32": fp32 (kernels_gemv.py). Prefill's linears are
    kernels_gemm.py's tiled GEMM whatever `activations` says (fp32)."""

    target: Target
    activations: str = "int16"


class _Entry:
    """Lowers one graph inside an open BlockBuilder dataflow block."""

    def __init__(self, bb: relax.BlockBuilder, program: Program, graph: Graph,
                 params: dict[str, relax.Var], env: dict[str, Any],
                 host: HostDecode | None = None, funcs: dict | None = None) -> None:
        self.bb, self.program, self.graph, self.params, self.env = bb, program, graph, params, env
        self.types = graph.types()
        self.host = host   # None: a device module (TE linears only, scheduled by dlight)
        self.funcs = {} if funcs is None else funcs   # hand-built GEMVs and GEMMs, by shape
        self.prepared: dict = {}   # decode activations prepared for the GEMVs, by (x, kind)
        self.kv_len: tir.Var | None = None  # the key count as a plain variable (plain_length)

    def dim(self, d: Any):
        return prim_dim(d, self.env)

    def p(self, name: str | None) -> relax.Var | None:
        if name is None:
            return None
        if name not in self.params:
            raise NotAvailableError(f"weight {name!r} has no parameter in the tvm module",
                                    hint="the params were prepared for another program")
        return self.params[name]

    def use_long(self, n: Node):
        """Boolean PrimExpr: LongRoPE's long table is in use (total length > long_after)."""
        if n.attrs.get("long_after") is None:
            return None
        length = self.dim(n.attrs["length"])
        return tir.const(True, "bool") if isinstance(length, int) and length > \
            int(n.attrs["long_after"]) else length > int(n.attrs["long_after"])

    # ------------------------------------------------------------------------------ ops
    def embed(self, n: Node, ids):
        """Rows of the embedding, widened to float32 when it is stored as float16 and
        dequantised when it is Q8_0 (weights.py, `float_weights=q8`)."""
        q8_codes, q8_scales = q8_names(n.attrs["weight"])
        if q8_codes in self.params:
            return self.bb.emit_te(kl.embed_q8, self.p(q8_codes), self.p(q8_scales), ids,
                                   primfunc_name_hint="embed_q8")
        table = self.p(n.attrs["weight"])
        rows = relax.op.take(table, ids, axis=0, mode="clip")
        if str(table.ty.dtype) == "float32":
            return rows
        return relax.op.astype(self.bb.emit(rows), "float32")

    def linear(self, n: Node, x):
        name = n.attrs["weight"]
        codes, scales, zeros = q4_names(name)
        bias = self.p(n.attrs.get("bias"))
        if codes in self.params:
            gemv = self.decode_gemv(x, self.p(scales))
            if gemv is not None:
                return gemv(self.bb, x, self.p(codes), self.p(scales), self.params.get(zeros),
                            bias, self.funcs, self.prepared)
            q4 = (self.p(codes), self.p(scales), self.params.get(zeros), bias)
            if self.prefill_gemm(x):
                return gm.emit_q4_gemm(self.bb, x, *q4, funcs=self.funcs)
            return self.bb.emit_te(kl.linear_q4, x, *q4, primfunc_name_hint="q4_linear")
        q8_codes, q8_scales = q8_names(name)
        if q8_codes in self.params:
            return self.linear_q8(x, self.p(q8_codes), self.p(q8_scales), bias)
        if self.prefill_gemm(x):
            return gm.emit_float_gemm(self.bb, x, self.p(name), bias, funcs=self.funcs)
        return self.bb.emit_te(kl.linear_f32, x, self.p(name), bias, primfunc_name_hint="linear")

    def linear_q8(self, x, codes, scales, bias):
        """A Q8_0 float matrix (the lm_head): decode on an x86 host build through
        kernels_qact's int16 / int8 GEMV (the build's decode_activations; f32 keeps the TE
        row), prefill through kernels_gemm's tiled GEMM, devices through the TE reduction."""
        k = int(x.ty.shape[-1])
        if self.decode_gemv(x, scales) is not None and self.host.activations != "f32" and \
                qa.supported(self.host.target, k, qa.BLOCK):
            return qa.emit_linear_q8_qact(self.bb, x, codes, scales, bias, self.funcs,
                                          self.prepared,
                                          bits=int(self.host.activations.removeprefix("int")),
                                          wide=qa.has_avx2(self.host.target))
        if self.prefill_gemm(x):
            return gm.emit_q8_gemm(self.bb, x, codes, scales, bias, funcs=self.funcs)
        return self.bb.emit_te(kl.linear_q8, x, codes, scales, bias,
                               primfunc_name_hint="q8_linear")

    def prefill_gemm(self, x) -> bool:
        """True when a host (llvm) module computes this linear as kernels_gemm's tiled GEMM:
        rows [1, T, K] with T not a static 1 (prefill; decode keeps its GEMVs / TE rows).
        Device modules keep the TE reductions dlight schedules."""
        return self.host is not None and gm.supported(list(x.ty.shape))

    def decode_gemv(self, x, scales):
        """The hand-built GEMV emitter for a decode row (static [1, 1, K]) of a host module:
        kernels_qact's when the build asked for int16 / int8 activations and the target has it,
        else kernels_gemv's fp32 one; None (the TE reduction) for prefill, devices, odd shapes."""
        shape = list(x.ty.shape)
        if self.host is None or not all(isinstance(d, tir.IntImm) for d in shape) or \
                [int(d) for d in shape[:-1]] != [1, 1]:
            return None
        k = int(shape[-1])
        group = k // int(scales.ty.shape[1])
        if self.host.activations != "f32" and qa.supported(self.host.target, k, group):
            return functools.partial(qa.emit_linear_q4_qact,
                                     bits=int(self.host.activations.removeprefix("int")))
        return kg.emit_linear_q4_f32 if kg.supported(k, group) else None

    def rope_table(self, n: Node, x, positions):
        return self.bb.emit_te(ka.rope_table, x, positions, self.p(n.attrs["table"]),
                               self.p(n.attrs.get("table_long")), self.use_long(n),
                               primfunc_name_hint="rope_table")

    def rope(self, n: Node, x, positions):
        return self.bb.emit_te(ka.rope, x, positions, self.p(n.attrs["inv_freq"]),
                               self.p(n.attrs.get("inv_freq_long")), self.use_long(n),
                               float(n.attrs["scale"]), primfunc_name_hint="rope")

    def attention(self, n: Node, q, k, v):
        k, v = self.plain_length(k, n.inputs[1]), self.plain_length(v, n.inputs[2])
        if n.attrs.get("sparse_config"):
            # InfLLM v2: dense below dense_len, sparse from there on, decided in the kernels
            cfg = SparseConfig.from_dict(n.attrs["sparse_config"])
            length = self.kv_len if self.kv_len is not None else \
                self.dim(self.types[n.inputs[1]].shape[2])
            group = int(self.types[n.inputs[0]].shape[1]) // int(self.types[n.inputs[1]].shape[1])
            t_new = q.ty.shape[2]
            one_query = isinstance(t_new, tir.IntImm) and int(t_new) == 1
            out, *_ = emit_infllmv2(self.bb, q, k, v, group, cfg, float(n.attrs["scale"]),
                                    length, cfg.dense_len, gather=self.host is not None
                                    and one_query)
            return relax.op.reshape(out, [self.dim(d) for d in n.type.shape])
        scores = self.bb.emit_te(ka.attention_scores, q, k, float(n.attrs["scale"]),
                                 primfunc_name_hint="attention_scores")
        probs = self.bb.emit_te(ka.masked_softmax, scores, primfunc_name_hint="attention_softmax")
        out = self.bb.emit_te(ka.attention_mix, probs, v, primfunc_name_hint="attention_mix")
        return relax.op.reshape(out, [self.dim(d) for d in n.type.shape])

    def plain_length(self, kv, value: str):
        """k / v with their key count as a plain shape variable: decode's keys are `S+1` long,
        and dlight's Matmul rule on Mali pads an `S+1` extent into an S-sized local buffer,
        which OpenCL codegen refuses; `L` (bound by a match_cast) schedules cleanly."""
        length = self.dim(self.types[value].shape[2])
        if isinstance(length, (int, tir.Var)):
            return kv
        shape = [self.dim(d) for d in self.types[value].shape]
        if self.kv_len is None:
            self.kv_len = tir.Var("L", "int64")
        shape[2] = self.kv_len
        return self.bb.match_cast(kv, relax.TensorType(shape, "float32"))

    def node(self, n: Node, x: list) -> relax.Expr:
        return LOWERINGS[n.op](self, n, x)


def prim_dim(d: Any, env: dict[str, Any]):
    """An IR dim (int, name or expression such as "P+T") as an int or an int64 PrimExpr over
    the shape variables in `env`."""
    def walk(expr):
        if expr.is_Integer:
            return int(expr)
        if expr.is_Symbol:
            return env[str(expr)]
        parts = [walk(a) for a in expr.args]
        out = parts[0]
        for p in parts[1:]:
            out = out + p if expr.is_Add else out * p
        return out

    return int(d) if isinstance(d, int) else walk(dims.as_sympy(d))


_RESHAPE_OP = tvm.ir.Op.get("relax.reshape")


def _scalar(value: float) -> relax.Constant:
    return relax.const(float(value), "float32")


def _reshape(e: _Entry, x: relax.Expr, shape: list) -> relax.Expr:
    """`x` viewed as `shape`; a reshape of a reshape reshapes the first one's input (relax
    would fuse the chain into a copy kernel; one reshape stays a view)."""
    source = e.bb.lookup_binding(x) if isinstance(x, relax.Var) else None
    if isinstance(source, relax.Call) and source.op == _RESHAPE_OP:
        x = source.args[0]
    return relax.op.reshape(x, shape)


def _transpose(e: _Entry, n: Node, x: list) -> relax.Expr:
    """Swap two dims. When at most one of the dims from the first swapped to the second is not
    statically 1 (decode's [1, 1, H, D] <-> [1, H, 1, D]), the memory order is unchanged and
    the swap is a reshape: a view, where a permute would be a copy kernel (four per layer of
    every decode step)."""
    a, b = sorted((n.attrs["dim0"], n.attrs["dim1"]))
    perm = list(range(n.type.rank))
    perm[a], perm[b] = perm[b], perm[a]
    shape = list(x[0].ty.shape)
    moved = shape[a:b + 1]
    if sum(not (isinstance(d, tir.IntImm) and int(d) == 1) for d in moved) <= 1:
        return _reshape(e, x[0], [shape[i] for i in perm])
    return relax.op.permute_dims(x[0], perm)


# Op -> lowering; the keys are exactly what this backend covers (preflight checks programs
# against them, so an op without an entry is a plan-time error naming it).
LOWERINGS: dict[Op, Callable[[_Entry, Node, list], relax.Expr]] = {
    Op.EMBED: lambda e, n, x: e.embed(n, x[0]),
    Op.LINEAR: lambda e, n, x: e.linear(n, x[0]),
    Op.RMS_NORM: lambda e, n, x: e.bb.emit_te(kn.rms_norm, x[0], e.p(n.attrs["weight"]),
                                              float(n.attrs["eps"]), primfunc_name_hint="rms_norm"),
    Op.ROPE: lambda e, n, x: e.rope(n, x[0], x[1]),
    Op.ROPE_TABLE: lambda e, n, x: e.rope_table(n, x[0], x[1]),
    Op.ATTENTION: lambda e, n, x: e.attention(n, *x),
    Op.ADD: lambda e, n, x: relax.op.add(x[0], x[1]),
    Op.MUL: lambda e, n, x: relax.op.multiply(x[0], x[1]),
    Op.MUL_SCALAR: lambda e, n, x: relax.op.multiply(x[0], _scalar(n.attrs["value"])),
    Op.DIV_SCALAR: lambda e, n, x: relax.op.divide(x[0], _scalar(n.attrs["value"])),
    Op.SILU: lambda e, n, x: relax.op.nn.silu(x[0]),
    Op.CAST: lambda e, n, x: relax.op.astype(x[0], _act_dtype(n.type.dtype)),
    Op.RESHAPE: lambda e, n, x: _reshape(e, x[0], [e.dim(d) for d in n.attrs["shape"]]),
    Op.TRANSPOSE: _transpose,
    Op.CONCAT: lambda e, n, x: relax.op.concat(x, axis=int(n.attrs["dim"])),
    Op.SLICE: lambda e, n, x: relax.op.strided_slice(x[0], axes=[int(n.attrs["dim"])],
                                                     begin=[int(n.attrs["start"])],
                                                     end=[int(n.attrs["end"])]),
}

OP_IMPLEMENTATIONS = {
    "linear": "TE reduction; int4 q4 weights dequantised inside the sum (kernels_linear.py); "
              "host build: prefill as a tiled GEMM (kernels_gemm.py), decode as GEMVs",
    "embed": "relax take", "rms_norm": "TE row reduction + epilogue (kernels_norm.py)",
    "rope": "TE (table gather, LongRoPE switch in-kernel)",
    "attention": "dense causal GQA (TE scores, masked softmax, mix; functional KV cache)",
}
SPARSE_ATTENTION = ("InfLLM v2 (TVM TIR): mean-pooled fine + coarse keys, stage-1 block scores, "
                    "top-k rank, block-sparse masked softmax (host decode: a gather of the "
                    "selected blocks, kernels_sparse_decode.py); dense below dense_len "
                    "(kernels_infllmv2.py)")


def _act_dtype(dtype: DType) -> str:
    """Activations run in fp32: a float cast in the IR (bf16 -> f32) is a no-op here."""
    return "float32" if dtype.is_float else TVM_DTYPE[dtype]


def uncovered_ops(program: Program) -> list[str]:
    """IR ops of the program that `LOWERINGS` does not cover (preflight names them)."""
    used = {n.op for g in program.entries.values() for n in g.nodes}
    return sorted(op.value for op in used if op not in LOWERINGS)


def lower_program(program: Program, params: dict[str, np.ndarray],
                  host: HostDecode | None = None) -> tuple[tvm.IRModule, Signature]:
    """The Relax module of every entry point of `program` over `params` (see module doc).
    `host`: lower for an llvm CPU (HostDecode): prefill's linears as kernels_gemm's tiled GEMM,
    decode's 4-bit linears as hand-built GEMVs; None: the portable module the device builds
    schedule (TE linears throughout)."""
    missing = uncovered_ops(program)
    if missing:
        raise NotAvailableError(f"IR op(s) {', '.join(missing)} have no TVM lowering",
                                hint="see backends/tvm/README.md for the ops the tvm backend covers")
    bb = relax.BlockBuilder()
    meta = program.meta
    sparse = meta.get("sparse_config") or None
    ops = dict(OP_IMPLEMENTATIONS)
    if sparse:
        ops["attention"] = SPARSE_ATTENTION
    sig = Signature(params=list(params), ops=ops,
                    cache={"layers": program.num_layers, "kv_heads": int(meta["num_kv_heads"]),
                           "head_dim": int(meta["head_dim"]), "max_len": int(meta["max_len"]),
                           "dense_len": int(sparse.get("dense_len", 8192)) if sparse else None},
                    vocab_size=int(meta["vocab_size"]))
    host_funcs: dict = {}
    for name, graph in program.entries.items():
        env: dict[str, Any] = {}
        inputs = []
        for inp in graph.inputs:
            shape = []
            for d in inp.type.shape:
                if isinstance(d, str) and dims.is_name(d):
                    env.setdefault(d, tir.Var(d, "int64"))
                    shape.append(env[d])
                else:
                    shape.append(prim_dim(d, env))
            inputs.append(relax.Var(inp.name, relax.TensorType(shape, _act_dtype(inp.type.dtype))))
        pvars = {p: relax.Var(p.replace(".", "_"), relax.TensorType(list(a.shape), str(a.dtype)))
                 for p, a in params.items()}
        with bb.function(name, [*inputs, *pvars.values()]):
            entry = _Entry(bb, program, graph, pvars, env, host, host_funcs)
            with bb.dataflow():
                values: dict[str, relax.Expr] = dict(zip([i.name for i in graph.inputs], inputs))
                for n in graph.nodes:
                    out = entry.node(n, [values[i] for i in n.inputs])
                    values[n.name] = out if isinstance(out, relax.Var) else bb.emit(out)
                result = bb.emit_output(relax.Tuple([values[v] for v in graph.outputs.values()]))
            bb.emit_func_output(result)
        sig.entries[name] = EntrySignature([i.name for i in graph.inputs], list(graph.outputs))
    return bb.get(), sig
