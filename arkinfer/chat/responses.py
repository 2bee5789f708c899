"""The response objects of OpenAI's chat and text completion APIs, whole and as stream chunks.

    chat.completion        {"id", "object", "created", "model", "choices": [{"index": 0,
                            "message": {"role": "assistant", "content"}, "finish_reason"}], "usage"}
    chat.completion.chunk  ... "choices": [{"index": 0, "delta": {...}, "finish_reason"}]
    text_completion        ... "choices": [{"index": 0, "text", "finish_reason", "logprobs": null}]

A stream is server-sent events, `data: {chunk}\\n\\n` each, closed by `data: [DONE]\\n\\n`.
finish_reason is "stop" (a stop token) or "length" (max_tokens reached).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["chat", "text"]
DONE = "data: [DONE]\n\n"


def sse(data: dict[str, Any]) -> str:
    """One server-sent event carrying `data` as JSON."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


@dataclass
class Completion:
    """One request's answer as it is built: `kind` picks the chat or text object."""

    kind: Kind
    model: str
    prompt_tokens: int
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def _head(self, obj: str) -> dict[str, Any]:
        prefix = "chatcmpl-" if self.kind == "chat" else "cmpl-"
        return {"id": prefix + self.id, "object": obj, "created": self.created,
                "model": self.model}

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": self.prompt_tokens + completion_tokens}

    def whole(self, text: str, finish_reason: str, completion_tokens: int) -> dict[str, Any]:
        """The non-streamed response."""
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "finish_reason": finish_reason}
            head = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
            head = self._head("text_completion")
        return {**head, "choices": [choice], "usage": self.usage(completion_tokens)}

    def chunk(self, text: str | None, finish_reason: str | None = None,
              role: bool = False) -> dict[str, Any]:
        """One stream chunk: new text (None: none), the finish reason on the last one, the
        assistant role on a chat stream's first one."""
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "finish_reason": finish_reason,
                  "logprobs": None}
        return {**self._head("text_completion"), "choices": [choice]}
