"""The rejection rule keeps plain sampling's distribution. On a bigram toy target and draft over
4 tokens (exact probabilities known), the joint distribution of the first three generated
tokens from speculative sampling matches the exact one by a chi-square test (fixed seeds, 64
cells, p > 0.001); the one-step rule alone is checked the same way for a model draft (q) and a
deterministic one (q one-hot)."""

from __future__ import annotations

import itertools

import pytest
import torch
from spec_toy import BigramRunner, random_table

from arkinfer.speculative import LookupDraft, ModelDraft, speculative_generate
from arkinfer.speculative.draft import Proposal
from arkinfer.speculative.rejection import sampling_probs, verify_sampled

V = 4
SAMPLES = 6000
P_MIN = 1e-3


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of `counts` [C] drawn from `probs` [C] (cells of probability 0 must be empty)."""
    assert int(counts[probs == 0].sum()) == 0
    live = probs > 0
    expected = probs[live] * counts.sum()
    stat = float(((counts[live] - expected) ** 2 / expected).sum())
    dof = int(live.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


def exact_joint(table: torch.Tensor, first: int, steps: int, temperature: float,
                top_p: float) -> torch.Tensor:
    """Probabilities [V**steps] of each `steps`-token continuation after token `first` under
    plain sampling of the bigram table (index: the tokens as base-V digits)."""
    p = sampling_probs(table, temperature, top_p)
    out = torch.zeros(V ** steps)
    for seq in itertools.product(range(V), repeat=steps):
        prob, last = 1.0, first
        for token in seq:
            prob, last = prob * float(p[last, token]), token
        out[sum(t * V ** (steps - 1 - i) for i, t in enumerate(seq))] = prob
    return out


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
@pytest.mark.parametrize("draft_kind", ["model", "lookup"])
def test_speculative_sampling_has_plain_sampling_distribution(draft_kind, temperature, top_p):
    target_table, draft_table = random_table(V, 1), random_table(V, 2)
    target = BigramRunner(target_table)
    prompt = [0, 1, 2, 3, 0, 1, 2, 3, 0]  # lookup proposes 1, 2, 3 after the trailing 0
    counts = torch.zeros(V ** 3)
    for seed in range(SAMPLES):
        draft = (ModelDraft(BigramRunner(draft_table), target) if draft_kind == "model"
                 else LookupDraft())
        out = list(speculative_generate(target, draft, prompt, 4, k=3, temperature=temperature,
                                        top_p=top_p, seed=seed))
        counts[out[1] * V * V + out[2] * V + out[3]] += 1  # tokens 2..4: decided by verify steps
    # the first token comes from the prefill alone; condition on it by marginalising it out
    p = sampling_probs(target_table, temperature, top_p)
    exact = sum(float(p[0, t]) * exact_joint(target_table, t, 3, temperature, top_p)
                for t in range(V))
    assert chi_square_p(counts, exact) > P_MIN


@pytest.mark.parametrize("deterministic", [False, True])
def test_one_verify_step_emits_the_target_distribution(deterministic):
    gen = torch.Generator().manual_seed(0)
    p = sampling_probs(random_table(V, 3)[:2], 1.0, 1.0)     # [2, V]: draft position, bonus
    q = sampling_probs(random_table(V, 4)[:1], 1.0, 1.0)     # [1, V]
    counts = torch.zeros(V)
    for _ in range(SAMPLES):
        x = 2 if deterministic else int(torch.multinomial(q[0], 1, generator=gen))
        accepted, nxt = verify_sampled(p, [x], None if deterministic else q, gen)
        counts[x if accepted else nxt] += 1
    assert chi_square_p(counts, p[0]) > P_MIN


def test_a_draft_of_the_target_itself_is_always_accepted_when_sampling():
    table = random_table(V, 5)
    p = sampling_probs(table, 1.0, 1.0)
    accepted, _ = verify_sampled(p[:3], [1, 2], p[:2], torch.Generator().manual_seed(0))
    assert accepted == 2
    assert Proposal([1]).q is None
