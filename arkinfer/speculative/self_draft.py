"""The `self:N` draft: the target's own first N decoder layers, then its final norm and LM head
(LayerSkip-style early exit; untrained, no weights beyond the target's), run as a second runner
of the target's runtime and drafting through `ModelDraft`.

    draft = self_draft(target, 2)          # what parse_draft("self:2", target) returns
    speculative_generate(target, draft, prompt_ids, 64, k=4)

    A runner that can make one has `layer_count` and `first_layers(N)` (a runner over its first N
    layers): the reference runner (the same modules and weights, its own KV cache), the gguf
    runner (a GGUF of blocks 0..N-1 written once into the ArkInfer cache,
    backends/gguf/truncate.py), the mlx runner (a cache of N layers) and the onnx runner on
    dense graphs (its graph cut after layer N-1 in memory, backends/onnx/layer_graph.py). Any
    other runner: NotAvailableError.

The draft sees exactly the hidden states the target's first N layers compute, read out by the
target's own head: nothing was trained to make that read-out good, so the acceptance rate falls
with fewer layers. Greedy output never changes (the target verifies every token).
"""

from __future__ import annotations

from arkinfer.backend import Runner
from arkinfer.errors import ArkError, NotAvailableError
from arkinfer.speculative.model_draft import ModelDraft

SELF_DRAFT_RUNTIMES = "reference, gguf (upstream llama.cpp), mlx, onnx (dense graphs)"


def check_layers(layers: int, total: int, where: str) -> None:
    """ArkError unless 1 <= layers < total (all `total` layers would be the target itself)."""
    if not 1 <= layers < total:
        raise ArkError(f"--draft self:{layers}: {where} has {total} layers, so N in self:N "
                       f"must be 1..{total - 1}", hint=f"e.g. --draft self:{max(1, total // 2)}")


def self_draft(target: Runner, layers: int) -> ModelDraft:
    """The draft running `target`'s first `layers` layers; NotAvailableError on a runtime that
    cannot make one, ArkError when `layers` is outside 1..L-1 (both before any file is read)."""
    # the draft's tokenizer is the target's by construction: no identity check needed
    return ModelDraft(self_draft_runner(target, layers), name=f"self:{layers}")


def self_draft_runner(target: Runner, layers: int) -> Runner:
    """A runner over `target`'s first `layers` layers, final norm and LM head (the runner's own
    `first_layers`), after the range check."""
    make = getattr(target, "first_layers", None)
    if make is None:
        raise NotAvailableError(f"--draft self:{layers} cannot run on {type(target).__name__}: "
                                f"a self draft is made for the runtimes {SELF_DRAFT_RUNTIMES} "
                                "only", hint="use --draft lookup, or a draft model's artifact "
                                "folder")
    total = target.layer_count
    if total < 2:
        raise NotAvailableError(f"--draft self:{layers}: {type(target).__name__} does not say "
                                "how many layers its model has", hint="use --draft lookup")
    check_layers(layers, total, f"the model {type(target).__name__} runs")
    return make(layers)
