"""How the user names a draft (`--draft SOURCE`; here, beside `artifact.py`, because a draft can be
an artifact folder): "lookup", "self:N", or the folder of an artifact
whose tokenizer is the target's."""

from __future__ import annotations

from pathlib import Path

from arkinfer.backend import Runner
from arkinfer.errors import ArkError
from arkinfer.speculative.draft import Draft
from arkinfer.speculative.lookup import LookupDraft
from arkinfer.speculative.model_draft import ModelDraft
from arkinfer.speculative.self_draft import self_draft

DRAFT_FORMS = "'lookup', 'self:N' (the target's first N layers) or an artifact folder"


def parse_draft(spec: str, target: Runner) -> Draft:
    """The draft `spec` names for `target`: "lookup" (n-gram prompt lookup, no model), "self:N"
    (the target's first N layers and its LM head, self_draft.py), or the folder of a built
    artifact whose tokenizer is the target's (a draft model, run by its own backend's runner).
    Raises ArkError naming the accepted forms, or the valid range of N."""
    if spec == "lookup":
        return LookupDraft()
    if spec.startswith("self:"):
        layers = spec.removeprefix("self:")
        if not (layers.isascii() and layers.isdigit()):
            raise ArkError(f"--draft {spec!r}: N in self:N must be a number of layers >= 1",
                           hint="e.g. --draft self:2")
        return self_draft(target, int(layers))  # checks 1 <= N < the target's layer count
    path = Path(spec)
    if not path.is_dir():
        raise ArkError(f"--draft {spec!r} is not a draft: use {DRAFT_FORMS}",
                       hint="e.g. --draft lookup, or --draft dist/small.host.q4_0")
    from .artifact import load_runner

    _, runner = load_runner(path)
    return ModelDraft(runner, target, name=path.name)
