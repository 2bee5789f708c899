"""Rebuild tokenizer.json / tokenizer_config.json from a GGUF vocabulary.

Two GGUF tokenizer models are supported, each rebuilt so the `tokenizers` library gives the same
ids as llama.cpp:

- `gpt2`: byte-level BPE. Vocab = `tokenizer.ggml.tokens`, merges = `tokenizer.ggml.merges`
  ("a b" strings, rank order). The pre-tokenizer regex depends on `tokenizer.ggml.pre`; the table
  below copies llama.cpp's llama-vocab.cpp choices (e.g. `smollm` = GPT-2 regex after splitting
  every digit on its own).
- `llama`: SentencePiece. Vocab + `tokenizer.ggml.scores`; BPE merges are derived from the scores
  the way transformers' `LlamaConverter` does (a piece's score ranks every split of it into two
  pieces), with byte fallback (`<0x41>` tokens), "▁" for spaces and a "▁" prefix per text segment
  (llama.cpp prefixes a space at the start and after every special token).

Token types (`tokenizer.ggml.token_type`): CONTROL (3) and UNKNOWN (2) become special added tokens,
USER_DEFINED (4) non-special added tokens; both are matched in text before the model runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arkinfer.errors import GGUFError
from arkinfer.frontend.gguf_reader import GGUFFile

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2_RX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_QWEN2_RX = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_RX = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreTokenizer:
    """llama.cpp's split rules for one `tokenizer.ggml.pre` (llama-vocab.cpp).

    `regexes` are applied one after another, each splitting the pieces of the previous one
    (matches and the text between them both become pieces), then bytes map to GPT-2 characters.
    "gpt2" stands for ByteLevel's built-in GPT-2 regex, "digits" for one piece per digit.
    """

    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word that is itself a token skips the merges (Llama 3)
    add_bos: bool = False  # llama.cpp's default when tokenizer.ggml.add_bos_token is absent


PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2_RX, r"\p{N}+", "[0-9][0-9][0-9]")),
    **dict.fromkeys(("gpt-2", "mpt", "olmo", "jais"), PreTokenizer(("gpt2",))),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                     "minerva-7b"), PreTokenizer(("digits", "gpt2"))),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"),
                    PreTokenizer((_QWEN2_RX,))),
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral"),
                    PreTokenizer((_LLAMA3_RX,), ignore_merges=True, add_bos=True)),
}


@dataclass(frozen=True)
class TokenizerFiles:
    """The rebuilt tokenizer: `tokenizer` (tokenizers.Tokenizer) and the two JSON configs."""

    tokenizer: Any
    tokenizer_config: dict[str, Any]
    kind: str  # human summary, e.g. "byte-level BPE (pre 'smollm'), 49152 tokens"
    model: str  # tokenizer.ggml.model


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)  # a duplicate string keeps its first id, as llama.cpp does
    return vocab


def _spm_merges(tokens: list[str], scores: list[float], vocab: dict[str, int]
                ) -> list[tuple[str, str]]:
    """Merges ranked by the merged piece's score (high first), then longer left/right pieces."""
    merges: list[tuple[str, str, float]] = []
    for piece, score in zip(tokens, scores):
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _gpt2_merges(raw: list[str]) -> list[tuple[str, str]]:
    merges = []
    for i, merge in enumerate(raw):
        parts = merge.split(" ")
        if len(parts) != 2:
            raise GGUFError(f"tokenizer.ggml.merges[{i}] = {merge!r} is not two tokens separated "
                            "by one space", hint="the GGUF vocabulary is damaged; re-convert it")
        merges.append((parts[0], parts[1]))
    return merges


