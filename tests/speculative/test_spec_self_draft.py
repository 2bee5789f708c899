"""The `self:N` draft (the target's first N layers, its final norm and LM head): greedy output equal
to plain greedy decoding on the demo's gguf and reference artifacts; the truncated GGUF's bytes
and its logits against the float reference model run with its first N layers by hand; more
layers accept more draft tokens; a wrong N or runtime is refused before any work."""

from __future__ import annotations

import pytest
import torch
from arkinfer.backends.gguf.runner import LlamaCppRunner
from spec_support import built_demo
from spec_toy import BigramRunner

from arkinfer.errors import ArkError, NotAvailableError
from arkinfer.frontend.checkpoint import load_model, open_checkpoint
from arkinfer.frontend.demo import demo_model_path
from arkinfer.pipeline.artifact import load_runner
from arkinfer.pipeline.draft import parse_draft
from arkinfer.speculative import (
    ModelDraft,
    SpecStats,
    plain_generate,
    speculative_generate,
)

LAYERS = 4  # the demo's num_hidden_layers
NEW = 48
TARGETS = ("gguf_target", "reference_target")


@pytest.fixture(scope="module", autouse=True)
def draft_cache(tmp_path_factory):
    """$ARKINFER_CACHE of this module: the truncated GGUFs go here, not to ~/.cache."""
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ARKINFER_CACHE", str(root))
        yield root


@pytest.fixture(scope="module")
def gguf_target(gguf_pair):
    return gguf_pair[0]


@pytest.fixture(scope="module")
def reference_target(tmp_path_factory):
    """The runner of the demo built as a reference artifact (q4_0, run dequantised)."""
    return load_runner(built_demo("reference", tmp_path_factory.mktemp("ref") / "demo-ref",
                                  quant="q4_0"))[1]


@pytest.fixture(params=TARGETS)
def target(request):
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("layers", [1, LAYERS - 1])
def test_greedy_self_draft_gives_plain_tokens(target, layers):
    prompt = target.tokenize("Once upon a time")
    plain = list(plain_generate(target, prompt, NEW))
    stats = SpecStats()
    draft = parse_draft(f"self:{layers}", target)
    assert isinstance(draft, ModelDraft) and draft.name == f"self:{layers}"
    assert list(speculative_generate(target, draft, prompt, NEW, k=4, stats=stats)) == plain
    assert stats.drafted > 0 and stats.emitted == NEW


def test_more_layers_accept_more(target):
    """A sanity check, not a speed claim: on this prompt the demo's first 3 layers agree with
    all 4 more often than its first layer does (measured: reference 0.21 -> 0.52, gguf q4_0
    0.14 -> 0.44 of the drafted tokens accepted)."""
    prompt = target.tokenize("The little dog")
    rates = []
    for layers in (1, LAYERS - 1):
        stats = SpecStats()
        list(speculative_generate(target, parse_draft(f"self:{layers}", target), prompt, NEW,
                                  k=4, stats=stats))
        rates.append(stats.acceptance_rate)
    assert rates[1] > rates[0], rates


def test_the_reference_draft_shares_the_targets_weights(reference_target):
    draft = parse_draft("self:2", reference_target).runner
    full, cut = reference_target.model, draft.model
    assert len(cut.model.layers) == 2 and len(full.model.layers) == LAYERS
    assert all(a is b for a, b in zip(cut.model.layers, full.model.layers))
    assert cut.lm_head is full.lm_head and cut.model.norm is full.model.norm
    assert cut.model.embed_tokens is full.model.embed_tokens
    assert len(draft.model.empty_cache(1)) == 2


def _raw(field) -> bytes:
    return b"".join(part.tobytes() for part in field.parts)


