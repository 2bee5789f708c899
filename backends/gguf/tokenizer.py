"""A Hugging Face tokenizer folder as a GGUF vocabulary (`tokenizer.ggml.*`), so llama.cpp gives the
same ids as the `tokenizers` library. The reverse of `arkinfer/frontend/gguf_tokenizer.py`, whose
tables it reuses.

Two tokenizer.json models are carried (anything else is refused, naming the model type):

- byte-level BPE (a `ByteLevel` pre-tokenizer or decoder) -> `tokenizer.ggml.model = "gpt2"`:
  tokens are the vocabulary strings (GPT-2 byte characters), merges "a b" in rank order.
  `tokenizer.ggml.pre` names llama.cpp's split rules; it is found by behaviour: the first entry of
  `gguf_tokenizer.PRE_TOKENIZERS` whose pre-tokenizer cuts a set of probe texts into the same
  pieces as the file's own pre-tokenizer (and agrees on `ignore_merges`).
- SentencePiece-style BPE (byte fallback, "▁" for spaces) -> `"llama"`: llama.cpp's SPM tokenizer
  merges the adjacent pair whose *result* has the highest score, so a token's score is minus the
  rank of the first merge producing it (earlier merge = higher score); pieces no merge produces
  score below every merge. `<0xXX>` tokens are BYTE, the unk token UNKNOWN.

Token types: special added tokens -> CONTROL, other added tokens -> USER_DEFINED (llama.cpp
matches both in text), ids between the tokenizer's last id and the model's vocab_size are
`[PAD{id}]` UNUSED (as convert_hf_to_gguf.py pads). bos / eos / unk / pad come from
tokenizer_config.json (token strings), falling back to config.json ids; a second stop id in
generation_config.json's eos list becomes `tokenizer.ggml.eot_token_id`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arkinfer.errors import TokenizerError
from arkinfer.frontend.gguf_tokenizer import (
    BYTE,
    CONTROL,
    NORMAL,
    PRE_TOKENIZERS,
    UNKNOWN,
    UNUSED,
    USER_DEFINED,
    build_pre_tokenizer,
)

# Texts whose pre-tokenisation tells llama.cpp's split rules apart (digits, contractions, runs of
# spaces and newlines, letters of several scripts, punctuation clusters).
PROBES = (
    "Hello world, it's 2024-01-01 and I'm 1234567 years old!! 3.14159",
    "I'M SURE YOU'RE RIGHT; THEY'LL SAY IT'S FINE, WE'VE DONE IT, I'D THINK.",
    "def f(x):\n    return x**2  # square\n\n\n\tindent\r\n end   ",
    "Café naïve — Zürich 日本語のテキスト 中文字符，한국어 Привет мир مرحبا 😀🚀",
    "$$\\frac{a}{b}$$ <div class=\"x\">&amp;</div> a+b=c ^~|<> ... ??? !!!",
    "   leading and trailing   ",
    "x1y22z333w4444 123456789012 1,000,000",
)


@dataclass
class GGUFVocab:
    """Everything `write_vocab` puts under `tokenizer.*`; `kind` is a one-line summary."""

    model: str  # "gpt2" or "llama"
    pre: str | None
    tokens: list[str]
    types: list[int]
    scores: list[float] | None
    merges: list[str] | None
    ids: dict[str, int | None]  # bos, eos, unk, pad, eot
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool | None
    chat_template: str | list[dict[str, str]] | None
    kind: str


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{path} is not valid JSON: {exc}", hint="fix or re-export the file")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken serialised as {"content": ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def _walk(node: Any, kind: str) -> list[dict[str, Any]]:
    """Every component of type `kind` in a (possibly nested Sequence) normalizer / pre-tokenizer."""
    if not isinstance(node, dict):
        return []
    found = [node] if node.get("type") == kind else []
    for key in ("pretokenizers", "normalizers", "processors", "decoders"):
        for child in node.get(key) or []:
            found += _walk(child, kind)
    return found


def _merge_strings(raw: list[Any]) -> list[tuple[str, str]]:
    out = []
    for m in raw:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        out.append((a, b))
    return out


def _choose_pre(data: dict[str, Any], folder: Path) -> str:
    """The llama.cpp pre-tokenizer name whose splits equal the file's (see the module docstring)."""
    from tokenizers import Tokenizer

    if data.get("pre_tokenizer") is None:
        raise TokenizerError(f"{folder}/tokenizer.json has a byte-level BPE model but no "
                             "pre-tokenizer, which no llama.cpp split rule reproduces",
                             hint="export the tokenizer with its pre_tokenizer")
    # only the pre-tokenizer is needed: an empty BPE model beside it parses in microseconds,
    # where the file's own 49K-token vocabulary and merges took a quarter of a second
    own = Tokenizer.from_str(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {},
                                                                      "merges": []},
                                         "pre_tokenizer": data["pre_tokenizer"]})).pre_tokenizer
    ignore = bool(data["model"].get("ignore_merges", False))
    expected = [[p for p, _ in own.pre_tokenize_str(t)] for t in PROBES]
    tried = []
    for name, rules in PRE_TOKENIZERS.items():
        if rules in tried:
            continue  # aliases of a rule set already tried
        tried.append(rules)
        cand = build_pre_tokenizer(rules)
        if rules.ignore_merges == ignore and \
                all([p for p, _ in cand.pre_tokenize_str(t)] == e for t, e in zip(PROBES, expected)):
            return name
    raise TokenizerError(f"the pre-tokenizer of {folder}/tokenizer.json splits text unlike every "
                         "llama.cpp rule ArkInfer knows, so llama.cpp's ids would differ",
                         hint="known tokenizer.ggml.pre rules: "
                         + ", ".join(sorted(PRE_TOKENIZERS)))