def build_pre_tokenizer(pre: PreTokenizer):
    """The `tokenizers` pre-tokenizer that splits text like llama.cpp does for `pre`."""
    from tokenizers import Regex, pre_tokenizers

    steps = []
    for rx in pre.regexes:
        if rx == "digits":
            steps.append(pre_tokenizers.Digits(individual_digits=True))
        elif rx != "gpt2":
            steps.append(pre_tokenizers.Split(Regex(rx), behavior="isolated", invert=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex="gpt2" in pre.regexes)
    return pre_tokenizers.Sequence([*steps, byte_level]) if steps else byte_level


def _template(tokens: list[str], bos: int | None, eos: int | None, add_bos: bool, add_eos: bool):
    from tokenizers import processors

    specials, single, pair = [], ["$A:0"], ["$A:0"]
    if add_bos and bos is not None:
        specials.append((tokens[bos], bos))
        single.insert(0, f"{tokens[bos]}:0")
        pair = [f"{tokens[bos]}:0", "$A:0", f"{tokens[bos]}:1", "$B:1"]
    else:
        pair = ["$A:0", "$B:1"]
    if add_eos and eos is not None:
        if tokens[eos] not in [s for s, _ in specials]:
            specials.append((tokens[eos], eos))
        single.append(f"{tokens[eos]}:0")
        pair.insert(pair.index("$A:0") + 1, f"{tokens[eos]}:0")
        pair.append(f"{tokens[eos]}:1")
    return processors.TemplateProcessing(single=" ".join(single), pair=" ".join(pair),
                                         special_tokens=specials)


def _byte_level_bpe(f: GGUFFile, pre: str, vocab: dict[str, int]) -> tuple[Any, list, str]:
    """`gpt2` vocabularies: BPE with the GGUF merges and llama.cpp's split rules for `pre`."""
    from tokenizers import Tokenizer, decoders, models, processors

    if pre not in PRE_TOKENIZERS:
        raise GGUFError(f"{f.path.name} uses the BPE pre-tokenizer {pre!r}, whose split "
                        "rules ArkInfer does not know, so ids could differ from llama.cpp",
                        hint="supported tokenizer.ggml.pre values: "
                        + ", ".join(sorted(PRE_TOKENIZERS)))
    merges = _gpt2_merges(f.get("tokenizer.ggml.merges", []))
    rules = PRE_TOKENIZERS[pre]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=rules.ignore_merges,
                               fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = build_pre_tokenizer(rules)
    tok.decoder = decoders.ByteLevel()
    kind = f"byte-level BPE (pre-tokenizer '{pre}'), {len(vocab)} tokens, {len(merges)} merges"
    return tok, [processors.ByteLevel(trim_offsets=False)], kind


def _sentencepiece_bpe(f: GGUFFile, tokens: list[str], vocab: dict[str, int],
                       unk_id: int | None) -> tuple[Any, list, str]:
    """`llama` vocabularies: score-ranked merges, byte fallback, "▁" for spaces."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = f.get("tokenizer.ggml.scores", None)
    if scores is None or len(scores) != len(tokens):
        raise GGUFError(f"{f.path.name}: a 'llama' (SentencePiece) vocabulary needs "
                        f"tokenizer.ggml.scores for all {len(tokens)} tokens",
                        hint="the GGUF vocabulary is damaged; re-convert it")
    unk = tokens[unk_id] if unk_id is not None else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=_spm_merges(tokens, scores, vocab),
                               unk_token=unk, fuse_unk=True, byte_fallback=True))
    # llama.cpp prefixes a space to every text fragment that starts the text or follows a special
    # token; HF normalisers run per fragment between added tokens, so Prepend does the same.
    prefix = bool(f.get("tokenizer.ggml.add_space_prefix", True))
    space = normalizers.Replace(" ", "▁")
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), space]) if prefix else space
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok, [], f"SentencePiece BPE (byte fallback), {len(tokens)} tokens"


def build_tokenizer(f: GGUFFile, model_max_length: int | None = None) -> TokenizerFiles:
    """tokenizers.Tokenizer + tokenizer_config.json dict for the GGUF's vocabulary.

    Raises GGUFError for a tokenizer model or pre-tokenizer it cannot rebuild exactly.
    """
    from tokenizers import AddedToken, processors

    model = f.get("tokenizer.ggml.model", None)
    if model not in ("gpt2", "llama"):
        raise GGUFError(f"{f.path.name} has tokenizer model {model!r}; ArkInfer rebuilds only "
                        "'gpt2' (byte-level BPE) and 'llama' (SentencePiece) vocabularies",
                        hint="import a model with a supported tokenizer")
    tokens: list[str] = f.get("tokenizer.ggml.tokens")
    n = len(tokens)
    types: list[int] = f.get("tokenizer.ggml.token_type", None) or [NORMAL] * n
    if len(types) != n:
        raise GGUFError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens",
                        hint="the GGUF vocabulary is damaged; re-convert it")
    ids = {k: f.get_int(f"tokenizer.ggml.{k}_token_id", None)
           for k in ("bos", "eos", "unknown", "padding")}
    for key, value in ids.items():
        if value is not None and not 0 <= value < n:
            raise GGUFError(f"tokenizer.ggml.{key}_token_id = {value} is outside the "
                            f"{n}-token vocabulary", hint="the GGUF metadata is inconsistent")
    pre = f.get("tokenizer.ggml.pre", "default") if model == "gpt2" else None
    default_bos = model == "llama" or (pre in PRE_TOKENIZERS and PRE_TOKENIZERS[pre].add_bos)
    add_bos = bool(f.get("tokenizer.ggml.add_bos_token", default_bos))
    add_eos = bool(f.get("tokenizer.ggml.add_eos_token", False))
    vocab = _vocab(tokens)

    if model == "gpt2":
        tok, post, kind = _byte_level_bpe(f, pre, vocab)
    else:
        tok, post, kind = _sentencepiece_bpe(f, tokens, vocab, ids["unknown"])

    added = [(i, t, types[i]) for i, t in enumerate(tokens)
             if types[i] in (CONTROL, UNKNOWN, USER_DEFINED) and vocab[t] == i]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for _, t, ty in added if ty != USER_DEFINED])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for _, t, ty in added if ty == USER_DEFINED])
    wrong = [f"{t!r} (GGUF id {i}, got {tok.token_to_id(t)})" for i, t, _ in added
             if tok.token_to_id(t) != i]
    if wrong:
        raise GGUFError("added tokens did not keep their GGUF ids: " + "; ".join(wrong[:5]),
                        hint="this is a bug in ArkInfer's GGUF import; please report it")
    template = _template(tokens, ids["bos"], ids["eos"], add_bos, add_eos)
    tok.post_processor = processors.Sequence(post + [template]) if post else template

    def name(key: str) -> str | None:
        return tokens[ids[key]] if ids[key] is not None else None

    config: dict[str, Any] = {
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": ty != USER_DEFINED}
            for i, t, ty in added},
        "bos_token": name("bos"),
        "eos_token": name("eos"),
        "pad_token": name("padding"),
        "unk_token": name("unknown"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length or 2**30,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    template_text = chat_templates(f)
    if template_text is not None:
        config["chat_template"] = template_text
    return TokenizerFiles(tok, config, kind, model)


def chat_templates(f: GGUFFile) -> str | list[dict[str, str]] | None:
    """`tokenizer.chat_template`, or HF's named-template list when named ones exist too."""
    default = f.get("tokenizer.chat_template", None)
    prefix = "tokenizer.chat_template."
    named = [{"name": k[len(prefix):], "template": f.get(k)} for k in f.keys()  # noqa: SIM118 - GGUFFile is not a mapping
             if k.startswith(prefix)]
    if not named:
        return default
    if default is not None:
        named.insert(0, {"name": "default", "template": default})
    return named


def generation_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """generation_config.json from the ids in config.json."""
    out = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
           if cfg.get(k) is not None}
    return out