def test_truncated_gguf_keeps_the_first_blocks_byte_for_byte(demo_gguf, gguf_target,
                                                             draft_cache):
    import gguf
    from arkinfer.backends.gguf.truncate import truncated_gguf

    before = sorted(p.name for p in demo_gguf.iterdir())
    source = demo_gguf / "model.gguf"
    path = truncated_gguf(source, 2)
    assert path.parent == draft_cache / "drafts" and path.name.endswith("-self2.gguf")
    assert sorted(p.name for p in demo_gguf.iterdir()) == before  # nothing in the artifact
    ours, theirs = gguf.GGUFReader(path), gguf.GGUFReader(source)
    assert ours.fields["minicpm.block_count"].contents() == 2
    skip = {"minicpm.block_count", "GGUF.tensor_count"}
    assert {k: _raw(f) for k, f in ours.fields.items() if k not in skip} == \
        {k: _raw(f) for k, f in theirs.fields.items() if k not in skip}
    kept = [t for t in theirs.tensors
            if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < 2]
    assert [t.name for t in ours.tensors] == [t.name for t in kept]
    assert {"token_embd.weight", "output_norm.weight", "output.weight", "blk.1.ffn_down.weight"} \
        <= {t.name for t in ours.tensors}
    for mine, original in zip(ours.tensors, kept):
        assert mine.tensor_type == original.tensor_type and list(mine.shape) == list(original.shape)
        assert mine.data.tobytes() == original.data.tobytes(), mine.name
    # written once: a second call (and the draft runner) reuses the file
    stamp = path.stat().st_mtime_ns
    assert truncated_gguf(source, 2) == path and path.stat().st_mtime_ns == stamp
    runner = parse_draft("self:2", gguf_target).runner
    assert runner.path == path and runner.n_ctx == gguf_target.n_ctx
    assert path.stat().st_mtime_ns == stamp


def _first_layers_logits(model, ids: list[int], layers: int) -> torch.Tensor:
    """Logits [T, V] of the reference model's embedding, first `layers` decoder layers, final
    norm and LM head, from an empty cache, written out here (not through the self draft)."""
    cfg = model.config
    positions = torch.arange(len(ids))
    rope = cfg.inv_freq(len(ids))
    h = model.model.embed_tokens(torch.tensor([ids])) * cfg.embedding_scale
    for layer, cache in zip(model.model.layers[:layers], model.empty_cache(1)):
        h, _ = layer(h, positions, rope, cache)
    return model.lm_head(model.model.norm(h) / cfg.logit_divisor)[0].float()


@torch.no_grad()
def test_truncated_gguf_logits_equal_the_reference_first_layers(tmp_path, reference_target):
    """An f32 artifact, an f32 KV cache and 200 tokens (< the demo's dense_len of 1024, so the
    reference attends densely like upstream llama.cpp): only summation order and llama.cpp's
    vectorised exp / silu differ. Measured: at most 1.3e-5 on logits up to 15 in size (1e-6
    relative; the full 4 layers 3.5e-5). The bound 1e-4 leaves a margin of 7x; a dropped block,
    a residual scale recomputed from N (0.99 instead of 0.70) or a wrong tensor moves logits
    by far more than 1."""
    artifact = built_demo("gguf", tmp_path / "demo-f32", quant="f32")  # skips without gguf
    from arkinfer.backends.gguf.truncate import truncated_gguf

    model = load_model(open_checkpoint(demo_model_path()))
    ids = torch.randint(5, 2000, (200,), generator=torch.Generator().manual_seed(1)).tolist()
    for layers in range(1, LAYERS):
        expected = _first_layers_logits(model, ids, layers)
        runner = LlamaCppRunner(truncated_gguf(artifact / "model.gguf", layers), n_ctx=512,
                                kv_type="f32")
        ours = runner.window_logits(ids)
        assert (ours - expected).abs().max().item() <= 1e-4, layers
        assert torch.equal(ours.argmax(-1), expected.argmax(-1))
    # the reference self draft runs the same modules: equal up to float rounding
    float_target = load_runner(built_demo("reference", tmp_path / "demo-ref-f32", quant="f32"))[1]
    for layers in range(1, LAYERS):
        draft = float_target.first_layers(layers)
        expected = _first_layers_logits(model, ids, layers)
        assert torch.allclose(draft.window_logits(ids), expected, atol=1e-5), layers


@pytest.mark.parametrize("spec", ["self:0", f"self:{LAYERS}", "self:99"])
def test_a_layer_count_out_of_range_is_refused_before_any_work(target, spec, draft_cache):
    before = _files(draft_cache)
    with pytest.raises(ArkError, match=rf"must be 1\.\.{LAYERS - 1}"):
        parse_draft(spec, target)
    assert _files(draft_cache) == before  # no truncated GGUF (nor lock file) written


def _files(root) -> list:
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("spec", ["self:", "self:x", "self:-1", "self:1.5"])
def test_a_malformed_layer_count_is_refused(gguf_target, spec):
    with pytest.raises(ArkError, match="number of layers"):
        parse_draft(spec, gguf_target)


def test_other_runtimes_are_refused_by_name():
    with pytest.raises(NotAvailableError, match=r"BigramRunner.*reference, gguf"):
        parse_draft("self:1", BigramRunner(torch.zeros(4, 4)))
