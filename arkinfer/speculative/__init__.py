"""Speculative decoding over artifact runners: a draft proposes k tokens, the target scores them
in one `extend` call and keeps the longest prefix its own decoding agrees with (docs/speculative.md).

    from arkinfer.pipeline.draft import parse_draft
    from arkinfer.speculative import speculative_generate, SpecStats
    draft = parse_draft("lookup", target)   # or "self:N" (its first N layers), or an artifact folder
    stats = SpecStats()
    ids = list(speculative_generate(target, draft, prompt_ids, 64, k=4, stats=stats))

Greedy output equals `plain_generate`'s token for token; sampled output has its distribution.
"""

from arkinfer.speculative.draft import Draft, Proposal
from arkinfer.speculative.engine import speculative_generate
from arkinfer.speculative.lookup import LookupDraft
from arkinfer.speculative.model_draft import ModelDraft
from arkinfer.speculative.plain import plain_generate
from arkinfer.speculative.self_draft import self_draft
from arkinfer.speculative.stats import SpecStats

__all__ = ["Draft", "LookupDraft", "ModelDraft", "Proposal", "SpecStats", "plain_generate",
           "self_draft", "speculative_generate"]
