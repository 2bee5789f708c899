"""verify's speculative check: on a runner that speculates, greedy decoding with a prompt-lookup
draft gives plain greedy decoding's tokens after every verify prompt, and the result (and the
manifest of a build) records it; a runner that does not speculate is recorded as not checked,
not failed; a difference fails verify, naming the prompt and the position."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from spec_support import built_demo
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.pipeline import manifest as mf
from arkinfer.pipeline.artifact import verify_artifact
from arkinfer.pipeline.reference_runner import ReferenceRunner
from arkinfer.pipeline.verify_speculative import (
    SPEC_K,
    SPEC_TOKENS,
    greedy_mismatch,
    near_tie,
)

cli = CliRunner()


@pytest.fixture(scope="module")
def demo_reference(tmp_path_factory):
    return built_demo("reference", tmp_path_factory.mktemp("spec") / "demo-ref", quant="q4_0")


def check_recorded(speculative: dict, prompts: int) -> None:
    assert speculative["checked"] is True and speculative["identical"] is True
    assert (speculative["draft"], speculative["k"]) == ("lookup", SPEC_K)
    assert speculative["prompts"] == prompts
    assert speculative["tokens"] == SPEC_TOKENS * prompts
    assert speculative["mean_accepted_length"] >= 1.0
    assert 0.0 <= speculative["acceptance_rate"] <= 1.0


def test_the_build_records_the_check_in_the_manifest(demo_gguf):
    verification = mf.read_manifest(demo_gguf)["verification"]  # read_manifest: schema-checked
    assert verification["passed"]
    check_recorded(verification["speculative"], len(verification["prompt_lengths"]))


def test_verify_records_the_check(demo_reference):
    res = cli.invoke(app, ["verify", str(demo_reference), "--json"])
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    assert result["passed"]
    check_recorded(result["speculative"], len(result["prompt_lengths"]))


def test_a_runner_that_does_not_speculate_is_not_checked_and_not_failed(demo_reference,
                                                                        monkeypatch):
    monkeypatch.setattr(ReferenceRunner, "speculates", False)
    result = verify_artifact(demo_reference)
    assert result["passed"], result["failures"]
    assert result["speculative"]["checked"] is False
    assert "ReferenceRunner cannot extend and truncate" in result["speculative"]["reason"]


def test_a_difference_fails_verify_naming_prompt_and_position(demo_reference, monkeypatch):
    # a broken runtime: its single-token decode disagrees with extend (parity uses neither)
    decode = ReferenceRunner.decode
    monkeypatch.setattr(ReferenceRunner, "decode", lambda self, token: decode(self, token).roll(1))
    result = verify_artifact(demo_reference)
    assert not result["passed"]
    assert result["speculative"]["identical"] is False
    failure = result["speculative"]["failure"]
    assert failure in result["failures"]
    assert failure.startswith(f"greedy speculative decoding (lookup, k={SPEC_K}) differs from "
                              "plain greedy decoding on prompt 1 of ")
    assert "at generated token 1 (plain " in failure


def test_greedy_mismatch_names_the_first_difference():
    assert greedy_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert greedy_mismatch([1, 2, 3], [1, 5, 3]) == "at generated token 1 (plain 2, speculative 5)"
    assert greedy_mismatch([1, 2], [1, 2, 3]) == "at generated token 2 (plain end, speculative 3)"


def test_the_schema_takes_the_record_and_refuses_a_bad_one(demo_gguf):
    manifest = mf.read_manifest(demo_gguf)
    unchecked = copy.deepcopy(manifest)
    unchecked["verification"]["speculative"] = {"checked": False, "reason": "no extend"}
    mf.validate(unchecked)
    bad = copy.deepcopy(manifest)
    bad["verification"]["speculative"]["k"] = 0
    with pytest.raises(mf.ManifestError):
        mf.validate(bad)


class _TwoScorings:
    """A runner whose single-token path and batched path score the last position with the given
    logits (what plain decoding and a verify step see)."""

    def __init__(self, single, batched) -> None:
        self.single, self.batched = torch.tensor(single), torch.tensor(batched)

    def reset(self) -> None:
        pass

    def prefill(self, ids):
        return self.single

    def decode(self, token):
        return self.single

    def extend(self, ids):
        return self.batched.repeat(len(ids), 1)


def test_a_near_tie_is_told_from_a_real_difference():
    """Plain prefers token 0 by 0.001, the batched scoring token 1: the scorings differ by 0.002
    of a range of 1 (kernel summation order) -> a near tie; a scoring that differs by the whole
    range is a broken runtime -> not a tie."""
    tie = near_tie(_TwoScorings([1.0, 0.999, 0.0, 0.0], [0.998, 1.0, 0.0, 0.0]), [3], [0], [1], 0)
    assert tie is not None and tie["at"] == 0
    assert tie["logit_gap"] == pytest.approx(0.001, abs=1e-6)
    assert tie["kernel_difference"] == pytest.approx(0.002, abs=1e-6)
    assert near_tie(_TwoScorings([1.0, 0.999, 0.0, 0.0], [0.0, 1.0, 0.9, 0.0]), [3], [0], [1],
                    0) is None
    assert near_tie(_TwoScorings([1.0, 0.5, 0.0, 0.0], [0.998, 1.0, 0.0, 0.0]), [3], [0], [1],
                    0) is None  # a clear margin is never a tie
