"""`self:N` drafts and EAGLE-3 heads on the onnx runtime (backends/onnx/layer_graph.py): on the
dense demo's onnx artifact (gptq 4-bit, built with `--draft eagle3:demo`), greedy speculative
output equals plain greedy decoding token for token; the first-N-layer graph's logits and the
recorded taps equal ArkInfer's reference model run on the artifact's own quantised weights (its
`hf/` folder, dequantised: what verify's fidelity check compares with); the taps follow the cache
through truncate and reset; a wrong N is refused. On the demo's InfLLM v2 graph (its
sparse_config) truncate cuts the compressed-key caches back exactly, and speculation past
dense_len gives plain greedy's tokens.

Tolerances: the onnx graph and the reference compute the same dequantised weights in float32
(MatMulNBits at accuracy_level 0); only the kernels' summation order differs. Measured on the
demo: logits of the first N layers within 4e-6 (values up to ~15), taps within 1.3e-6 (values up
to ~3.2); the bound 1e-4 leaves a margin of 25x, while a tap taken one norm off (the stream in the
middle of a layer, or the next layer's input) moves them by more than 0.1."""

from __future__ import annotations

import json

import pytest
import torch
from spec_support import repetitive_prompt

from arkinfer.backend import LowerRequest, get_backend
from arkinfer.errors import ArkError
from arkinfer.pipeline.artifact import load_runner
from arkinfer.pipeline.build import build
from arkinfer.pipeline.draft import parse_draft
from arkinfer.pipeline.draft_artifact import artifact_draft, check_draft_request
from arkinfer.pipeline.plan import resolve_plan
from arkinfer.pipeline.reference_runner import ReferenceRunner
from arkinfer.speculative import (
    ModelDraft,
    SpecStats,
    plain_generate,
    speculative_generate,
)

BACKEND = get_backend("onnx")
if not BACKEND.available():
    pytest.skip(f"onnx: toolchain not installed ({BACKEND.install_hint()})",
                allow_module_level=True)

from arkinfer.backends.onnx.runner import OnnxRunner

LAYERS = 4  # the demo's num_hidden_layers
TAPS = (1, 2, 3)  # the demo head's tap layers
ATOL = 1e-4  # module docstring
PROMPT = "Question: What is bread made from? Answer:"


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, dense_demo):
    """The dense demo as an onnx artifact (gptq 4-bit) carrying the demo's EAGLE-3 head."""
    out = tmp_path_factory.mktemp("spec-onnx") / "demo-onnx"
    return build(resolve_plan(str(dense_demo), target="host", quant="int4", backend="onnx",
                              out=out, draft="eagle3:demo")).path


@pytest.fixture(scope="module")
def target(artifact) -> OnnxRunner:
    runner = OnnxRunner(artifact, threads=1)
    assert runner.speculates and runner.shared_kv is not None  # the default, fused graph
    return runner


@pytest.fixture(scope="module")
def reference(artifact) -> ReferenceRunner:
    """ArkInfer's reference model on the artifact's own quantised weights (dequantised)."""
    return ReferenceRunner(artifact / "hf", dense=True)


def _greedy_equal(target, spec: str, prompt: list[int], new: int = 40, k: int = 4) -> SpecStats:
    plain = list(plain_generate(target, prompt, new))
    stats = SpecStats()
    assert list(speculative_generate(target, parse_draft(spec, target), prompt, new, k=k,
                                     stats=stats)) == plain, spec
    assert stats.drafted > 0 and stats.emitted == new
    return stats


@pytest.mark.parametrize("layers", [1, LAYERS - 1])
def test_greedy_self_draft_gives_plain_tokens(target, layers):
    draft = parse_draft(f"self:{layers}", target)
    assert isinstance(draft, ModelDraft) and isinstance(draft.runner, OnnxRunner)
    assert draft.runner.layer_count == layers and draft.runner.shared_kv is not None
    for prompt in (target.tokenize("Once upon a time"), repetitive_prompt(target)):
        _greedy_equal(target, f"self:{layers}", prompt)


@pytest.mark.parametrize("ops", ["nbits", "function"])
def test_self_draft_in_the_other_ops_modes(artifact, ops):
    runner = OnnxRunner(artifact, ops=ops, threads=1)
    draft = runner.first_layers(2)
    assert draft.ops == ops and draft.layer_count == 2
    _greedy_equal(runner, "self:2", runner.tokenize("The little dog"), new=24)


