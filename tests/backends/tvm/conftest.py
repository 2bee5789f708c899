"""Shared by the tvm tests: the demo built once per session for android by the real CLI; the
demo traced and RTN-packed for direct lowering; a runner of one small Relax function on the
host build; a random packed 4-bit linear for the decode GEMV tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tvm_demo_artifact(tmp_path_factory) -> tuple[Path, dict]:
    """(folder, manifest) of `arkinfer build demo --target android --quant q4_0` (about a
    minute: trace, quantise, host + adreno + mali builds, verify)."""
    from typer.testing import CliRunner

    from arkinfer.cli.main import app

    out = tmp_path_factory.mktemp("tvm") / "demo.android.q4_0"
    res = CliRunner().invoke(app, ["build", "demo", "--target", "android", "--quant", "q4_0",
                                   "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    return out, json.loads((out / "arkinfer.json").read_text())


@pytest.fixture(scope="session")
def demo_q4():
    """(program, params): the demo traced dense, every linear RTN 4-bit g32 (fp16 scales)."""
    import torch

    from arkinfer import ir
    from arkinfer.backends.tvm.weights import program_params
    from arkinfer.lowering.source_weights import SourceWeights
    from arkinfer.frontend.checkpoint import resolve_model_path
    from arkinfer.quant.rtn import quantize_rtn

    class RTNWeights(SourceWeights):
        def quantised(self, weight_name, shape):
            w = self.ckpt.weights.get(weight_name).to(torch.float32)
            return quantize_rtn(w, 4, 32, scale_dtype=torch.float16,
                                name=weight_name.removesuffix(".weight"))

    src = resolve_model_path("demo")
    program = ir.run_passes(ir.trace(str(src), dtype=torch.float32, dense=True),
                            ("fold_rope_tables", "dce"))
    params, _ = program_params(program, RTNWeights(src))
    return program, params


@pytest.fixture
def run_host():
    """run(build_body, inputs, names): a Relax `main(*inputs)` whose body is
    `build_body(bb, *vars)`, compiled for this CPU as the host build is; returns its result."""

    def run(build_body, inputs, names):
        import tvm
        from tvm import relax

        from arkinfer.backends.tvm.default_pipeline import finish, host_target, schedule

        bb = relax.BlockBuilder()
        params = [relax.Var(n, relax.TensorType(list(a.shape), str(a.dtype)))
                  for n, a in zip(names, inputs)]
        with bb.function("main", params):
            with bb.dataflow():
                out = bb.emit_output(build_body(bb, *params))
            bb.emit_func_output(out)
        target = host_target()
        vm = relax.VirtualMachine(finish(schedule(bb.get(), target), target), tvm.cpu())
        return vm["main"](*[tvm.runtime.tensor(a) for a in inputs])

    return run


@pytest.fixture
def random_linear():
    """make(n, k, group, sym, bias) -> (dense W f32 [n, k], x [1, 1, k], inputs, names, split):
    a random 4-bit weight packed as the artifact stores it (weights.pack_q4), its numpy
    dequantisation, an activation row, the Relax inputs [x, codes, scales, zeros?, bias?] with
    their names, and split(rest) -> (codes, scales, zeros | None, bias | None) for a body."""
    import numpy as np

    from arkinfer.backends.tvm.weights import dequantize_q4, pack_q4
    from arkinfer.testing.synthetic import random_q4_weight

    def make(n, k, group, sym, bias):
        packed = pack_q4(random_q4_weight(n, k, group, sym))
        rng = np.random.default_rng(1)
        x = rng.standard_normal((1, 1, k)).astype(np.float32)
        inputs, names = [x, *packed.values()], ["x", *packed]
        if bias:
            inputs.append(rng.standard_normal(n).astype(np.float32))
            names.append("bias")

        def split(rest):
            return rest[0], rest[1], None if sym else rest[2], rest[-1] if bias else None

        return dequantize_q4(packed, k), x, inputs, names, split

    return make
