"""Predicted speed-up of chain speculative decoding (docs/plan-and-targets.md), from the roofline
of predict.py and an acceptance rate that is assumed unless measured (`arkinfer bench
--speculative` reports it as `acceptance_rate`).

    p = predict_speculative(cost, target, "self:8", acceptance=0.6, k=4, ctx=4096)
    p.expected_tokens, p.step_s, p.speedup, p.as_dict()

With a per-token acceptance probability A and k draft tokens per verify step, the tokens one step
emits (accepted draft tokens plus the target's own) are on average

    E = 1 + A + A^2 + ... + A^k = (1 - A^(k+1)) / (1 - A)        (k + 1 when A = 1)

and a step costs `k · t_draft + t_verify`, so the speed-up over plain decoding (one token per
`t_target`) is `E · t_target / (k · t_draft + t_verify)`:

- t_target: the target's decode step at `ctx` (`predict(...).decode.seconds`).
- t_verify: one target step over k + 1 positions. Decode is bandwidth-bound, and the k + 1
  positions share one read of the weights and KV cache, so it is the decode's bandwidth time;
  only the FLOPs grow, k + 1 times (`max(t_bandwidth, (k + 1) · t_compute)`).
- t_draft: `lookup` reads no weights (0); `self:N` is a decode of the target's first N layers,
  its final norm and LM head (the draft model `draft_cost` describes), at the same context;
  `eagle3` / `eagle3:K` is one step of an EAGLE-3 head shaped after the target (`eagle3_step`:
  one decoder layer, its LM head over the vocabulary or FR-Spec's K tokens, bf16 as
  `build --draft` carries it).

The formula takes every draft position to be accepted with the same A, independently; real
acceptance falls along the chain, so measured E is what to trust.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from arkinfer.errors import ConfigError
from arkinfer.latency.cost import ModelCost
from arkinfer.latency.predict import Attention, Step, predict, roofline_step

# assumed: E = 2.31 at k = 4, near the mean accepted length of 2.5 CPM.cu reports for EAGLE-3
DEFAULT_ACCEPTANCE = 0.6
DEFAULT_K = 4  # the draft length `arkinfer run --draft-k` uses by default
_LAYER_TENSOR = re.compile(r"model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class SpeculativePrediction:
    """One draft's predicted speed-up: inputs (draft, A, k), E, and the three step times (s)."""

    draft: str
    acceptance: float
    k: int
    expected_tokens: float
    t_target: float
    t_draft: float
    t_verify: float

    @property
    def step_s(self) -> float:
        """Seconds per verify step: k draft decodes and one target step over k + 1 positions."""
        return self.k * self.t_draft + self.t_verify

    @property
    def speedup(self) -> float:
        """Tokens/s with speculation over tokens/s of plain decoding."""
        return self.expected_tokens * self.t_target / self.step_s

    @property
    def decode_tok_s(self) -> float:
        return self.expected_tokens / self.step_s

    def as_dict(self) -> dict[str, Any]:
        return {"draft": self.draft, "acceptance": self.acceptance, "k": self.k,
                "expected_tokens": self.expected_tokens, "t_target_s": self.t_target,
                "t_draft_s": self.t_draft, "t_verify_s": self.t_verify, "step_s": self.step_s,
                "decode_tok_s": self.decode_tok_s, "speedup": self.speedup}


def expected_tokens(acceptance: float, k: int) -> float:
    """E = (1 - A^(k+1)) / (1 - A): tokens per verify step with k draft tokens (k + 1 at A = 1)."""
    check_inputs(acceptance, k)
    if acceptance == 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def check_inputs(acceptance: float, k: int) -> None:
    """ConfigError unless 0 <= acceptance <= 1 and k >= 1."""
    if not 0.0 <= acceptance <= 1.0:
        raise ConfigError(f"--acceptance {acceptance} is outside 0..1",
                          hint="give the probability that one draft token is accepted, e.g. 0.6; "
                          "`arkinfer bench --speculative` measures it")
    if k < 1:
        raise ConfigError(f"--draft-k {k} is below 1", hint="e.g. --draft-k 4")


