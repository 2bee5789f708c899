"""EAGLE-3 drafting: the runners' taps (the hidden states a head reads) against the reference
model's, and greedy speculative decoding with the demo's trained head equal to plain decoding on
the reference and gguf runtimes."""

from __future__ import annotations

import pytest
import torch
from spec_support import built_demo, repetitive_prompt

from arkinfer.errors import ArkError, NotAvailableError
from arkinfer.frontend.demo import demo_model_path
from arkinfer.pipeline.artifact import load_runner
from arkinfer.pipeline.draft import parse_draft
from arkinfer.pipeline.reference_runner import ReferenceRunner
from arkinfer.speculative import SpecStats, plain_generate, speculative_generate
from arkinfer.speculative.eagle3_draft import Eagle3Draft

TAPS = (1, 2, 3)
PROMPT = "Question: What is bread made from? Answer:"


@pytest.fixture(scope="module")
def demo_f16(tmp_path_factory):
    """The demo as an f16 GGUF (taps compared with the float reference's)."""
    return built_demo("gguf", tmp_path_factory.mktemp("eagle") / "demo-f16", quant="f16")


def _stepped_taps(runner, ids: list[int]) -> torch.Tensor:
    """Taps after a prefill, an extend, a truncation and another extend: the rows of `ids`."""
    runner.enable_taps(TAPS)
    runner.prefill(ids[:6])
    runner.extend(ids[6:10])
    runner.truncate(8)
    runner.extend(ids[8:])
    return runner.taps.rows()


def test_reference_taps_are_the_layer_inputs():
    """Row p of the reference runner's taps = the residual stream entering layers 1, 2, 3 at
    position p, recomputed here layer by layer from the model's own modules."""
    runner = ReferenceRunner(demo_model_path(), dense=True)
    ids = runner.tokenize(PROMPT)
    got = _stepped_taps(runner, ids)
    model = runner.model
    cfg = model.config
    h = model.model.embed_tokens(torch.tensor([ids])) * cfg.embedding_scale
    cache = model.empty_cache(1)
    rope = cfg.inv_freq(len(ids))
    expected = []
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            if i in TAPS:
                expected.append(h[0])
            h, _ = layer(h, torch.arange(len(ids)), rope, cache[i])
    assert got.shape == (len(ids), len(TAPS) * cfg.hidden_size)
    torch.testing.assert_close(got, torch.cat(expected, dim=-1), rtol=1e-5, atol=1e-5)


def test_gguf_taps_match_the_reference(demo_f16):
    """llama.cpp's l_out nodes (copied by the graph callback) against the reference's taps, with
    the same prefill / extend / truncate steps: equal to f16 rounding."""
    reference = ReferenceRunner(demo_model_path(), dense=True)
    ids = reference.tokenize(PROMPT)
    want = _stepped_taps(reference, ids)
    got = _stepped_taps(load_runner(demo_f16)[1], ids)
    assert got.shape == want.shape
    assert (got - want).abs().max() < 2e-3 * want.abs().max()


def test_mlx_taps_match_the_reference(tmp_path):
    """ArkInfer's MLX runtime keeps the input of the tapped layers as it runs them."""
    reference = ReferenceRunner(demo_model_path(), dense=True)
    ids = reference.tokenize(PROMPT)
    want = _stepped_taps(reference, ids)
    got = _stepped_taps(load_runner(built_demo("mlx", tmp_path / "mlx", quant="f16"))[1], ids)
    assert got.shape == want.shape
    assert (got - want).abs().max() < 2e-2 * want.abs().max()


def test_eagle3_and_self_draft_greedy_equal_plain_on_mlx(tmp_path):
    from arkinfer.speculative import self_draft

    target = load_runner(built_demo("mlx", tmp_path / "mlx"))[1]
    prompt = target.tokenize(PROMPT)
    _greedy_equal(target, prompt, k=3)
    plain = list(plain_generate(target, prompt, 32))
    stats = SpecStats()
    assert list(speculative_generate(target, self_draft(target, 3), prompt, 32, k=4,
                                     stats=stats)) == plain
    assert stats.accepted > 0


