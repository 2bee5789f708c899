"""Greedy speculative decoding emits plain greedy decoding's tokens, token for token, on the
reference runner and the gguf runner: with prompt lookup (tokens accepted on a prompt whose
continuation repeats it) and with the same artifact as its own draft (every draft token
accepted). Stop ids and the token budget end the output where plain decoding ends it."""

from __future__ import annotations

import pytest
from spec_support import repetitive_prompt

from arkinfer.speculative import (
    LookupDraft,
    ModelDraft,
    SpecStats,
    plain_generate,
    speculative_generate,
)

NEW = 48
PAIRS = ("reference_pair", "gguf_pair")


@pytest.fixture(params=PAIRS)
def pair(request):
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("k", [1, 4])
def test_lookup_gives_plain_greedy_tokens(pair, k):
    target, _ = pair
    prompt = repetitive_prompt(target)
    plain = list(plain_generate(target, prompt, NEW))
    stats = SpecStats()
    spec = list(speculative_generate(target, LookupDraft(), prompt, NEW, k=k, stats=stats))
    assert spec == plain
    assert stats.emitted == NEW and stats.steps < NEW - 1
    assert stats.accepted > 0, stats
    assert stats.mean_accepted_length > 1.0


def test_the_model_as_its_own_draft_accepts_every_token(pair):
    target, draft_runner = pair
    prompt = target.tokenize("Once upon a time")
    plain = list(plain_generate(target, prompt, NEW))
    stats = SpecStats()
    spec = list(speculative_generate(target, ModelDraft(draft_runner, target), prompt, NEW, k=5,
                                     stats=stats))
    assert spec == plain
    assert stats.accepted == stats.drafted > 0, stats


def test_stop_ids_and_budget_end_where_plain_decoding_ends(reference_pair):
    target, _ = reference_pair
    prompt = repetitive_prompt(target)
    plain = list(plain_generate(target, prompt, NEW))
    stop = plain[10]
    until_stop = plain[:plain.index(stop) + 1]
    spec = list(speculative_generate(target, LookupDraft(), prompt, NEW, k=4, stop_ids={stop}))
    assert spec == until_stop
    for budget in (0, 1, 2, 7):
        assert list(speculative_generate(target, LookupDraft(), prompt, budget, k=4)) == \
            plain[:budget]
