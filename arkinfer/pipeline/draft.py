"""How the user names a draft (`--draft SOURCE`; here, beside `artifact.py`, because a draft can be
an artifact folder): "lookup", "self:N", the folder of an EAGLE-3 head (its config.json names
`LlamaForCausalLMEagle3`; "eagle3:demo" is the head shipped for the demo model), or the folder of
an artifact whose tokenizer is the target's."""

from __future__ import annotations

import json
from pathlib import Path

from arkinfer.backend import Runner
from arkinfer.errors import ArkError
from arkinfer.speculative.draft import Draft
from arkinfer.speculative.lookup import LookupDraft
from arkinfer.speculative.model_draft import ModelDraft
from arkinfer.speculative.self_draft import self_draft

DRAFT_FORMS = ("'lookup', 'self:N' (the target's first N layers), an EAGLE-3 head's folder "
               "('eagle3:demo': the demo's) or an artifact folder")
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"


def parse_draft(spec: str, target: Runner) -> Draft:
    """The draft `spec` names for `target`: "lookup" (n-gram prompt lookup, no model), "self:N"
    (the target's first N layers and its LM head, self_draft.py), or the folder of a built
    artifact whose tokenizer is the target's (a draft model, run by its own backend's runner).
    Raises ArkError naming the accepted forms, or the valid range of N."""
    if spec == "lookup":
        return LookupDraft()
    if spec.startswith("self:"):
        return self_draft(target, self_layers(spec))  # checks 1 <= N < the target's layers
    head = head_path(spec)
    if head is not None:
        return eagle3_draft(head, target)
    path = Path(spec)
    if not path.is_dir():
        raise ArkError(f"--draft {spec!r} is not a draft: use {DRAFT_FORMS}",
                       hint="e.g. --draft lookup, or --draft dist/small.host.q4_0")
    from .artifact import load_runner

    _, runner = load_runner(path)
    return ModelDraft(runner, target, name=path.name)


def self_layers(spec: str) -> int:
    """N of a "self:N" spec; ArkError when N is not a number."""
    layers = spec.removeprefix("self:")
    if not (layers.isascii() and layers.isdigit()):
        raise ArkError(f"--draft {spec!r}: N in self:N must be a number of layers >= 1",
                       hint="e.g. --draft self:2")
    return int(layers)


def head_path(spec: str) -> Path | None:
    """The EAGLE-3 head folder `spec` names ("eagle3:demo": the demo's, "eagle3:PATH", or a
    folder whose config.json names the head architecture), else None."""
    if spec == "eagle3:demo":
        from arkinfer.frontend.demo import demo_eagle3_path

        return demo_eagle3_path()
    path = Path(spec.removeprefix("eagle3:"))
    return path if spec.startswith("eagle3:") or is_eagle3_head(path) else None


def is_eagle3_head(path: Path) -> bool:
    """Whether `path` is a folder whose config.json names the EAGLE-3 head architecture."""
    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        raw = json.loads(config.read_text())
    except (OSError, ValueError):
        return False
    return EAGLE3_ARCHITECTURE in (raw.get("architectures") or [])


def eagle3_draft(path: Path, target: Runner) -> Draft:
    """The EAGLE-3 head at `path` as a draft for `target`: loaded strictly and checked against
    the target (vocabulary, hidden size, layer count) before any weight is read."""
    from arkinfer.speculative.eagle3_draft import Eagle3Draft
    from arkinfer.speculative.eagle3_head import load_eagle3

    if not path.is_dir():
        raise ArkError(f"--draft eagle3:{path}: no such folder", hint="give the folder of an "
                       "EAGLE-3 head (config.json + model.safetensors)")
    head = load_eagle3(path, target_vocab_size=target.vocab_size,
                       target_hidden_size=getattr(target, "hidden_size", None) or None,
                       target_layers=getattr(target, "layer_count", None) or None,
                       target_embeddings=getattr(target, "input_embeddings", None))
    return Eagle3Draft(head, target, name=f"eagle3:{path.name}")
