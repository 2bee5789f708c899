"""The onnx backend's fused-op functions (fn_fused.py) and the host runner's swap to onnxruntime's
contrib ops (contrib_fused.py): arkinfer.RotaryGQA -> GroupQueryAttention, RMSNorm /
SkipRMSNorm -> (Skip)SimplifiedLayerNormalization. The fused graph equals the function-body graph
(prefill and decode steps, max abs diff and top-1) on a tiny Llama (GQA 4/2), a tiny dense
MiniCPM4 (LongRoPE switching at 64 tokens, scaled residuals) and the demo model (InfLLM v2 keeps
its function; only the norms fuse), and GroupQueryAttention alone equals the function on a
chunked prefill with a non-default softmax scale and rope_scale."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

ort = pytest.importorskip("onnxruntime", reason="pip install 'arkinfer[onnx]'")
onnx = pytest.importorskip("onnx")

from arkinfer.backend import LowerRequest, get_backend
from arkinfer.errors import NotAvailableError

BACKEND = get_backend("onnx")


def _ids(n: int, seed: int, vocab: int = 300) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _float_artifact(root: Path, config: dict) -> Path:
    from arkinfer.testing.synthetic import write_checkpoint

    src = write_checkpoint(root / "hf", config)
    BACKEND.lower(LowerRequest(model_dir=src, source_dir=src, recipe=None, dtype="f32",
                               target=None, out_dir=root / "artifact"))
    return root / "artifact"


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from arkinfer.models.configs import tiny_config

    return _float_artifact(tmp_path_factory.mktemp("fused-llama"), tiny_config("llama", vocab_size=300))


@pytest.fixture(scope="module")
def llama_int4(tmp_path_factory) -> Path:
    """tiny Llama, RTN 4-bit g32 asymmetric (zero points) in the gptq layout."""
    from arkinfer.models.configs import tiny_config
    from arkinfer.quant import QuantRecipe
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.calib_data import calibration_from_ids
    from arkinfer.quant.export import export_folder
    from arkinfer.testing.synthetic import write_checkpoint

    root = tmp_path_factory.mktemp("fused-llama-int4")
    src = write_checkpoint(root / "hf", tiny_config("llama", vocab_size=300))
    recipe = QuantRecipe("rtn", "gptq", 4, 32, sym=False)
    ids = torch.randint(3, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    folder = export_folder(calibrate(src, recipe, calibration_from_ids(ids), root / "calib"),
                           root / "q")
    BACKEND.lower(LowerRequest(model_dir=folder, source_dir=src, recipe=recipe, dtype="f32",
                               target=None, out_dir=root / "artifact"))
    return root / "artifact"


@pytest.fixture(scope="module")
def minicpm_dense(tmp_path_factory) -> Path:
    from arkinfer.models.configs import tiny_config

    return _float_artifact(tmp_path_factory.mktemp("fused-minicpm"),
                           tiny_config("minicpm", vocab_size=300))


def _steps(runner, ids: list[int], prompt: int) -> torch.Tensor:
    """Logits [len(ids), V]: every row of a prefill of ids[:prompt], then one decode step per
    remaining token."""
    first = runner.window_logits(ids[:prompt])
    return torch.cat([first, *(runner.decode(t)[None] for t in ids[prompt:])])


def _compare(artifact: Path, ids: list[int], prompt: int) -> tuple[float, float]:
    fused = BACKEND.load(artifact, ops="contrib", threads=1)
    plain = BACKEND.load(artifact, ops="function", threads=1)
    a, b = _steps(fused, ids, prompt), _steps(plain, ids, prompt)
    return float((a - b).abs().max()), float((a.argmax(-1) == b.argmax(-1)).float().mean())


def test_lowering_emits_the_fused_functions(llama):
    model = onnx.load(str(llama / "model.onnx"), load_external_data=False)
    used = [n.op_type for n in model.graph.node if n.domain == "arkinfer"]
    assert used.count("RotaryGQA") == 2            # one per layer
    assert used.count("RMSNorm") == 1              # layer 0's input norm reads the embedding
    assert used.count("SkipRMSNorm") == 4          # every other norm reads a residual add
    assert {f.name for f in model.functions} == {"RotaryGQA", "RMSNorm", "SkipRMSNorm"}
    assert not any(n.op_type in ("Cos", "Softmax", "ReduceMean") for n in model.graph.node)
    props = {p.key: p.value for p in model.metadata_props}
    assert props["arkinfer.max_positions"] == "2048"  # rows of GQA's cos/sin caches at load


def test_runner_swaps_every_function_for_contrib_ops(llama):
    runner = BACKEND.load(llama, ops="contrib", threads=1)
    assert runner.fused == {"RotaryGQA": 2, "RMSNorm": 1, "SkipRMSNorm": 4} and not runner.notes
    assert runner.packed_qkv == 0  # a float build has MatMul projections: nothing to pack


@pytest.mark.parametrize("prompt", [1, 17])
def test_fused_llama_equals_function_bodies(llama, prompt):
    diff, top1 = _compare(llama, _ids(prompt + 6, seed=prompt), prompt)
    print(f"tiny llama, prompt {prompt} + 6 decode steps: max abs diff {diff:.2e}, top-1 {top1}")
    assert diff < 1e-4 and top1 == 1.0


def test_int4_llama_packs_qkv_and_equals_function_bodies(llama_int4):
    """MatMulNBits (accuracy_level 0) with q/k/v packed into one node feeding GQA's packed
    query and gate/up packed into one node and a Split, zero points concatenated with their
    rows: the function-body graph's numbers."""
    runner = BACKEND.load(llama_int4, ops="contrib", threads=1)
    assert runner.packed_qkv == 2 and runner.packed_siblings == 2 and runner.replaced == 14
    assert not runner.notes
    diff, top1 = _compare(llama_int4, _ids(26, seed=11), 20)
    print(f"tiny llama int4 g32, 20 + 6 decode steps: max abs diff {diff:.2e}, top-1 {top1}")
    assert diff < 1e-4 and top1 == 1.0