@torch.no_grad()
def test_first_layers_logits_equal_the_reference_first_layers(target, reference, artifact):
    """The cut graph against the reference model's own early exit on the same weights, and its
    cache through extend / truncate; nothing is written (the artifact and the host cache)."""
    before = sorted(p for p in artifact.rglob("*"))
    cache_files = sorted(p for p in target.graph_file.parent.parent.rglob("*"))
    ids = target.tokenize("The little dog ran to the park, and then it sat down by the tree")
    for layers in range(1, LAYERS):
        draft = target.first_layers(layers)
        ours = draft.window_logits(ids)
        expected = reference.first_layers(layers).window_logits(ids)
        assert (ours - expected).abs().max().item() <= ATOL, layers
        assert torch.equal(ours.argmax(-1), expected.argmax(-1))
        draft.reset()
        draft.prefill(ids[:5])
        draft.extend([7, 8, 9])  # a rejected draft
        draft.truncate(5)
        torch.testing.assert_close(draft.extend(ids[5:]), ours[5:], atol=ATOL, rtol=0)
    # the full graph again: its own session was left alone
    torch.testing.assert_close(target.window_logits(ids), reference.window_logits(ids),
                               atol=ATOL, rtol=0)
    assert sorted(p for p in artifact.rglob("*")) == before
    assert sorted(p for p in target.graph_file.parent.parent.rglob("*")) == cache_files


def _stepped_taps(runner, ids: list[int]) -> torch.Tensor:
    """Taps after a prefill, an extend, a truncation, another extend and three decode steps."""
    runner.enable_taps(TAPS)
    runner.prefill(ids[:6])
    runner.extend(ids[6:10])
    runner.truncate(8)
    runner.extend(ids[8:-3])
    for token in ids[-3:]:
        runner.decode(token)
    return runner.taps.rows()


@pytest.mark.parametrize("ops", ["contrib", "nbits", "function"])
def test_taps_match_the_reference(artifact, reference, ops):
    """contrib: the taps are SkipSimplifiedLayerNormalization sums read through the shared KV
    buffers (decode steps: the bound fast path); nbits / function: arkinfer.SkipRMSNorm sums
    with the numpy cache."""
    runner = OnnxRunner(artifact, ops=ops, threads=1)
    ids = runner.tokenize(PROMPT)
    want = _stepped_taps(reference, ids)
    got = _stepped_taps(runner, ids)
    assert got.shape == want.shape == (len(ids), len(TAPS) * runner.hidden_size)
    assert (got - want).abs().max().item() <= ATOL
    reference.disable_taps()


def test_tap_rows_follow_truncate_and_reset(target):
    ids = target.tokenize(PROMPT)
    plain_session = target.session
    target.enable_taps(TAPS)
    assert target.session is not plain_session  # a session of its own with the tap outputs
    target.prefill(ids[:6])
    assert target.taps.length == 6
    target.extend(ids[6:10])
    assert target.taps.length == 10
    rows = target.taps.rows()
    target.truncate(7)
    assert target.taps.length == 7 and torch.equal(target.taps.rows(), rows[:7])
    target.decode(ids[7])  # the shared-buffer decode step records its row too
    assert target.taps.length == 8 == target.pos
    torch.testing.assert_close(target.taps.rows(7, 8), rows[7:8], atol=ATOL, rtol=0)
    target.reset()
    assert target.taps.length == 0
    target.disable_taps()
    assert target.session is plain_session and target.outputs == [o.name for o in
                                                                  plain_session.get_outputs()]
    with pytest.raises(ArkError, match="records no taps"):
        target.taps  # noqa: B018


def test_eagle3_greedy_equals_plain(target):
    for prompt in (target.tokenize(PROMPT), repetitive_prompt(target)):
        for k in (1, 4):
            stats = _greedy_equal(target, "eagle3:demo", prompt, k=k)
            assert stats.accepted > 0  # the head was trained on the demo's own outputs
    assert target._taps is None  # the generation's end turned the taps off


def test_the_carried_head_is_recorded_and_verified(artifact, target):
    """`build --draft eagle3:demo --backend onnx`: the head is in the artifact and verify's
    speculative check ran with it on the onnx runner."""
    manifest = json.loads((artifact / "arkinfer.json").read_text())
    assert manifest["draft"]["kind"] == "eagle3" and manifest["draft"]["tap_layers"] == list(TAPS)
    spec = manifest["verification"]["speculative"]
    assert spec["checked"] and spec["identical"] and spec["draft"].startswith("eagle3")
    draft = artifact_draft(artifact, manifest, load_runner(artifact)[1])
    assert draft.name.startswith("eagle3")


