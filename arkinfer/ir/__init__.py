"""ArkInfer's graph IR: trace a reference model, verify, optimise, interpret, save and print it.

    from arkinfer import ir
    program = ir.trace("./MiniCPM4.1-8B", shape_only=True)     # or a loaded model, or a config dict
    program = ir.run_passes(program)                           # fuse_qkv, fuse_gate_up, fold_rope_tables, dce
    print(ir.print_ir(program))
    out = ir.interpret(program, "prefill", {"tokens": ids, "positions": pos, "cache.0.k": ..., ...})
    logits, cache = ir.step(program, "decode", ids, pos, cache)  # the reference model's convention
    ir.save(program, "out/ir"); program = ir.load("out/ir")

Pieces: ops.py (the op set), types.py / dims.py (typed values, symbolic dims), graph.py (nodes,
graphs, programs), weights.py (weight store, quant annotations), infer.py (type rules),
verify.py, interpret.py (the meaning of every op), tracing.py + lower_aten.py (from torch.export),
passes/, serialize.py, printer.py, the committed demo dump (arkinfer/testing/golden.py).
"""

from __future__ import annotations

from arkinfer.ir.errors import (
    InterpretError,
    IRError,
    SchemaError,
    TraceError,
    UnsupportedOpError,
    IRVerifyError,
)
from arkinfer.ir.graph import ENTRY_POINTS, Graph, Input, Node, Program
from arkinfer.ir.interpret import empty_cache, interpret, step
from arkinfer.ir.ops import SPECS, Op, OpGroup, ops_in
from arkinfer.ir.passes import DEFAULT_PIPELINE, PASSES, run_passes
from arkinfer.ir.printer import print_graph, print_ir
from arkinfer.ir.serialize import SCHEMA_VERSION, load, program_to_json, save
from arkinfer.ir.tracing import trace
from arkinfer.ir.types import DType, TensorType
from arkinfer.ir.verify import verify
from arkinfer.ir.weights import QuantSpec, Weight, WeightStore

__all__ = [
    "DEFAULT_PIPELINE", "ENTRY_POINTS", "PASSES", "SCHEMA_VERSION", "SPECS", "DType", "Graph",
    "IRError", "Input", "InterpretError", "Node", "Op", "OpGroup", "Program", "QuantSpec",
    "SchemaError", "TensorType", "TraceError", "UnsupportedOpError", "IRVerifyError", "Weight",
    "WeightStore", "empty_cache", "interpret", "load", "ops_in", "print_graph", "print_ir",
    "program_to_json", "run_passes", "save", "step", "trace", "verify",
]
