"""The demo model's tokenizer files (arkinfer/demo/) and the shipped corpus (arkinfer/data/)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "arkinfer" / "demo"
DATA = ROOT / "arkinfer" / "data"
SCRIPT = ROOT / "examples" / "demo_model" / "train_tokenizer.py"
FILES = ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"]

IDS = {"<unk>": 0, "<s>": 1, "</s>": 2, "<|im_start|>": 3, "<|im_end|>": 4,
       "<think>": 2046, "</think>": 2047}
FAST = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(str(DEMO / "tokenizer.json"))


@pytest.fixture(scope="module")
def config() -> dict:
    return json.loads((DEMO / "tokenizer_config.json").read_text(encoding="utf-8"))


# -- vocabulary and special tokens ---------------------------------------------------------------

def test_vocab_is_exactly_2048(tok):
    assert tok.get_vocab_size(with_added_tokens=True) == 2048
    assert 2048 % 64 == 0
    assert sorted(tok.get_vocab(with_added_tokens=True).values()) == list(range(2048))


def test_special_token_ids(tok):
    for token, tid in IDS.items():
        assert tok.token_to_id(token) == tid, token
        assert tok.id_to_token(tid) == token
    added = tok.get_added_tokens_decoder()
    assert sorted(added) == sorted(IDS.values())
    for tid, token in added.items():
        # <think>/</think> are added but not special (MiniCPM4.1 / Qwen3); the rest are special
        assert token.special is (token.content not in ("<think>", "</think>")), token.content


def test_special_tokens_match_in_text(tok):
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>", add_special_tokens=False).ids
    assert ids[0] == 3 and 4 in ids and 2046 in ids and ids[-1] == 2047


def test_tokenizer_config(config, tok):
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["bos_token"] == "<s>" and config["eos_token"] == "<|im_end|>"
    assert config["pad_token"] == "</s>" and config["unk_token"] == "<unk>"
    assert config["add_bos_token"] is True and config["add_eos_token"] is False
    assert config["model_max_length"] == 4096
    decoder = {int(k): v for k, v in config["added_tokens_decoder"].items()}
    assert {k: v["content"] for k, v in decoder.items()} == {v: k for k, v in IDS.items()}
    for tid, token in tok.get_added_tokens_decoder().items():
        assert decoder[tid]["special"] is token.special


def test_generation_config(tok):
    gen = json.loads((DEMO / "generation_config.json").read_text(encoding="utf-8"))
    assert gen == {"bos_token_id": 1, "do_sample": True, "eos_token_id": [2, 4], "pad_token_id": 2,
                   "temperature": 0.6, "top_p": 0.95}
    assert [tok.id_to_token(i) for i in gen["eos_token_id"]] == ["</s>", "<|im_end|>"]


# -- encoding ------------------------------------------------------------------------------------

def test_bos_added(tok):
    assert tok.encode("What is bread made from?").ids[0] == 1
    assert tok.encode("").ids == [1]
    plain = tok.encode("What is bread made from?", add_special_tokens=False).ids
    assert 1 not in plain and tok.encode("What is bread made from?").ids == [1] + plain


ROUND_TRIP = [
    "What is bread made from?",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\t\ttabs, runs of     spaces, and\n\nnewlines\r\n\n\n",
    "Caf\u00e9 na\u00efve fa\u00e7ade \u00fcber \u00c5ngstr\u00f6m",
    "\u4e16\u754c\u4f60\u597d \u3053\u3093\u306b\u3061\u306f \u041f\u0440\u0438\u0432\u0435\u0442 \u0645\u0631\u062d\u0628\u0627",
    "emoji \U0001F35E\U0001F469\u200d\U0001F373 \U0001F1EF\U0001F1F5 \u2764\ufe0f",
    "def f(x):\n    return {'a': [x ** 2, x // 3]}  # comment\n",
    "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>\n\n",
    "<s> </s> <unk> <think>",
    "\x00\x01\x7f control \ufffd",
    "",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text
    with_bos = tok.encode(text).ids
    assert tok.decode(with_bos, skip_special_tokens=True) == text.replace("<s>", "").replace(
        "</s>", "").replace("<unk>", "").replace("<|im_start|>", "").replace("<|im_end|>", "")


def test_think_tokens_survive_skip_special(tok):
    ids = tok.encode("<think>\nhmm\n</think>\n\nYes.<|im_end|>").ids
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\nhmm\n</think>\n\nYes."


def test_corpus_compresses(tok):
    text = (DATA / "corpus_eval.txt").read_text(encoding="utf-8")
    # a 2048-token BPE on English prose: well over 3 bytes per token
    assert len(text.encode()) / len(tok.encode(text, add_special_tokens=False).ids) > 3.0


# -- chat template -------------------------------------------------------------------------------

def _render(template: str, messages, trim: bool = True, **kwargs) -> str:
    env = jinja2.Environment(trim_blocks=trim, lstrip_blocks=trim)
    return env.from_string(template).render(messages=messages, **kwargs)


@pytest.fixture(scope="module")
def template(config) -> str:
    return config["chat_template"]


def test_template_file_matches_config(template):
    assert (DEMO / "chat_template.jinja").read_text(encoding="utf-8") == template


USER = [{"role": "user", "content": "What is bread made from?"}]
SYSTEM_USER = [{"role": "system", "content": "You are a helpful assistant."},
               {"role": "user", "content": "Hello!"}]
CASES = [
    # (messages, kwargs, expected)
    (USER, {"add_generation_prompt": True},
     "<|im_start|>user\nWhat is bread made from?<|im_end|>\n<|im_start|>assistant\n"),
    (USER, {"add_generation_prompt": False},
     "<|im_start|>user\nWhat is bread made from?<|im_end|>\n"),
    (SYSTEM_USER, {"add_generation_prompt": True},
     "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
     "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"),
    (USER, {"add_generation_prompt": True, "enable_thinking": False},
     "<|im_start|>user\nWhat is bread made from?<|im_end|>\n<|im_start|>assistant\n" + FAST),
    (USER, {"add_generation_prompt": True, "enable_thinking": True},
     "<|im_start|>user\nWhat is bread made from?<|im_end|>\n<|im_start|>assistant\n"),
    (SYSTEM_USER, {"add_generation_prompt": True, "enable_thinking": False},
     "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
     "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n" + FAST),
    ([{"role": "user", "content": "Hi there /no_think"}], {"add_generation_prompt": True},
     "<|im_start|>user\nHi there /no_think<|im_end|>\n<|im_start|>assistant\n" + FAST),
    ([{"role": "user", "content": "Hi there /no_think"}],
     {"add_generation_prompt": True, "enable_thinking": True},
     "<|im_start|>user\nHi there /no_think<|im_end|>\n<|im_start|>assistant\n" + FAST),
    ([{"role": "user", "content": "Think hard /think"}],
     {"add_generation_prompt": True, "enable_thinking": False},  # the hard switch wins
     "<|im_start|>user\nThink hard /think<|im_end|>\n<|im_start|>assistant\n" + FAST),
    # the most recent soft switch counts; reasoning of earlier assistant turns is dropped
    ([{"role": "user", "content": "Quick one /no_think"},
      {"role": "assistant", "content": "<think>\n\n</think>\n\nSure."},
      {"role": "user", "content": "Now a hard one /think"}], {"add_generation_prompt": True},
     "<|im_start|>user\nQuick one /no_think<|im_end|>\n<|im_start|>assistant\nSure.<|im_end|>\n"
     "<|im_start|>user\nNow a hard one /think<|im_end|>\n<|im_start|>assistant\n"),
    ([{"role": "user", "content": "Quick one /no_think"},
      {"role": "assistant", "content": "Sure."},
      {"role": "user", "content": "And another?"}], {"add_generation_prompt": True},
     "<|im_start|>user\nQuick one /no_think<|im_end|>\n<|im_start|>assistant\nSure.<|im_end|>\n"
     "<|im_start|>user\nAnd another?<|im_end|>\n<|im_start|>assistant\n" + FAST),
]


@pytest.mark.parametrize("trim", [True, False])
@pytest.mark.parametrize("messages,kwargs,expected", CASES)
def test_chat_template(template, messages, kwargs, expected, trim):
    assert _render(template, messages, trim=trim, **kwargs) == expected


def test_chat_template_bos(template):
    """Renderers that pass bos_token (arkinfer, transformers) get it first, exactly once."""
    out = _render(template, USER, add_generation_prompt=True, bos_token="<s>", enable_thinking=False)
    assert out == "<s><|im_start|>user\nWhat is bread made from?<|im_end|>\n<|im_start|>assistant\n" + FAST


def test_chat_through_arkinfer_loader(tok):
    from arkinfer.frontend.tokenizer import load_tokenizer

    gen = json.loads((DEMO / "generation_config.json").read_text(encoding="utf-8"))
    text_tok = load_tokenizer(DEMO, gen)
    assert text_tok.vocab_size == 2048 and text_tok.stop_ids == {2, 4}
    ids = text_tok.encode_chat(USER, enable_thinking=False)
    expected = "<s>" + _render(text_tok.chat_template, USER, add_generation_prompt=True,
                               enable_thinking=False)
    assert ids[:2] == [1, 3] and ids.count(1) == 1  # one BOS, from the template
    assert ids == tok.encode(expected, add_special_tokens=False).ids
    assert text_tok.decode(ids) == expected


# -- determinism -----------------------------------------------------------------------------------

def test_training_reproduces_files(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (DEMO / name).read_bytes(), name


# -- corpus ------------------------------------------------------------------------------------------

def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def _sentences(text: str) -> set[str]:
    parts = re.split(r"(?<=[.!?])\s+", text)
    return {" ".join(s.lower().split()) for s in parts if len(s.split()) >= 6}


@pytest.mark.parametrize("name,lo,hi", [("corpus_train.txt", 60_000, 80_000),
                                        ("corpus_eval.txt", 15_000, 20_000)])
def test_corpus_files(name, lo, hi):
    raw = (DATA / name).read_bytes()
    assert lo <= len(raw) <= hi
    text = raw.decode("ascii")  # plain ASCII
    assert all(c == "\n" or " " <= c <= "~" for c in text)
    assert "\r" not in text and "\n\n\n" not in text and text.endswith("\n")
    paras = _paragraphs(text)
    assert len(paras) == len(set(paras)), "duplicate paragraph"
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    assert hashlib.sha256(raw).hexdigest() in readme, f"update the sha256 of {name} in README.md"
    assert f"{len(raw):,}" in readme and f"{len(text.split()):,}" in readme


def test_eval_is_held_out():
    train = (DATA / "corpus_train.txt").read_text(encoding="utf-8")
    held = (DATA / "corpus_eval.txt").read_text(encoding="utf-8")
    assert not set(_paragraphs(train)) & set(_paragraphs(held))
    assert not _sentences(train) & _sentences(held)


def test_train_has_chat_pairs():
    paras = _paragraphs((DATA / "corpus_train.txt").read_text(encoding="utf-8"))
    qa = [p for p in paras if p.startswith("Question:")]
    assert len(qa) >= 30
    assert all(re.match(r"^Question: .+\nAnswer: .+$", p, re.S) for p in qa)