def _greedy_equal(target, prompt: list[int], new: int = 40, k: int = 4) -> SpecStats:
    plain = list(plain_generate(target, prompt, new))
    draft = parse_draft("eagle3:demo", target)
    stats = SpecStats()
    spec = list(speculative_generate(target, draft, prompt, new, k=k, stats=stats))
    assert spec == plain
    return stats


def test_eagle3_greedy_equals_plain_on_reference():
    target = ReferenceRunner(demo_model_path())
    stats = _greedy_equal(target, target.tokenize(PROMPT))
    # the head was trained on the demo's own outputs: some drafts are accepted
    assert stats.accepted > 0


def test_eagle3_greedy_equals_plain_on_gguf(demo_f16):
    target = load_runner(demo_f16)[1]
    for prompt in (target.tokenize(PROMPT), repetitive_prompt(target)):
        stats = _greedy_equal(target, prompt, k=3)
        assert stats.accepted > 0


def test_eagle3_sampled_proposals_are_distributions():
    """At temperature > 0 each proposal row is the head's distribution on the target's ids."""
    target = ReferenceRunner(demo_model_path())
    draft = parse_draft("eagle3:demo", target)
    ids = target.tokenize(PROMPT)
    draft.reset()  # turns the target's taps on, as the engine does when a generation starts
    target.prefill(ids[:-1])
    proposal = draft.propose(ids, 3, 0.8, 0.95, torch.Generator().manual_seed(0))
    assert len(proposal.tokens) == 3 and proposal.q.shape == (3, target.vocab_size)
    torch.testing.assert_close(proposal.q.sum(-1), torch.ones(3))
    assert all(proposal.q[i, t] > 0 for i, t in enumerate(proposal.tokens))


def test_eagle3_refused_where_the_target_has_no_taps():
    from arkinfer.frontend.demo import demo_eagle3_path
    from arkinfer.speculative.eagle3_head import load_eagle3

    head = load_eagle3(demo_eagle3_path())

    class NoTaps:
        vocab_size = head.config.vocab_size
        speculates = True

    with pytest.raises(NotAvailableError, match="hidden states"):
        Eagle3Draft(head, NoTaps())


def test_eagle3_folder_that_is_not_a_head(tmp_path):
    target = ReferenceRunner(demo_model_path())
    with pytest.raises(ArkError, match="no such folder"):
        parse_draft(f"eagle3:{tmp_path / 'missing'}", target)


class _ThreadsSeen:
    """A draft wrapper recording torch's thread count at each proposal."""

    def __init__(self, draft) -> None:
        self.draft, self.seen, self.name = draft, [], draft.name

    def reset(self) -> None:
        self.draft.reset()

    def finish(self) -> None:
        self.draft.finish()

    def propose(self, *args):
        self.seen.append(torch.get_num_threads())
        return self.draft.propose(*args)


@pytest.mark.parametrize("runtime", ["gguf", "reference"])
def test_torch_runs_on_one_thread_beside_another_runtime(demo_f16, runtime):
    """While a gguf target decodes (llama.cpp's own threads), the draft's torch work runs on one
    thread, so torch's OpenMP workers do not spin on llama.cpp's cores; the reference target
    computes in torch and keeps its threads; either way the count is restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        target = load_runner(demo_f16)[1] if runtime == "gguf" else \
            ReferenceRunner(demo_model_path())
        draft = _ThreadsSeen(parse_draft("eagle3:demo", target))
        ids = list(speculative_generate(target, draft, target.tokenize(PROMPT), 12, k=2))
        assert len(ids) == 12 and draft.seen
        assert set(draft.seen) == ({1} if runtime == "gguf" else {2})
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
