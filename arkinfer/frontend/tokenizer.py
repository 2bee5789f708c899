"""Tokenizer and chat template of a checkpoint folder.

`tokenizer.json` is read with the `tokenizers` library; the chat template from
`tokenizer_config.json` (or `chat_template.jinja`) is rendered with jinja2 in a sandbox, the way
transformers' `apply_chat_template` does, so prompts are byte-identical to the reference stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arkinfer.errors import TokenizerError
from arkinfer.paths import read_json_object, require_regular_file

Message = dict[str, str]


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
        require_regular_file(jinja_file, "chat template", TokenizerError)
        try:
            template = jinja_file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError) as exc:
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

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` adds BOS when the tokenizer is set up to."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

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
                    enable_thinking: bool | None = None) -> list[int]:
        """Render then encode without adding BOS again (the template owns special tokens)."""
        text = self.render_chat(messages, add_generation_prompt, enable_thinking)
        return self.encode(text, add_special_tokens=False)


def load_tokenizer(folder: Path, generation_config: dict[str, Any] | None = None
                   ) -> TextTokenizer | None:
    """The folder's tokenizer, or None when it has no tokenizer.json."""
    path = folder / "tokenizer.json"
    if not path.exists() and not path.is_symlink():
        return None
    require_regular_file(path, "tokenizer.json", TokenizerError)
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a plain Exception on bad files
        raise TokenizerError(f"cannot load {path}: {exc}",
                             hint="re-export tokenizer.json with a recent `tokenizers`") from None
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
    return TextTokenizer(tok, template, bos, eos, stop)
