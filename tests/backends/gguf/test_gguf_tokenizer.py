"""Tokenizers survive GGUF -> HF (import) -> GGUF (lower): the vocabulary metadata equals the
original file's, and llama.cpp tokenises every text to the same ids with both files."""

from __future__ import annotations

import pytest
import torch

gguf = pytest.importorskip("gguf")
llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from arkinfer.backends.gguf.backend import BACKEND
from arkinfer.backends.gguf.runner import LlamaCppRunner
from arkinfer.backends.gguf.tokenizer import read_vocab

from arkinfer.backend import LowerRequest
from arkinfer.errors import TokenizerError
from arkinfer.frontend.gguf_import import import_gguf
from arkinfer.testing.gguf_synthetic import write_tiny_gguf

pytestmark = pytest.mark.llamacpp

TEXTS = [
    "Hello world", "The quick brown fox jumps over the lazy dog. Hello there!",
    "def main():\n    return 42\n# comment\nprint('hi')  # ok\n",
    "Numbers 1234567 and 3.14; the theory of the thing, then the other one.",
    "I'm sure you're right; they'll say it's fine", "Café naïve — Zürich 日本語 😀",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "   leading  runs   ", "",
    "a\n\n\nb\r\n c \t\t d", "text<|im_end|>more<|endoftext|><tool_call>x", "</s><s> hello <unk>",
]
KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id", "tokenizer.chat_template")


def _fields(path) -> dict:
    reader = gguf.GGUFReader(path)
    return {k: reader.fields[k].contents() for k in KEYS if k in reader.fields}


def _roundtrip(tmp_path, tokenizer: str, pre: str | None):
    original = tmp_path / "original.gguf"
    write_tiny_gguf(original, "llama", tokenizer=tokenizer, pre=pre)
    hf = tmp_path / "hf"
    import_gguf(original, hf)
    out = tmp_path / "art"
    BACKEND.lower(LowerRequest(hf, hf, None, "f32", None, out))
    return original, out / "model.gguf"


@pytest.mark.parametrize("tokenizer,pre", [("gpt2", "smollm"), ("gpt2", "gpt-2"),
                                           ("gpt2", "qwen2"), ("gpt2", "llama-bpe"),
                                           ("llama", None)])
def test_vocabulary_and_ids_survive_the_round_trip(tmp_path, tokenizer, pre):
    original, ours = _roundtrip(tmp_path, tokenizer, pre)
    a, b = _fields(original), _fields(ours)
    same = [k for k in KEYS if k != "tokenizer.ggml.padding_token_id"]
    assert {k: b.get(k) for k in same} == {k: a.get(k) for k in same}
    ref = llama_cpp.Llama(str(original), vocab_only=True, verbose=False)
    mine = llama_cpp.Llama(str(ours), vocab_only=True, verbose=False)
    for text in TEXTS:
        for add_bos in (True, False):
            for special in (True, False):
                expected = ref.tokenize(text.encode(), add_bos=add_bos, special=special)
                assert mine.tokenize(text.encode(), add_bos=add_bos, special=special) == \
                    expected, (text, add_bos, special)


def test_reexported_weights_give_the_original_logits(tmp_path):
    """import (undo the q/k permutation) then lower (redo it): llama.cpp logits are unchanged."""
    original, ours = _roundtrip(tmp_path, "gpt2", "smollm")
    ids = torch.randint(3, 300, (60,), generator=torch.Generator().manual_seed(0)).tolist()
    a = LlamaCppRunner(original, n_ctx=256, kv_type="f32").window_logits(ids)
    b = LlamaCppRunner(ours, n_ctx=256, kv_type="f32").window_logits(ids)
    assert torch.equal(a, b)


def test_tokenizer_larger_than_the_model_is_refused(tmp_path):
    original = tmp_path / "original.gguf"
    write_tiny_gguf(original, "llama")
    import_gguf(original, tmp_path / "hf")
    with pytest.raises(TokenizerError, match="vocab_size=100"):
        read_vocab(tmp_path / "hf", 100, {})
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        read_vocab(tmp_path, 100, {})