@pytest.mark.parametrize("spec", ["self:0", f"self:{LAYERS}", "self:99"])
def test_a_layer_count_out_of_range_is_refused(target, spec):
    with pytest.raises(ArkError, match=rf"must be 1\.\.{LAYERS - 1}"):
        parse_draft(spec, target)
    with pytest.raises(ArkError, match=rf"take 1\.\.{LAYERS - 1}"):
        target.first_layers(int(spec.removeprefix("self:")))


@pytest.fixture(scope="module")
def sparse_graph(tmp_path_factory):
    """The demo (with its sparse_config) lowered in float32: an InfLLM v2 graph."""
    from arkinfer.frontend.demo import demo_model_path

    out = tmp_path_factory.mktemp("sparse-onnx") / "artifact"
    BACKEND.lower(LowerRequest(model_dir=demo_model_path(), source_dir=demo_model_path(),
                               recipe=None, dtype="f32", target=None, out_dir=out))
    return out


DENSE_LEN = 1024  # the demo's sparse_config.dense_len


def past_dense_len(runner, length: int) -> list[int]:
    """`length` tokens of the demo's text repeated (the demo's dense_len is 1024)."""
    return (runner.tokenize(PROMPT + " Flour, water, salt and yeast.") * 100)[:length]


def test_an_infllmv2_graph_truncates_its_compressed_keys(sparse_graph):
    """Past dense_len, a cache cut back to any length inside a draft (on a fine-kernel edge, one
    either side of it, on a coarse-kernel edge) then decodes the logits of a fresh prefill of
    that length: the fine / coarse caches keep exactly the kernels the kept keys complete."""
    runner = OnnxRunner(sparse_graph, threads=1)
    assert runner.speculates and len(runner.compressed) == 2 * LAYERS
    ids = past_dense_len(runner, DENSE_LEN + 120)
    start = DENSE_LEN + 40                     # a draft of 70 crosses 1088, 1104, 1120 and 1152
    runner.prefill(ids[:start])
    for kept in (0, 7, 8, 9, 24, 25, 69):
        runner.truncate(runner.pos)            # no-op: the extend below starts at `start`
        runner.extend(ids[start:start + 70])
        runner.truncate(start + kept)
        fine = runner.cache["past.0.fine"].shape[2]
        assert fine == (start + kept - 32) // 16 + 1
        cut = runner.decode(ids[start + kept])
        fresh = OnnxRunner(sparse_graph, threads=1)
        fresh.prefill(ids[:start + kept])
        assert torch.allclose(cut, fresh.decode(ids[start + kept]), atol=1e-5)
        runner.truncate(start)


@pytest.mark.parametrize("spec", ["lookup", "self:2", "eagle3:demo"])
def test_speculation_on_an_infllmv2_graph_past_dense_len(sparse_graph, spec):
    """InfLLM v2 and speculation together: greedy output past dense_len equals plain."""
    runner = OnnxRunner(sparse_graph, threads=1)
    prompt = past_dense_len(runner, DENSE_LEN + 16)
    plain = list(plain_generate(runner, prompt, 24))
    fast = list(speculative_generate(runner, parse_draft(spec, runner), prompt, 24, k=4))
    assert fast == plain


def test_the_plan_takes_layer_drafts_on_sparse_onnx_models(dense_demo):
    raw = json.loads((dense_demo / "config.json").read_text())
    for spec in ("self:2", "eagle3:demo"):
        check_draft_request(spec, None, raw, "onnx")
        check_draft_request(spec, None, {**raw, "sparse_config": {"dense_len": 1024}}, "onnx")


def test_a_float_llama_graph(tmp_path, tiny_checkpoint):
    """Another architecture (Llama: unscaled embedding and residuals) lowered in float32: the
    layer finder's taps and cut graph against the reference model on the same weights."""
    src = tiny_checkpoint("llama", vocab_size=300)
    BACKEND.lower(LowerRequest(model_dir=src, source_dir=src, recipe=None, dtype="f32",
                               target=None, out_dir=tmp_path / "artifact"))
    runner = OnnxRunner(tmp_path / "artifact", threads=1)
    reference = ReferenceRunner(src)
    ids = torch.randint(3, 300, (20,), generator=torch.Generator().manual_seed(0)).tolist()
    layers = tuple(range(1, runner.layer_count))
    runner.enable_taps(layers)
    reference.enable_taps(layers)
    for r in (runner, reference):
        r.prefill(ids[:12])
        r.extend(ids[12:])
    assert (runner.taps.rows() - reference.taps.rows()).abs().max().item() <= ATOL
    runner.disable_taps()
    draft = runner.first_layers(1)
    expected = reference.first_layers(1).window_logits(ids)
    assert (draft.window_logits(ids) - expected).abs().max().item() <= ATOL
