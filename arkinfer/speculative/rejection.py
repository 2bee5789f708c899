"""The acceptance rules of a verify step: which draft tokens the target keeps, and the token it
adds after them.

Greedy: keep draft tokens while each equals the target's argmax at its position, then emit the
target's argmax at the first disagreement (or after the last draft token): exactly the tokens
plain greedy decoding emits, since every kept token is the one it would have picked.

Sampling (Leviathan et al. 2023, Chen et al. 2023): draft token x, drawn from the draft's q, is
kept with probability min(1, p(x) / q(x)); on rejection the step samples from
norm(max(0, p - q)) and stops. The emitted token is then distributed exactly as p, so the output
has plain sampling's distribution. p and q are the sampling distributions `sample_next` draws
from (softmax of logits / temperature, cut to the top_p nucleus, renormalised); a deterministic
draft has q one-hot at its token, so x is kept with probability p(x) and a rejection samples
p with x removed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from arkinfer.generate import sample_next


def sampling_probs(logits: Tensor, temperature: float, top_p: float) -> Tensor:
    """The distribution `sample_next(logits, temperature, top_p)` samples from, for each row of
    logits [..., V] (temperature > 0): float32 [..., V], each row summing to 1."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        ranked, order = torch.sort(probs, dim=-1, descending=True)
        inside = torch.cumsum(ranked, dim=-1) - ranked < top_p  # the top one always stays
        probs = torch.zeros_like(probs).scatter(-1, order, ranked * inside)
    return probs / probs.sum(dim=-1, keepdim=True)


def verify_greedy(rows: Tensor, tokens: list[int]) -> tuple[int, int]:
    """(accepted, next): rows [len(tokens) + 1, V] are the target's logits at the positions of
    the last accepted token and of each draft token; `accepted` draft tokens match the target's
    argmax (`sample_next`'s, the first maximum), `next` is its argmax after them."""
    for i, token in enumerate(tokens):
        best = sample_next(rows[i], 0.0, 1.0, None)
        if best != token:
            return i, best
    return len(tokens), sample_next(rows[len(tokens)], 0.0, 1.0, None)


def verify_sampled(p: Tensor, tokens: list[int], q: Tensor | None,
                   gen: torch.Generator) -> tuple[int, int]:
    """(accepted, next) by the rejection rule. p: float32 [len(tokens) + 1, V], the target's
    sampling distributions (`sampling_probs`) at the last accepted token and each draft token;
    q: [len(tokens), V] the draft's, or None when the draft is deterministic (one-hot)."""
    for i, token in enumerate(tokens):
        p_x = float(p[i, token])
        q_x = 1.0 if q is None else float(q[i, token])
        # u < p/q with u ~ U[0, 1): kept with probability min(1, p(x) / q(x))
        if float(torch.rand((), generator=gen)) * q_x < p_x:
            continue
        if q is None:
            residual = p[i].clone()
            residual[token] = 0.0
        else:
            residual = torch.clamp(p[i] - q[i], min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: p itself is the residual
            residual = p[i]
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=gen))
    return len(tokens), int(torch.multinomial(p[len(tokens)], 1, generator=gen))