def draft_cost(cost: ModelCost, layers: int) -> ModelCost:
    """The `self:N` draft of `cost`'s model: the tensors of its first `layers` decoder layers,
    the embedding, final norm and LM head, each stored as in `cost`; the config (and with it
    the KV cache and attention FLOPs) has `layers` layers."""
    from arkinfer import models

    if not 1 <= layers < cost.layers:  # all the layers would be the target itself
        raise ConfigError(f"self:{layers}: {cost.source} has {cost.layers} layers, so N in "
                          f"self:N must be 1..{cost.layers - 1}",
                          hint=f"e.g. --draft-layers {max(1, cost.layers // 4)}")
    raw = {**cost.raw_config, "num_hidden_layers": layers}
    tensors = tuple(t for t in cost.tensors if _layer_of(t.name) < layers)
    source = f"{cost.source} (first {layers} layers)"
    return replace(cost, raw_config=raw, config=models.parse_config(raw, source),
                   tensors=tensors, source=source)


#: bytes per weight of a carried EAGLE-3 head (bf16: `build --draft`, pipeline/draft_artifact.py)
EAGLE3_BYTES = 2


def eagle3_step(cost: ModelCost, target: Any, ctx: int, k: int,
                draft_vocab: int | None = None) -> float:
    """Seconds of one draft token of an EAGLE-3 head shaped after `cost`'s model: one decoder
    layer whose q/k/v read [embedding, hidden] (2H), the target's heads and FFN width, an LM head
    over `draft_vocab` tokens (the vocabulary when None), the fc over three taps counted once per
    chain of `k`; weights in bf16, its own KV cache of `ctx` positions in float32."""
    c = cost.config
    h, hd = c.hidden_size, c.head_dim
    nq, nkv = c.num_attention_heads, c.num_key_value_heads
    vocab = c.vocab_size if draft_vocab is None else draft_vocab
    if not 1 <= vocab <= c.vocab_size:
        raise ConfigError(f"eagle3:{vocab}: the draft vocabulary must be 1..{c.vocab_size}",
                          hint="FR-Spec keeps 25-45 % of the vocabulary, e.g. --draft-vocab "
                          f"{c.vocab_size * 3 // 10}")
    weights = (2 * h * (nq + 2 * nkv) * hd + nq * hd * h + 3 * h * c.intermediate_size
               + vocab * h + 3 * h * h / k)
    kv_bytes = 2 * nkv * hd * ctx * 4
    flops = 2 * weights + 4 * nq * hd * ctx
    return roofline_step(target, weights * EAGLE3_BYTES + kv_bytes, flops).seconds


def _layer_of(name: str) -> int:
    """The decoder layer a tensor belongs to (-1 for the embedding, final norm, LM head)."""
    match = _LAYER_TENSOR.match(name)
    return int(match.group(1)) if match else -1


def _verify(decode: Step, k: int) -> float:
    """One target step over k + 1 positions: one read of the bytes, k + 1 times the FLOPs."""
    if decode.t_compute is None:
        return decode.t_bandwidth
    return max(decode.t_bandwidth, (k + 1) * decode.t_compute)


def predict_speculative(cost: ModelCost, target: Any, draft: str, *,
                        acceptance: float = DEFAULT_ACCEPTANCE, k: int = DEFAULT_K,
                        ctx: int = 4096, attention: Attention = "dense") -> SpeculativePrediction:
    """The speed-up of decoding `cost`'s model on `target` at `ctx` cached tokens with `draft`
    ("lookup", "self:N", "eagle3" or "eagle3:K" with FR-Spec's K tokens) proposing `k` tokens per step, each accepted with probability
    `acceptance` (see the module docstring)."""
    e = expected_tokens(acceptance, k)
    decode = predict(cost, target, ctx=ctx, prompt=0, attention=attention).decode
    if draft == "lookup":
        t_draft = 0.0
    elif draft.startswith("self:") and draft.removeprefix("self:").isdigit():
        small = draft_cost(cost, int(draft.removeprefix("self:")))
        t_draft = predict(small, target, ctx=ctx, prompt=0, attention=attention).decode.seconds
    elif draft == "eagle3" or (draft.startswith("eagle3:")
                               and draft.removeprefix("eagle3:").isdigit()):
        vocab = int(draft.removeprefix("eagle3:")) if ":" in draft else None
        t_draft = eagle3_step(cost, target, ctx, k, vocab)
    else:
        raise ConfigError(f"draft {draft!r} cannot be predicted; allowed: lookup, self:N, "
                          "eagle3, eagle3:K",
                          hint="a draft model's artifact is not predicted yet: plan it on its "
                          "own and compare the decode times")
    return SpeculativePrediction(draft, acceptance, k, e, decode.seconds, t_draft,
                                 _verify(decode, k))
