"""The request bodies the server takes (OpenAI's chat and text completion APIs) and its errors.

Fields ArkInfer does not use (`frequency_penalty`, `user`, `logprobs`=false, ...) are accepted
and ignored, as OpenAI-compatible servers do; fields that would change the output and are not
implemented (`n` > 1, `stop` strings) are refused with a 400 naming them. `seed` omitted: a
random seed per request (OpenAI's behaviour); temperature and top_p default to 1 as in OpenAI's
API.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from arkinfer.errors import ArkError

SEED_MAX = 2**64 - 1


class RequestError(ArkError):
    """A request the server refuses: `status` (4xx), the OpenAI error `param` and `code`."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.status, self.param, self.code = status, param, code


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class ContentPart(BaseModel):
    """One part of a message's content list; only {"type": "text", "text": ...} is read."""

    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[ContentPart] | None = None

    def text(self, index: int) -> str:
        """The content as one string (text parts joined); RequestError for other parts."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        bad = [p.type for p in self.content if p.type != "text" or p.text is None]
        if bad:
            raise RequestError(f"messages[{index}].content holds a {bad[0]!r} part; this model "
                               "reads text only", param=f"messages[{index}].content")
        return "".join(p.text or "" for p in self.content)


class SamplingRequest(BaseModel):
    """What both endpoints share: the model name (any; the server runs one model), token limit,
    sampling and streaming."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    stream: bool = False
    n: int = 1
    stop: str | list[str] | None = None

    def check_supported(self) -> None:
        """RequestError for options that would change the output and are not implemented."""
        if self.n != 1:
            raise RequestError(f"n={self.n}: this server returns one choice per request",
                               param="n", hint="send n=1 (or leave it out)")
        if self.stop:
            raise RequestError("`stop` strings are not supported; generation stops at the "
                               "model's own stop tokens or max_tokens", param="stop",
                               hint="leave `stop` out and cut the text on the client")


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    # {"enable_thinking": false}: MiniCPM4.1's fast mode (the key vLLM and SGLang read too)
    chat_template_kwargs: dict[str, Any] | None = None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def enable_thinking(self) -> bool | None:
        value = (self.chat_template_kwargs or {}).get("enable_thinking")
        if value is not None and not isinstance(value, bool):
            raise RequestError("chat_template_kwargs.enable_thinking must be true or false",
                               param="chat_template_kwargs")
        return value


class CompletionRequest(SamplingRequest):
    prompt: str | list[str]

    def text(self) -> str:
        """The one prompt; RequestError for a list of several (a batch)."""
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) != 1:
            raise RequestError(f"prompt holds {len(self.prompt)} prompts; this server takes one "
                               "per request", param="prompt",
                               hint="send one request per prompt")
        return self.prompt[0]

