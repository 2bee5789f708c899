"""IR -> Relax lowering of the tvm backend, checked against independent references: the IR
interpreter (the meaning of every op) for whole prefill / decode steps of the demo model, and
numpy for the int4 layout and kernel. One llvm compile per module (module-scoped fixtures)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from arkinfer.backend import get_backend

BACKEND = get_backend("tvm")
if not BACKEND.available():
    pytest.skip(f"tvm is not installed: {BACKEND.install_hint()}", allow_module_level=True)

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

from arkinfer import ir  # noqa: E402
from arkinfer.backends.tvm import kernels_linear  # noqa: E402
from arkinfer.backends.tvm.compile import build, device_target  # noqa: E402
from arkinfer.backends.tvm.default_pipeline import schedule  # noqa: E402
from arkinfer.backends.tvm.lower_relax import lower_program  # noqa: E402
from arkinfer.backends.tvm.session import TVMSession  # noqa: E402
from arkinfer.backends.tvm.weights import (  # noqa: E402
    dequantize_q4,
    pack_q4,
    program_params,
)
from arkinfer.lowering.source_weights import SourceWeights  # noqa: E402
from arkinfer.frontend.checkpoint import resolve_model_path  # noqa: E402
from arkinfer.quant.weight import QuantizedWeight  # noqa: E402
from arkinfer.testing.synthetic import random_q4_weight  # noqa: E402

PROMPT = [1, 17, 300, 5, 2000, 42, 7, 99]


@pytest.fixture(scope="module", params=[("fold_rope_tables", "dce"), ()],
                ids=["rope_table", "rope"])
def demo_module(request):
    """(host session, the same program with weights for the interpreter): the demo model's IR
    lowered with the backend's passes (rope as a table) and without them (rope from inv_freq)."""
    src = resolve_model_path("demo")
    program = ir.run_passes(ir.trace(str(src), dtype=torch.float32, dense=True), request.param)
    params, _ = program_params(program, SourceWeights(src))  # weights read from the folder
    b = build(program, params, devices=())
    return TVMSession(b.host_exec, tvm.cpu(), b.params, b.signature), program


def test_prefill_and_decode_match_the_interpreter(demo_module):
    session, program = demo_module
    cache = ir.empty_cache(program)
    ids = torch.tensor([PROMPT])
    ref, cache = ir.step(program, "prefill", ids, torch.arange(len(PROMPT)), cache)
    session.reset()
    got = session.step(PROMPT)
    np.testing.assert_allclose(got, ref[0].numpy(), atol=1e-4, rtol=1e-4)
    for pos, tok in enumerate([11, 1234, 3], start=len(PROMPT)):  # decode entry, cache grows
        ref, cache = ir.step(program, "decode", torch.tensor([[tok]]), torch.tensor([pos]), cache)
        np.testing.assert_allclose(session.step([tok])[-1], ref[0, -1].numpy(),
                                   atol=1e-4, rtol=1e-4)
    # a second prefill chunk over a non-empty cache (P > 0: the causal mask's offset)
    ref, cache = ir.step(program, "prefill", torch.tensor([[8, 9, 10]]),
                         torch.arange(len(PROMPT) + 3, len(PROMPT) + 6), cache)
    np.testing.assert_allclose(session.step([8, 9, 10]), ref[0].numpy(), atol=1e-4, rtol=1e-4)


def test_direct_calls_equal_the_stateful_calls_rpc_uses(demo_module):
    """A local session calls its entries directly; remote ones go through set_input /
    invoke_stateful / get_outputs. Both give the same logits and the same grown cache."""
    session, _ = demo_module
    results = []
    for entries in (session._entries, None):
        session._entries = entries
        session.reset()
        results.append([session.step(PROMPT), session.step([11]), session.step([1234])])
    for direct, stateful in zip(*results):
        np.testing.assert_array_equal(direct, stateful)


def test_decode_swaps_unit_dims_as_views_not_copies():
    """Decode's [1, 1, H, D] <-> [1, H, 1, D] swaps keep the memory order: they lower to
    reshapes (views) and no copy kernel remains in the decode step; prefill (T > 1) keeps
    its permutes."""
    src = resolve_model_path("demo")
    program = ir.run_passes(ir.trace(str(src), dtype=torch.float32, dense=True), ("dce",))
    params, _ = program_params(program, SourceWeights(src))
    mod, _ = lower_program(program, params)
    decode, prefill = mod["decode"].script(), mod["prefill"].script()
    assert "R.permute_dims" not in decode and "R.reshape" in decode
    assert "R.permute_dims" in prefill
    # after fusion and relax's rewrite of lone reshapes into views, no kernel of the decode
    # step copies for a reshape (a chain of reshapes would fuse into a copy kernel, hence a
    # reshape of a reshape reshapes the first input)
    fused = schedule(mod, tvm.target.Target("llvm"))
    scheduled = relax.transform.RewriteDataflowReshape()(fused)["decode"].script()
    kernels = re.findall(r"R\.call_tir\((\w+),", scheduled)
    assert kernels and not [k for k in kernels if re.fullmatch(r"(fused_)?(reshape\d*_?)+", k)]


def test_session_refuses_bad_tokens(demo_module):
    session, _ = demo_module
    session.reset()
    with pytest.raises(Exception, match="outside the vocabulary"):
        session.step([1, 2048])


@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
def test_q4_layout_is_lossless_and_the_kernel_dequantises_inside_the_sum(sym):
    qw = random_q4_weight(48, 96, 32, sym)
    packed = pack_q4(qw)
    assert packed["q4_codes"].dtype == np.uint32 and packed["q4_codes"].shape == (48, 12)
    assert packed["q4_scales"].dtype == np.float16  # fp16-exact scales stay fp16
    assert ("q4_zeros" in packed) == (not sym)
    # byte layout: column 8w+i of row n sits in bits 4i..4i+3 of word w
    codes = qw.codes.numpy()
    assert (packed["q4_codes"][3, 2] >> 20) & 15 == codes[3, 8 * 2 + 5]
    dense = dequantize_q4(packed, 96)
    np.testing.assert_array_equal(dense, qw.dequantize().numpy())

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 3, 96], "float32"))
    args = [relax.Var(k, relax.TensorType(list(v.shape), str(v.dtype))) for k, v in packed.items()]
    with bb.function("main", [x, *args]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit_te(kernels_linear.linear_q4, x, *args))
        bb.emit_func_output(y)
    mod = bb.get()
    # after the GPU default pipeline (dlight) it is still one kernel: no dequantise pass
    scheduled = schedule(mod, device_target("adreno"))
    assert [gv.name_hint for gv, f in scheduled.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc)] == ["linear_q4"]
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    xs = np.random.default_rng(0).standard_normal((1, 3, 96)).astype(np.float32)
    got = vm["main"](tvm.runtime.tensor(xs), *[tvm.runtime.tensor(v) for v in packed.values()])
    np.testing.assert_allclose(got.numpy(), xs @ dense.T, rtol=1e-5, atol=1e-5)


def test_scales_not_exact_in_fp16_are_kept_in_fp32():
    qw = random_q4_weight(8, 32, 32, True)
    qw = QuantizedWeight(qw.codes, qw.scales + 1e-6, qw.zeros, bits=4, group_size=32, sym=True)
    packed = pack_q4(qw)
    assert packed["q4_scales"].dtype == np.float32
    np.testing.assert_array_equal(dequantize_q4(packed, 32), qw.dequantize().numpy())
