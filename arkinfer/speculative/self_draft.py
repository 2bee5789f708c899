"""The `self:N` draft: the target's own first N decoder layers, then its final norm and LM head
(LayerSkip-style early exit; untrained, no weights beyond the target's), run as a second runner
of the target's runtime and drafting through `ModelDraft`.

    draft = self_draft(target, 2)          # what parse_draft("self:2", target) returns
    speculative_generate(target, draft, prompt_ids, 64, k=4)

    ReferenceRunner   first_layers(N): the same modules and weights, its own KV cache
    LlamaCppRunner    a GGUF of the target's blocks 0..N-1 (backends/gguf/truncate.py, written
                      once into the ArkInfer cache), loaded with the target's n_ctx and threads
    any other runner  NotAvailableError naming the two above

The draft sees exactly the hidden states the target's first N layers compute, read out by the
target's own head: nothing was trained to make that read-out good, so the acceptance rate falls
with fewer layers. Greedy output never changes (the target verifies every token).
"""

from __future__ import annotations

from arkinfer.backend import Runner
from arkinfer.errors import ArkError, NotAvailableError
from arkinfer.speculative.model_draft import ModelDraft

SELF_DRAFT_RUNTIMES = "reference, gguf (upstream llama.cpp)"


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
    """A runner over `target`'s first `layers` layers, final norm and LM head."""
    # importing the runner's module does not import llama_cpp (only making a runner does)
    from arkinfer.backends.gguf.runner import LlamaCppRunner
    from arkinfer.pipeline.reference_runner import ReferenceRunner

    if isinstance(target, ReferenceRunner):
        check_layers(layers, target.layer_count, f"the reference model of {target.ckpt.path}")
        return target.first_layers(layers)
    if isinstance(target, LlamaCppRunner):
        return _gguf_runner(target, layers)
    raise NotAvailableError(f"--draft self:{layers} cannot run on {type(target).__name__}: a "
                            f"self draft is made for the runtimes {SELF_DRAFT_RUNTIMES} only",
                            hint="use --draft lookup, or a draft model's artifact folder")


def _gguf_runner(target, layers: int) -> Runner:
    """LlamaCppRunner over the cached GGUF of the target's first blocks. all_logits=False: a
    draft asks for the last position's logits only, so it needs no n_ctx x vocab buffer."""
    from arkinfer.backends.gguf.runner import LlamaCppRunner
    from arkinfer.backends.gguf.truncate import truncated_gguf

    meta = target.llm.metadata  # the GGUF's keys, as strings, read by llama.cpp at load
    arch = meta.get("general.architecture", "")
    if f"{arch}.block_count" not in meta:
        raise NotAvailableError(f"{target.path} has no {arch}.block_count key, so its first "
                                "layers cannot be cut out", hint="use --draft lookup")
    check_layers(layers, int(meta[f"{arch}.block_count"]), str(target.path))
    return LlamaCppRunner(truncated_gguf(target.path, layers), n_ctx=target.n_ctx,
                          n_threads=target.llm.n_threads, all_logits=False)
