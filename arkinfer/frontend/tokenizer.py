"""Tokenizer and chat template of a checkpoint folder.

`tokenizer.json` is read with the `tokenizers` library; the chat template from
`tokenizer_config.json` (or `chat_template.jinja`) is rendered with jinja2 in a sandbox, the way
transformers' `apply_chat_template` does, so prompts are byte-identical to the reference stack.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from arkinfer.errors import TokenizerError

Message = dict[str, str]


def _token_text(value: Any) -> str | None:
    """tokenizer_config stores special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value


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
        env = _sandbox()
        try:
            template = env.from_string(self.chat_template)
            extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                                   **extra)
        except Exception as exc:  # jinja2 errors and raise_exception() from the template
            raise TokenizerError(f"the chat template failed to render: {exc}",
                                 hint="check tokenizer_config.json's chat_template") from None

    def encode_chat(self, messages: list[Message], add_generation_prompt: bool = True,
                    enable_thinking: bool | None = None) -> list[int]:
        """Render then encode without adding BOS again (the template owns special tokens)."""
        text = self.render_chat(messages, add_generation_prompt, enable_thinking)
        return self.encode(text, add_special_tokens=False)


def _sandbox():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TokenizerError(f"chat template error: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False,
                                                                   indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{path} is not valid JSON: {exc}",
                             hint="fix or re-download the file") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


def load_tokenizer(folder: Path, generation_config: dict[str, Any] | None = None
                   ) -> TextTokenizer | None:
    """The folder's tokenizer, or None when it has no tokenizer.json."""
    path = folder / "tokenizer.json"
    if not path.exists():
        return None
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a plain Exception on bad files
        raise TokenizerError(f"cannot load {path}: {exc}",
                             hint="re-export tokenizer.json with a recent `tokenizers`") from None
    cfg = _read_json(folder / "tokenizer_config.json")
    template = cfg.get("chat_template")
    if isinstance(template, list):  # HF allows named templates; use "default"
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    jinja_file = folder / "chat_template.jinja"
    if template is None and jinja_file.exists():
        template = jinja_file.read_text(encoding="utf-8")
    bos, eos = _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))
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