def _rewritten_prefill(artifact: Path, level: int, ids: list[int], edit=None):
    """(rewrite info, op types, logits [1, T, V]) of the host rewrite of `artifact`'s graph
    (after `edit(model)`, if given), prefilling `ids` from an empty cache in one plain run."""
    from arkinfer.backends.onnx.host_graph import rewrite

    model = onnx.load(str(artifact / "model.onnx"))
    if edit is not None:
        edit(model)
    info = rewrite(model, "contrib", level)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"tokens": np.array([ids], np.int64), "positions": np.arange(len(ids), dtype=np.int64)}
    for i in sess.get_inputs():
        if i.name.startswith("past."):
            feeds[i.name] = np.zeros([0 if isinstance(d, str) else d for d in i.shape], np.float32)
    return info, [n.op_type for n in model.graph.node], sess.run(None, feeds)[0]


@pytest.mark.parametrize("level", [0, 4])
def test_packed_gate_up_is_bit_identical_to_two_projections(llama_int4, monkeypatch, level):
    """Packing gate and up (rows concatenated, a Split after) changes no bit of the logits, with
    fp32 (level 0) or int8 (level 4) activations: the same graph rewritten without the packing
    is the independent reference."""
    from arkinfer.backends.onnx import contrib_pack

    ids = _ids(9, seed=3)
    info, ops, packed = _rewritten_prefill(llama_int4, level, ids)
    with monkeypatch.context() as m:
        m.setattr(contrib_pack, "pack_siblings", lambda model: 0)
        plain_info, plain_ops, plain = _rewritten_prefill(llama_int4, level, ids)
    assert info["packed_siblings"] == 2 and plain_info["packed_siblings"] == 0
    assert ops.count("MatMulNBits") == plain_ops.count("MatMulNBits") - 2 and ops.count("Split") == 2
    np.testing.assert_array_equal(packed, plain)


