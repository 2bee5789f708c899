"""`parse_draft`: each accepted form, and one clear error for each wrong one."""

from __future__ import annotations

import pytest
import torch
from spec_toy import BigramRunner

from arkinfer.errors import ArkError
from arkinfer.pipeline.draft import parse_draft
from arkinfer.speculative import LookupDraft, ModelDraft


def test_lookup_and_an_artifact_folder(gguf_pair, demo_gguf):
    target, _ = gguf_pair
    assert isinstance(parse_draft("lookup", target), LookupDraft)
    draft = parse_draft(str(demo_gguf), target)
    assert isinstance(draft, ModelDraft) and draft.name == demo_gguf.name


@pytest.mark.parametrize("spec,error,message", [
    ("self:9", ArkError, r"must be 1\.\.3"),
    ("self:x", ArkError, "number of layers"),
    ("no/such/folder", ArkError, "is not a draft: use 'lookup'"),
])
def test_wrong_forms_are_named(spec, error, message, gguf_pair):
    with pytest.raises(error, match=message):
        parse_draft(spec, gguf_pair[0])


def test_a_draft_with_another_vocabulary_is_refused(gguf_pair):
    with pytest.raises(ArkError, match="vocabulary of 4 tokens"):
        ModelDraft(BigramRunner(torch.zeros(4, 4)), gguf_pair[0], name="toy")
