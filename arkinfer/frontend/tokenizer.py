"""Tokenizer and chat template of a checkpoint folder.

`tokenizer.json` is read with the `tokenizers` library; the chat template from
`tokenizer_config.json` (or `chat_template.jinja`) is rendered with jinja2 in a sandbox, the way
transformers' `apply_chat_template` does, so prompts are byte-identical to the reference stack.

A tokenizer.json is a regular file of at most `TOKENIZER_MAX_BYTES`, read before it is parsed,
with at most `MAX_ADDED_TOKENS` added tokens, and every id it can produce below the model's
`vocab_size`. Text a user typed can be encoded with special tokens as plain text
(`parse_special=False`, `encode_chat(..., special_in_content=False)`): a typed `<|im_end|>` is
then the characters, not the token that ends a turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arkinfer.errors import TokenizerError
from arkinfer.paths import JSON_MAX_BYTES, read_json_object, read_limited

Message = dict[str, str]

#: Largest tokenizer.json read: the largest published ones (Gemma 3, 262 K tokens) are ~33 MB;
#: tokenizers needs about 5 bytes of memory per byte of JSON.
TOKENIZER_MAX_BYTES = 64 << 20
#: Most added tokens: a 256 K vocabulary of added tokens, far above any published tokenizer.
MAX_ADDED_TOKENS = 1 << 18


def _token_text(value: Any, key: str, source: Path) -> str | None:
    """tokenizer_config stores special tokens as a string or as {"content": ...}."""
    text = value.get("content") if isinstance(value, dict) else value
    if text is not None and not isinstance(text, str):
        raise TokenizerError(f"{source}: '{key}' must be a string or {{\"content\": string}}, "
                             f"got {str(value)[:80]}", hint="fix or re-download the file")
    return text


def _chat_template(cfg: dict[str, Any], folder: Path) -> str | None:
    """The chat template: tokenizer_config's `chat_template` (a string, or HF's list of
    {"name", "template"} from which "default" is used), else chat_template.jinja."""
    source = folder / "tokenizer_config.json"
    template = cfg.get("chat_template")
    if isinstance(template, list):  # HF allows named templates; use "default"
        if not all(isinstance(t, dict) and isinstance(t.get("template"), str) for t in template):
            raise TokenizerError(f"{source}: 'chat_template' as a list must hold "
                                 "{\"name\": ..., \"template\": string} objects",
                                 hint="fix or re-download the file")
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    elif template is not None and not isinstance(template, str):
        raise TokenizerError(f"{source}: 'chat_template' must be a string, got "
                             f"{type(template).__name__}", hint="fix or re-download the file")
    jinja_file = folder / "chat_template.jinja"
    if template is None and (jinja_file.exists() or jinja_file.is_symlink()):
        raw = read_limited(jinja_file, "chat template", JSON_MAX_BYTES, TokenizerError)
        try:
            template = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TokenizerError(f"cannot read {jinja_file}: {exc}",
                                 hint="the chat template must be UTF-8 text; fix or re-download "
                                 "the file") from None
    return template


@dataclass
class TextTokenizer:
    """Encode/decode text and render chats. Ids are plain Python ints."""

    tokenizer: Any  # tokenizers.Tokenizer
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    stop_ids: set[int] = field(default_factory=set)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def special_tokens(self) -> list[str]:
        """The text of every special added token (`<|im_start|>`, `</s>`, ...)."""
        return [t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special]

    def encode(self, text: str, add_special_tokens: bool = True,
               parse_special: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` adds BOS when the tokenizer is set up to.
        `parse_special=False` encodes the text of special tokens in `text` as plain text.
        Text `tokenizers` cannot encode (undecodable bytes, a character outside a Unigram
        vocabulary without `unk_id`) raises TokenizerError."""
        require_unicode(text)
        tok = self.tokenizer
        saved, tok.encode_special_tokens = tok.encode_special_tokens, not parse_special
        try:
            return tok.encode(text, add_special_tokens=add_special_tokens).ids
        except Exception as exc:  # noqa: BLE001 - tokenizers raises a plain Exception
            hint = ("tokenizer.json's model has no `unk_id`, so a character outside its "
                    "vocabulary cannot be encoded (transformers fails the same way): remove "
                    "that character from the text" if "unk_id" in str(exc) else
                    "check the text and the tokenizer.json")
            raise TokenizerError(f"the tokenizer cannot encode the text: {exc}",
                                 hint=hint) from None
        finally:
            tok.encode_special_tokens = saved

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[Message], add_generation_prompt: bool = True,
                    enable_thinking: bool | None = None) -> str:
        """The prompt text for `messages` (list of {"role", "content"}).

        `enable_thinking=False` selects MiniCPM4.1's fast (non-reasoning) mode; `None` leaves the
        template's default. Raises TokenizerError when there is no template or it fails.
        """
        if not self.chat_template:
            raise TokenizerError("this model has no chat template",
                                 hint="pass --raw to send the prompt as plain text")
        from arkinfer.frontend.chat_sandbox import BoundedEnvironment

        extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        try:
            return BoundedEnvironment().render(
                self.chat_template, messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "", eos_token=self.eos_token or "", **extra)
        except TokenizerError:  # a rendering limit, or raise_exception() from the template
            raise
        except Exception as exc:  # noqa: BLE001 - jinja2 errors, RecursionError, MemoryError
            raise TokenizerError(f"the chat template failed to render: "
                                 f"{type(exc).__name__}: {str(exc)[:500]}",
                                 hint="check tokenizer_config.json's chat_template") from None

    def encode_chat(self, messages: list[Message], add_generation_prompt: bool = True,
                    enable_thinking: bool | None = None,
                    special_in_content: bool = True) -> list[int]:
        """Render then encode without adding BOS again (the template owns special tokens).

        `special_in_content=False`: the template's own special tokens stay special, while those
        typed in a message's content are plain text (see `_content_spans`)."""
        text = self.render_chat(messages, add_generation_prompt, enable_thinking)
        specials = self.special_tokens()
        if special_in_content or not any(
                sp in m.get("content", "") for m in messages for sp in specials):
            return self.encode(text, add_special_tokens=False)
        ids: list[int] = []
        for piece, is_content in self._content_spans(text, messages, add_generation_prompt,
                                                    enable_thinking):
            ids += self.encode(piece, add_special_tokens=False, parse_special=not is_content)
        return ids

    def _content_spans(self, text: str, messages: list[Message], add_generation_prompt: bool,
                       enable_thinking: bool | None) -> list[tuple[str, bool]]:
        """`text` (the rendered chat) cut into (piece, is message content): the template is
        rendered again with a marker in place of each content, and the contents put back between
        the pieces must give `text` again; a template that changes or repeats a content cannot
        be cut, and TokenizerError says so."""
        markers = [f"\ue000ARKINFER-CONTENT-{i}\ue001" for i in range(len(messages))]
        marked = self.render_chat([{**m, "content": mk} for m, mk in zip(messages, markers)],
                                  add_generation_prompt, enable_thinking)
        spans: list[tuple[str, bool]] = []
        rest = marked
        for message, marker in zip(messages, markers):
            before, found, rest = rest.partition(marker)
            if not found or marker in rest:
                spans = []
                break
            spans += [(before, False), (message["content"], True)]
        spans.append((rest, False))
        if "".join(piece for piece, _ in spans) != text:
            raise TokenizerError(
                "the prompt holds the text of a special token (e.g. <|im_end|>) and this chat "
                "template changes or repeats message text, so it cannot be kept as plain text",
                hint="remove the special-token text from the prompt, or pass --raw-special to "
                "let it act as the special token")
        return [(piece, is_content) for piece, is_content in spans if piece]


