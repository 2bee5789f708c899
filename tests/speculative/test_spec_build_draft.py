"""`arkinfer build --draft SOURCE [--draft-vocab K]`: the draft carried in the artifact and recorded
in its manifest, verify's speculative check run with it, and every bad request refused by the plan
before any work."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from arkinfer.errors import ArkError
from arkinfer.frontend.demo import demo_eagle3_path
from arkinfer.pipeline.artifact import load_runner
from arkinfer.pipeline.build import build
from arkinfer.pipeline.draft_artifact import artifact_draft
from arkinfer.pipeline.plan import resolve_plan
from arkinfer.pipeline.verify_speculative import (
    first_difference,
    greedy_mismatch,
    near_tie,
)
from arkinfer.speculative import SpecStats, plain_generate, speculative_generate

DRAFT_VOCAB = 640  # 31 % of the demo's 2048 tokens: FR-Spec's range


@pytest.fixture(scope="module")
def eagle_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("draft") / "demo-eagle"
    return build(resolve_plan("demo", target="host", quant="q4_0", out=out,
                              draft="eagle3:demo", draft_vocab=DRAFT_VOCAB)).path


def test_the_head_is_carried_and_recorded(eagle_artifact):
    manifest = json.loads((eagle_artifact / "arkinfer.json").read_text())
    draft = manifest["draft"]
    assert draft["kind"] == "eagle3" and draft["folder"] == "draft"
    assert draft["vocab_size"] == 2048 and draft["draft_vocab_size"] == DRAFT_VOCAB
    assert draft["frequencies"]["text"] == "builtin" and draft["frequencies"]["tokens"] > 10000
    assert "bfloat16" in draft["weights"]
    head_bytes = sum(p.stat().st_size for p in (eagle_artifact / "draft").iterdir())
    assert draft["bytes"] == head_bytes
    # memory.weights_bytes counts the target's weights only
    assert manifest["memory"]["weights_bytes"] == (eagle_artifact / "model.gguf").stat().st_size
    for name in ("draft/config.json", "draft/model.safetensors", "draft/token_frequencies.json"):
        assert name in manifest["files"]  # hashed like every other file of the artifact
    spec = manifest["verification"]["speculative"]
    assert spec["checked"] and spec["identical"] and spec["draft"].startswith("eagle3")


def test_the_carried_draft_keeps_greedy_output(eagle_artifact):
    manifest, target = load_runner(eagle_artifact)
    draft = artifact_draft(eagle_artifact, manifest, target)
    prompt = target.tokenize("Question: Why do we bake bread? Answer:")
    plain = list(plain_generate(target, prompt, 32))
    stats = SpecStats()
    spec = list(speculative_generate(target, draft, prompt, 32, k=4, stats=stats))
    assert stats.accepted > 0
    at = first_difference(plain, spec)
    if at is not None:  # only a near tie llama.cpp's batched and single-token kernels decide
        # differently (verify's rule: the margin within the two scorings' difference) may differ
        assert near_tie(target, prompt, plain, spec, at) is not None, greedy_mismatch(plain, spec)


def test_reduced_vocabulary_proposes_only_kept_tokens(eagle_artifact):
    counts = json.loads((eagle_artifact / "draft" / "token_frequencies.json").read_text())["counts"]
    manifest, target = load_runner(eagle_artifact)
    draft = artifact_draft(eagle_artifact, manifest, target)
    kept = set(draft.head.to_target(torch.arange(DRAFT_VOCAB)).tolist())
    assert len(kept) == DRAFT_VOCAB
    ranked = sorted(range(len(counts)), key=lambda t: (-counts[t], t))
    assert set(ranked[:DRAFT_VOCAB - 8]) <= kept  # the most frequent ids (stop ids may displace a few)


def test_lookup_is_recorded_without_files(tmp_path):
    path = build(resolve_plan("demo", target="host", quant="q4_0", out=tmp_path / "a",
                              draft="lookup")).path
    manifest = json.loads((path / "arkinfer.json").read_text())
    assert manifest["draft"] == {"source": "lookup", "kind": "lookup", "folder": None}
    assert not (path / "draft").exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"draft_vocab": 100}, "needs a draft head"),
    ({"draft": "lookup", "draft_vocab": 100}, "restricts an EAGLE-3 head"),
    ({"draft": "eagle3:demo", "draft_vocab": 5000}, "outside the model's vocabulary of 2048"),
    ({"draft": "self:9"}, "self:N must be 1..3"),
    ({"draft": "nonsense"}, "is not a draft"),
    ({"draft": "eagle3:demo", "backend": "tvm", "quant": "int4"}, "cannot run it"),
])
def test_bad_requests_fail_in_the_plan(tmp_path, kwargs, message):
    kwargs = {"quant": "q4_0", **kwargs}
    with pytest.raises(ArkError, match=message):
        resolve_plan("demo", target="host", out=tmp_path / "x", **kwargs)
    assert not (tmp_path / "x").exists()


def test_a_head_for_another_vocabulary_is_refused(tmp_path):
    head = tmp_path / "head"
    shutil.copytree(demo_eagle3_path(), head)
    config = json.loads((head / "config.json").read_text())
    config["vocab_size"] = 4096
    (head / "config.json").write_text(json.dumps(config))
    with pytest.raises(ArkError, match="4096"):
        resolve_plan("demo", target="host", quant="q4_0", out=tmp_path / "x",
                     draft=f"eagle3:{head}")


def test_run_and_serve_use_the_carried_draft_unless_told_not_to(eagle_artifact):
    from arkinfer.chat.model import open_chat_model

    carried = open_chat_model(eagle_artifact)
    assert carried.draft is not None and carried.draft.name.startswith("eagle3")
    assert open_chat_model(eagle_artifact, draft="none").draft is None
    assert open_chat_model(eagle_artifact, draft="lookup").draft.name == "lookup"