def _strip_node_names(model) -> None:
    for node in model.graph.node:
        node.name = ""


def test_packing_does_not_need_node_names(llama_int4):
    """ONNX node names are optional: a graph whose nodes have none packs the same projections
    (nodes are told apart by their outputs) and computes the same logits."""
    ids = _ids(5, seed=4)
    named, _, a = _rewritten_prefill(llama_int4, 0, ids)
    unnamed, _, b = _rewritten_prefill(llama_int4, 0, ids, edit=_strip_node_names)
    assert (unnamed["packed_qkv"], unnamed["packed_siblings"]) == (2, 2)
    assert (named["packed_qkv"], named["packed_siblings"]) == (2, 2)
    np.testing.assert_array_equal(a, b)


def test_fused_llama_matches_reference_and_decode_equals_prefill(llama):
    from arkinfer.pipeline.reference_runner import ReferenceRunner

    runner = BACKEND.load(llama, ops="contrib", threads=1)
    ids = _ids(40, seed=3)
    window = runner.window_logits(ids)
    steps = _steps(runner, ids, 30)
    torch.testing.assert_close(steps[30:], window[30:], atol=1e-4, rtol=1e-4)
    ref = ReferenceRunner(llama.parent / "hf").window_logits(ids)  # float build: the source
    assert float((window - ref).abs().max()) < 1e-3


def test_fused_minicpm_dense_crosses_the_longrope_switch(minicpm_dense):
    """tiny MiniCPM4 without sparse_config: GQA with LongRoPE (short table below 64 tokens,
    long from there: a Where over two cos/sin caches), decode steps crossing 64."""
    runner = BACKEND.load(minicpm_dense, ops="contrib", threads=1)
    assert runner.fused["RotaryGQA"] == 2 and not runner.notes
    diff, top1 = _compare(minicpm_dense, _ids(72, seed=5), 58)
    print(f"tiny minicpm dense, 58 + 14 decode steps across 64: max abs diff {diff:.2e}")
    assert diff < 1e-4 and top1 == 1.0


def test_demo_model_fuses_norms_and_keeps_infllmv2(tmp_path):
    from arkinfer.frontend.demo import demo_model_path

    src = demo_model_path()
    BACKEND.lower(LowerRequest(model_dir=src, source_dir=src, recipe=None, dtype="f32",
                               target=None, out_dir=tmp_path / "demo"))
    runner = BACKEND.load(tmp_path / "demo", ops="contrib", threads=1)
    assert set(runner.fused) == {"RMSNorm", "SkipRMSNorm"}
    model = onnx.load(str(tmp_path / "demo" / "model.onnx"), load_external_data=False)
    used = {n.op_type for n in model.graph.node}
    assert "InfLLMv2Attention" in used and "RotaryGQA" not in used
    diff, top1 = _compare(tmp_path / "demo", _ids(30, seed=7, vocab=2048), 24)
    print(f"demo model, 24 + 6 decode steps: max abs diff {diff:.2e}")
    assert diff < 1e-4 and top1 == 1.0


def test_shared_kv_buffers_grow_and_equal_function_bodies(llama, monkeypatch):
    """The fused llama's cache is bound buffers GQA updates in place; starting them at 8 rows
    makes a 5-token prefill + 14 decode steps grow them twice (8 -> 16 -> 32)."""
    from arkinfer.backends.onnx import kv_shared

    monkeypatch.setattr(kv_shared, "INITIAL", 8)
    runner = BACKEND.load(llama, ops="contrib", threads=1)
    plain = BACKEND.load(llama, ops="function", threads=1)
    assert runner.shared_kv is not None and plain.shared_kv is None
    ids = _ids(19, seed=13)
    a, b = _steps(runner, ids, 5), _steps(plain, ids, 5)
    assert runner.shared_kv.capacity == 32
    assert float((a - b).abs().max()) < 1e-4 and bool((a.argmax(-1) == b.argmax(-1)).all())
    runner.reset()
    assert runner.shared_kv.capacity == 8
    torch.testing.assert_close(runner.window_logits(ids), a, atol=1e-4, rtol=1e-4)