def require_unicode(text: str, what: str = "the text") -> None:
    """Raise TokenizerError when `text` holds lone surrogates: bytes that were not UTF-8 where it
    came from (a command-line argument such as `-p $'\\xff'`, a file name), which no tokenizer
    can encode; `what` names the text in the message."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start:exc.end].encode("utf-8", "surrogateescape") \
            if all(0xDC80 <= ord(c) <= 0xDCFF for c in text[exc.start:exc.end]) else None
        shown = bad.hex(" ") if bad else f"U+{ord(text[exc.start]):04X}"
        raise TokenizerError(f"{what} is not valid UTF-8 text: it holds {shown} at character "
                             f"{exc.start}", hint="give UTF-8 text (convert it with `iconv -t "
                             "UTF-8`; binary data is not a prompt)") from None


def load_tokenizer(folder: Path, generation_config: dict[str, Any] | None = None,
                   vocab_size: int | None = None) -> TextTokenizer | None:
    """The folder's tokenizer, or None when it has no tokenizer.json.

    tokenizer.json is read whole with `read_limited` (a regular file of at most
    TOKENIZER_MAX_BYTES) before `tokenizers` parses it; with `vocab_size` (the model's), every
    token id it holds must be below it (`check_token_ids`)."""
    path = folder / "tokenizer.json"
    if not path.exists() and not path.is_symlink():
        return None
    data = read_limited(path, "tokenizer.json", TOKENIZER_MAX_BYTES, TokenizerError)
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # tokenizers raises a plain Exception on bad files
        raise TokenizerError(f"cannot load {path}: {str(exc)[:500]}",
                             hint="re-export tokenizer.json with a recent `tokenizers`") from None
    del data
    cfg_path = folder / "tokenizer_config.json"
    cfg = (read_json_object(cfg_path, TokenizerError)
           if cfg_path.exists() or cfg_path.is_symlink() else {})
    template = _chat_template(cfg, folder)
    bos = _token_text(cfg.get("bos_token"), "bos_token", cfg_path)
    eos = _token_text(cfg.get("eos_token"), "eos_token", cfg_path)
    stop: set[int] = set()
    gen_eos = (generation_config or {}).get("eos_token_id")
    for value in gen_eos if isinstance(gen_eos, list) else [gen_eos]:
        if isinstance(value, int):
            stop.add(value)
    for token in (eos, "<|im_end|>"):
        tid = tok.token_to_id(token) if token else None
        if tid is not None:
            stop.add(tid)
    check_token_ids(tok, vocab_size, path)
    return TextTokenizer(tok, template, bos, eos, stop)


def check_token_ids(tok: Any, vocab_size: int | None, path: Path) -> None:
    """Raise TokenizerError when `tok` (a tokenizers.Tokenizer) has more than MAX_ADDED_TOKENS
    added tokens, or, given the model's `vocab_size`, an id (vocabulary or added token) at or
    above it: the embedding has no row for it, so `run` or `eval` would fail with IndexError."""
    added = tok.get_added_tokens_decoder()
    if len(added) > MAX_ADDED_TOKENS:
        raise TokenizerError(f"{path} has {len(added):,} added tokens; the limit is "
                             f"{MAX_ADDED_TOKENS:,}", hint="check that this is the model's own "
                             "tokenizer.json; re-download it")
    if vocab_size is None:
        return
    bad = [(tid, t.content) for tid, t in added.items() if tid >= vocab_size]
    vocab = tok.get_vocab(with_added_tokens=False)
    bad += [(tid, text) for text, tid in vocab.items() if tid >= vocab_size] \
        if vocab and max(vocab.values()) >= vocab_size else []
    if bad:
        tid, text = max(bad)
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise TokenizerError(f"{path}: token {text[:80]!r} has id {tid}, beyond the model's "
                             f"vocabulary (vocab_size={vocab_size} in config.json, ids "
                             f"0..{vocab_size - 1}){more}",
                             hint="the tokenizer and the model come from different checkpoints; "
                             "use the tokenizer.json published with the model")
