"""An artifact's tokenizer: its own files, its GGUF metadata, else its float source; a clear error
when none is found."""

from __future__ import annotations

import json
import shutil

import pytest
from chat_support import QUESTION, RUNTIMES

from arkinfer.chat.tokenizer import artifact_tokenizer
from arkinfer.errors import TokenizerError
from arkinfer.frontend.demo import demo_model_path
from arkinfer.frontend.model_folder import open_checkpoint


@pytest.fixture(scope="module")
def demo_tokenizer():
    return open_checkpoint("demo").tokenizer


@pytest.mark.parametrize("backend", RUNTIMES)
def test_artifact_tokenizer_gives_the_models_ids(demo_artifact, demo_tokenizer, backend):
    path = demo_artifact(backend)
    manifest = json.loads((path / "arkinfer.json").read_text())
    tok, source = artifact_tokenizer(path, manifest, 2048)
    assert ("GGUF metadata" in source) == (backend == "gguf")
    assert tok.encode_chat(QUESTION) == demo_tokenizer.encode_chat(QUESTION)
    text = "Café 123 <|im_end|> naïve"
    assert tok.encode(text, parse_special=False) == demo_tokenizer.encode(text, parse_special=False)
    assert tok.stop_ids == demo_tokenizer.stop_ids
    assert tok.render_chat(QUESTION) == demo_tokenizer.render_chat(QUESTION)


def test_the_float_source_is_the_last_resort(tmp_path, demo_tokenizer):
    manifest = {"source": {"path": str(demo_model_path())}, "tokenizer": {}}
    tok, source = artifact_tokenizer(tmp_path, manifest, 2048)
    assert source.startswith("the float source")
    assert tok.encode_chat(QUESTION) == demo_tokenizer.encode_chat(QUESTION)


def test_a_changed_source_tokenizer_is_refused(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(demo_model_path(), source)
    manifest = {"source": {"path": str(source)}, "tokenizer": {"tokenizer_sha256": "0" * 64}}
    with pytest.raises(TokenizerError, match="differs from the tokenizer the artifact was built"):
        artifact_tokenizer(tmp_path / "artifact", manifest)


def test_no_tokenizer_anywhere_is_a_clear_error(tmp_path):
    manifest = {"source": {"path": str(tmp_path / "gone")}}
    with pytest.raises(TokenizerError) as info:
        artifact_tokenizer(tmp_path, manifest)
    assert str(tmp_path) in info.value.message and "no .gguf file" in info.value.message
    assert "rebuild the artifact" in info.value.hint