def test_context_past_the_rope_caches_is_refused(llama):
    runner = BACKEND.load(llama, ops="contrib", threads=1)
    runner.max_positions = 10
    with pytest.raises(NotAvailableError, match="10 rows"):
        runner.prefill(_ids(12, seed=1))


# ---------------------------------------------------------------- one node alone
def _single(node_model_fn, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(node_model_fn().SerializeToString(),
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _gqa_model(head: int, fused: bool, inv: np.ndarray, scale: float, rope_scale: float):
    from onnx import TensorProto, helper, numpy_helper

    from arkinfer.backends.onnx import fn_fused
    from arkinfer.backends.onnx.contrib_fused import use_fused_ops

    f32, hq, hkv = TensorProto.FLOAT, 4, 2
    vi = helper.make_tensor_value_info
    node = helper.make_node(fn_fused.ROTARY_GQA, ["q", "k", "v", "pk", "pv", "pos", "inv"],
                            ["out", "ok", "ov"], name="attn", domain="arkinfer", num_heads=hq,
                            kv_num_heads=hkv, scale=scale, rope_scale=rope_scale)
    graph = helper.make_graph(
        [node], "g", [vi("q", f32, [1, "T", hq * head]), vi("k", f32, [1, "T", hkv * head]),
                      vi("v", f32, [1, "T", hkv * head]), vi("pk", f32, [1, hkv, "P", head]),
                      vi("pv", f32, [1, hkv, "P", head]),
                      vi("pos", TensorProto.INT64, ["T"])],
        [vi("out", f32, None), vi("ok", f32, None), vi("ov", f32, None)],
        [numpy_helper.from_array(inv, "inv")])
    model = helper.make_model(graph, ir_version=10, functions=[fn_fused.rotary_gqa_function()],
                              opset_imports=[helper.make_opsetid("", 21),
                                             helper.make_opsetid("arkinfer", 1)])
    notes: list[str] = []
    if fused:
        _, notes = use_fused_ops(model, max_positions=64)
    return model, notes


@pytest.mark.parametrize("p,t", [(0, 9), (11, 5), (16, 1)])
def test_group_query_attention_equals_the_function(p, t):
    """Chunked prefill (P > 0, T > 1) too; scale and rope_scale not the defaults."""
    head, rng = 32, np.random.default_rng(p + t)
    inv = (1.0 / 10000 ** (np.arange(0, head, 2) / head)).astype(np.float32)
    feeds = {"q": rng.standard_normal((1, t, 4 * head), np.float32),
             "k": rng.standard_normal((1, t, 2 * head), np.float32),
             "v": rng.standard_normal((1, t, 2 * head), np.float32),
             "pk": rng.standard_normal((1, 2, p, head), np.float32),
             "pv": rng.standard_normal((1, 2, p, head), np.float32),
             "pos": np.arange(p, p + t, dtype=np.int64)}
    want = _single(lambda: _gqa_model(head, False, inv, 0.3, 0.9)[0], feeds)
    model, notes = _gqa_model(head, True, inv, 0.3, 0.9)
    assert not notes and model.graph.node[-1].op_type == "GroupQueryAttention"
    got = _single(lambda: model, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-5)


def test_head_dim_gqa_cannot_take_stays_a_function():
    head = 24  # GroupQueryAttention's rotary wants head_dim % 16 == 0
    inv = (1.0 / 10000 ** (np.arange(0, head, 2) / head)).astype(np.float32)
    model, notes = _gqa_model(head, True, inv, 0.2, 1.0)
    assert len(notes) == 1 and "head_dim=24" in notes[0]
    assert model.graph.node[0].op_type == "RotaryGQA"
