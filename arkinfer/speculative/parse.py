"""How the user names a draft (`--draft SOURCE`): "lookup", "self:N", or the folder of an artifact
whose tokenizer is the target's."""

from __future__ import annotations

from pathlib import Path

from arkinfer.backend import Runner
from arkinfer.errors import ArkError, NotAvailableError
from arkinfer.pipeline.artifact import load_runner
from arkinfer.speculative.draft import Draft
from arkinfer.speculative.lookup import LookupDraft
from arkinfer.speculative.model_draft import ModelDraft

DRAFT_FORMS = "'lookup', 'self:N' (the target's first N layers) or an artifact folder"


def parse_draft(spec: str, target: Runner) -> Draft:
    """The draft `spec` names for `target`: "lookup" (n-gram prompt lookup, no model), "self:N"
    (not yet), or the folder of a built artifact whose tokenizer is the target's (a draft model,
    run by its own backend's runner). Raises ArkError naming the accepted forms."""
    if spec == "lookup":
        return LookupDraft()
    if spec.startswith("self:"):
        layers = spec.removeprefix("self:")
        if not layers.isdigit() or int(layers) < 1:
            raise ArkError(f"--draft {spec!r}: N in self:N must be a number of layers >= 1",
                           hint="e.g. --draft self:2")
        raise NotAvailableError(f"--draft {spec}: drafting with the target's first layers is "
                                "not implemented yet", hint="use --draft lookup, or a draft "
                                "model's artifact folder")
    path = Path(spec)
    if not path.is_dir():
        raise ArkError(f"--draft {spec!r} is not a draft: use {DRAFT_FORMS}",
                       hint="e.g. --draft lookup, or --draft dist/small.host.q4_0")
    _, runner = load_runner(path)
    return ModelDraft(runner, target, name=path.name)