def _spm_scores(tokens: list[str], merges: list[tuple[str, str]]) -> list[float]:
    first_rank: dict[str, int] = {}
    for rank, (a, b) in enumerate(merges):
        first_rank.setdefault(a + b, rank)
    n = len(merges)
    return [-float(first_rank[t]) if t in first_rank else -float(n + i)
            for i, t in enumerate(tokens)]


def _add_bos_from_template(data: dict[str, Any], bos: str | None) -> bool:
    for proc in _walk(data.get("post_processor"), "TemplateProcessing"):
        single = proc.get("single") or []
        if single and "SpecialToken" in single[0]:
            return single[0]["SpecialToken"].get("id") == bos
    return False


def _chat_template(folder: Path, tcfg: dict[str, Any]) -> str | list[dict[str, str]] | None:
    template = tcfg.get("chat_template")
    jinja = folder / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    return template


def read_vocab(folder: Path, vocab_size: int, config: dict[str, Any]) -> GGUFVocab:
    """The GGUF vocabulary of the tokenizer files in `folder` for a model of `vocab_size` rows.

    Raises TokenizerError when there is no tokenizer.json, its model is not BPE, or it holds more
    ids than the model has embedding rows.
    """
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"{folder} has no tokenizer.json; a GGUF file must embed its "
                             "tokenizer for llama.cpp", hint="copy the model's tokenizer.json "
                             "(and tokenizer_config.json) into the checkpoint folder")
    data = _read_json(path)
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise TokenizerError(f"{path} holds a {model.get('type')!r} tokenizer model; the GGUF "
                             "backend writes BPE vocabularies (byte-level or SentencePiece-style)",
                             hint="use a BPE tokenizer.json (transformers converts SentencePiece "
                             "models to one)")
    tcfg = _read_json(folder / "tokenizer_config.json")
    gen = _read_json(folder / "generation_config.json")
    vocab: dict[str, int] = model["vocab"]
    added = {int(t["id"]): t for t in data.get("added_tokens") or []}
    top = max([*vocab.values(), *added]) + 1
    if top > vocab_size:
        raise TokenizerError(f"{path} has ids up to {top - 1} but the model has vocab_size="
                             f"{vocab_size} embedding rows", hint="the tokenizer does not "
                             "belong to this checkpoint")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [UNUSED] * vocab_size
    for text, i in vocab.items():
        tokens[i], types[i] = text, NORMAL
    byte_level = bool(_walk(data.get("pre_tokenizer"), "ByteLevel") or
                      _walk(data.get("decoder"), "ByteLevel"))
    spm = not byte_level and bool(model.get("byte_fallback"))
    if not (byte_level or spm):
        raise TokenizerError(f"{path} is a BPE model that is neither byte-level nor "
                             "SentencePiece-style (byte_fallback), which llama.cpp cannot run",
                             hint="use a byte-level BPE or a SentencePiece tokenizer")
    unk = model.get("unk_token")
    if spm:
        for i, t in enumerate(tokens):
            if re.fullmatch(r"<0x[0-9A-F]{2}>", t):
                types[i] = BYTE
    for i, t in added.items():
        tokens[i] = t["content"]
        types[i] = CONTROL if t.get("special", False) else USER_DEFINED
    if unk is not None and unk in vocab:
        types[vocab[unk]] = UNKNOWN

    lookup = {t: i for i, t in reversed(list(enumerate(tokens)))}  # first id of a string

    def id_of(key: str, config_key: str) -> int | None:
        text = _token_text(tcfg.get(key))
        if text is not None and text in lookup:
            return lookup[text]
        value = config.get(config_key, gen.get(config_key))
        value = value[0] if isinstance(value, list) and value else value
        return value if isinstance(value, int) and 0 <= value < vocab_size else None

    ids = {"bos": id_of("bos_token", "bos_token_id"), "eos": id_of("eos_token", "eos_token_id"),
           "unk": id_of("unk_token", "unk_token_id"), "pad": id_of("pad_token", "pad_token_id"),
           "eot": None}
    stops = gen.get("eos_token_id", config.get("eos_token_id"))
    extra = [s for s in (stops if isinstance(stops, list) else [stops])
             if isinstance(s, int) and s != ids["eos"] and 0 <= s < vocab_size]
    if extra:
        ids["eot"] = extra[0]
    bos_text = tokens[ids["bos"]] if ids["bos"] is not None else None
    add_bos = tcfg.get("add_bos_token")
    add_bos = _add_bos_from_template(data, bos_text) if add_bos is None else bool(add_bos)
    add_eos = bool(tcfg.get("add_eos_token", False))
    raw_merges = model.get("merges") or []
    count = len(set(vocab.values()) | set(added))
    template = _chat_template(folder, tcfg)
    if byte_level:
        pre = _choose_pre(data, folder)
        lines = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in raw_merges]
        return GGUFVocab("gpt2", pre, tokens, types, None, lines, ids,
                         add_bos, add_eos, None, template,
                         f"byte-level BPE (tokenizer.ggml.pre '{pre}'), {count} tokens"
                         f", {len(lines)} merges")
    prefix = bool(_walk(data.get("normalizer"), "Prepend")) or any(
        m.get("prepend_scheme", "always") != "never" and m.get("add_prefix_space", True)
        for m in _walk(data.get("pre_tokenizer"), "Metaspace"))
    merges = _merge_strings(raw_merges)
    return GGUFVocab("llama", None, tokens, types, _spm_scores(tokens, merges), None, ids,
                     add_bos, add_eos, prefix, template,
                     f"SentencePiece BPE (byte fallback), {count} tokens")


def write_vocab(writer: Any, v: GGUFVocab) -> None:
    """Add the `tokenizer.*` keys of `v` to a gguf.GGUFWriter."""
    writer.add_tokenizer_model(v.model)
    if v.pre is not None:
        writer.add_tokenizer_pre(v.pre)
    writer.add_token_list(v.tokens)
    writer.add_token_types(v.types)
    if v.scores is not None:
        writer.add_token_scores(v.scores)
    if v.merges is not None:
        writer.add_token_merges(v.merges)
    setters = {"bos": writer.add_bos_token_id, "eos": writer.add_eos_token_id,
               "unk": writer.add_unk_token_id, "pad": writer.add_pad_token_id,
               "eot": writer.add_eot_token_id}
    for key, value in v.ids.items():
        if value is not None:
            setters[key](value)
    writer.add_add_bos_token(v.add_bos)
    writer.add_add_eos_token(v.add_eos)
    if v.add_space_prefix is not None:
        writer.add_add_space_prefix(v.add_space_prefix)
    if v.chat_template is not None:
        writer.add_chat_template(v.chat_template)
