"""`arkinfer run ARTIFACT` streams the artifact's own greedy reply and names its runtime;
`arkinfer serve` is registered with its options and refuses a bad model before serving."""

from __future__ import annotations

import pytest
from chat_support import QUESTION
from typer.testing import CliRunner

from arkinfer.chat.generation import GenerationSettings, generate_tokens
from arkinfer.chat.model import open_chat_model
from arkinfer.cli.main import app

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()


@pytest.mark.parametrize("backend", [pytest.param("gguf", marks=pytest.mark.llamacpp),
                                     "reference"])
def test_run_an_artifact_on_its_own_runtime(demo_artifact, backend):
    path = demo_artifact(backend)
    model = open_chat_model(path)
    tokens = generate_tokens(model.runner, model.encode_chat(QUESTION), GenerationSettings(48),
                             model.stop_ids)
    want = model.tokenizer.decode(list(tokens), skip_special_tokens=True)
    result = runner.invoke(app, ["run", str(path), "-p", QUESTION[0]["content"], "-n", "48"])
    assert result.exit_code == 0, result.output
    assert f"· {backend} runtime (artifact)" in result.stderr
    assert result.stdout == want + "\n"


@pytest.mark.parametrize("backend", [pytest.param("gguf", marks=pytest.mark.llamacpp),
                                     "reference"])
def test_run_with_a_draft_prints_the_plain_greedy_reply(demo_artifact, backend):
    """--draft lookup speculates (stderr reports the verify steps) and prints exactly the reply
    plain greedy decoding prints; --draft on a model folder is refused."""
    path = str(demo_artifact(backend))
    args = ["run", path, "-p", "Repeat: the cat sat on the mat, the cat sat on the mat.",
            "-n", "32"]
    plain = runner.invoke(app, args)
    spec = runner.invoke(app, [*args, "--draft", "lookup", "--draft-k", "3"])
    assert plain.exit_code == 0 and spec.exit_code == 0, spec.output
    assert spec.stdout == plain.stdout
    assert "speculative (lookup, k=3):" in spec.stderr and "mean accepted length" in spec.stderr
    refused = runner.invoke(app, ["run", "demo", "--draft", "lookup"])
    assert refused.exit_code == 1 and "not an artifact folder" in refused.output


@pytest.mark.llamacpp
def test_run_an_artifact_checks_the_context_first(demo_artifact):
    result = runner.invoke(app, ["run", str(demo_artifact("gguf")), "-n", "5000"])
    assert result.exit_code == 1
    assert "> the artifact's context of 2048 tokens, set by the runtime's KV cache (n_ctx)" \
        in result.output
    assert "hint: lower -n to" in result.output


def test_serve_is_registered_with_its_options():
    result = runner.invoke(app, ["serve", "--help"])
    assert result.exit_code == 0, result.output
    for option in ("--host", "--port", "--max-tokens-limit", "--max-queue", "arkinfer serve"):
        assert option in result.output


def test_serve_refuses_a_missing_model_before_listening(tmp_path):
    pytest.importorskip("fastapi", reason="pip install 'arkinfer[serve]'")
    result = runner.invoke(app, ["serve", str(tmp_path / "nothing"), "--port", "0"])
    assert result.exit_code == 1
    assert "error:" in result.output and "does not exist" in result.output
