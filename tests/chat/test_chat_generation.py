"""Generation over an artifact's own runner: greedy tokens equal the runner's own greedy decoding
(prefill and decode called by hand) on every runtime the demo builds for here, and the
reference artifact's equal `arkinfer.generate.generate` on the float demo model."""

from __future__ import annotations

import pytest
import torch
from chat_support import QUESTION, RUNTIMES

from arkinfer.chat.context import ContextError, check_context
from arkinfer.chat.generation import GenerationSettings, generate_tokens
from arkinfer.chat.model import open_chat_model
from arkinfer.errors import ArkError

pytestmark = pytest.mark.usefixtures("one_thread")
N = 24


def greedy_by_hand(runner, ids: list[int], n: int, stop: frozenset[int]) -> list[int]:
    runner.reset()
    logits, out = runner.prefill(ids), []
    for _ in range(n):
        out.append(int(torch.argmax(logits)))
        if out[-1] in stop:
            break
        logits = runner.decode(out[-1])
    return out


@pytest.mark.parametrize("backend", RUNTIMES)
def test_greedy_equals_the_runners_own_decoding(demo_artifact, backend):
    model = open_chat_model(demo_artifact(backend))
    assert model.runtime == backend
    ids = model.encode_chat(QUESTION)
    got = list(generate_tokens(model.runner, ids, GenerationSettings(N), model.stop_ids))
    assert got == greedy_by_hand(model.runner, ids, N, model.stop_ids)
    # the runner's cache is emptied first: a second call gives the same tokens
    assert list(generate_tokens(model.runner, ids, GenerationSettings(N), model.stop_ids)) == got
    assert "flour" in model.tokenizer.decode(got)


def test_reference_artifact_equals_generate_on_the_float_model(demo_artifact):
    from arkinfer.frontend.checkpoint import load
    from arkinfer.generate import generate

    model = open_chat_model(demo_artifact("reference"))
    ckpt, net = load("demo")
    ids = model.encode_chat(QUESTION)
    assert ids == ckpt.tokenizer.encode_chat(QUESTION, special_in_content=False)
    want = list(generate(net, ids, 64, stop_ids=ckpt.tokenizer.stop_ids))
    assert want[-1] in model.stop_ids  # the demo answers and stops within 64 tokens
    assert list(generate_tokens(model.runner, ids, GenerationSettings(64), model.stop_ids)) == want


def test_model_folder_runs_on_the_reference_runner():
    model = open_chat_model("demo")
    assert (model.name, model.runtime, model.context) == ("demo", "reference", 4096)
    got = list(generate_tokens(model.runner, model.encode_text("The kettle"),
                               GenerationSettings(8), model.stop_ids))
    assert len(got) == 8


def test_sampling_is_reproducible_by_seed():
    model = open_chat_model("demo")
    ids = model.encode_chat(QUESTION)

    def sample(seed: int) -> list[int]:
        return list(generate_tokens(model.runner, ids, GenerationSettings(16, 1.0, 0.95, seed)))

    assert sample(7) == sample(7)
    assert any(sample(seed) != sample(7) for seed in range(3))


def test_a_stop_id_is_yielded_and_ends_generation():
    model = open_chat_model("demo")
    ids = model.encode_chat(QUESTION)
    first = next(generate_tokens(model.runner, ids, GenerationSettings(4)))
    assert list(generate_tokens(model.runner, ids, GenerationSettings(4), {first})) == [first]


@pytest.mark.parametrize("settings, match", [
    (GenerationSettings(0), "max_tokens 0 is below 1"),
    (GenerationSettings(4, temperature=-1.0), "--temperature"),
    (GenerationSettings(4, top_p=0.0), "--top-p"),
])
def test_bad_settings_are_refused_before_any_forward(settings, match):
    class NoRunner:
        def reset(self):
            raise AssertionError("no runner call expected")

    with pytest.raises(ArkError, match=match):
        next(generate_tokens(NoRunner(), [1, 2], settings))


def test_context_check_names_the_flag_and_the_room():
    check_context(10, 6, 16)
    with pytest.raises(ContextError) as info:
        check_context(10, 7, 16, flag="max_tokens", limit="the context of {context} tokens")
    assert ("10 tokens and max_tokens asks for 7 more: 17 > the context of 16 tokens"
            in str(info.value))
    assert info.value.hint == "lower max_tokens to 6 or less"
    with pytest.raises(ContextError, match="max_position_embeddings") as info:
        check_context(20, 1, 16)
    assert "shorten the prompt" in info.value.hint
