"""The OpenAI-compatible HTTP server over one `ChatModel` (FastAPI; run it with uvicorn).

    app = serve_app("dist/demo.host.q4_0", ServerLimits(max_tokens=512))   # app.py
    uvicorn.run(app, host="127.0.0.1", port=8080)

    POST /v1/chat/completions   messages through the chat template   (stream: server-sent events)
    POST /v1/completions        a plain-text prompt, no template     (stream: server-sent events)
    GET  /v1/models             the one model served
    GET  /health                {"status": "ok", ...}

Requests are checked before they reach the runner, each refusal a 4xx in OpenAI's error shape
({"error": {"message", "type", "param", "code"}}): a malformed body (400), max_tokens above the
server's limit (400), a prompt plus max_tokens over the context (400, code
"context_length_exceeded"), more than `max_queue` requests waiting (429). On a gguf artifact up to
`parallel` requests run at once, a llama.cpp sequence each (`ParallelScheduler`,
parallel_scheduler.py); elsewhere generation runs on the runner's one worker thread
(`RunnerQueue`), one request after another. Either way each request gets the tokens it would get
alone. A model opened with a draft (`serve --draft`) runs on the queue and
generates speculatively: greedy requests get exactly the tokens of plain decoding, sampled ones
tokens with its distribution (the rejection rule of arkinfer/speculative/rejection.py).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from arkinfer.errors import ArkError

from .context import ContextError, check_context
from .generation import GenerationSettings
from .model import ChatModel, model_tokens
from .parallel_scheduler import ParallelScheduler
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    RequestError,
    SamplingRequest,
    error_body,
)
from .responses import DONE, Completion, Kind, sse
from .runner_queue import QueueFullError, RunnerQueue
from .text_stream import TextStream
from .token_channel import TokenChannel


class GenerationFailed(Exception):
    """The runtime failed while generating (NaN logits, a runtime error): HTTP 500."""

    def __init__(self, cause: Exception) -> None:
        message = (cause.message if isinstance(cause, ArkError)
                   else f"{type(cause).__name__}: {cause}")
        super().__init__(f"generation failed: {message}")


@dataclass(frozen=True)
class ServerLimits:
    """max_tokens: the most tokens one request may ask for (also the default when it asks for
    none, cut to the context left); max_queue: requests that may wait behind the running ones."""

    max_tokens: int = 2048
    max_queue: int = 16

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ArkError(f"--max-tokens-limit {self.max_tokens} is below 1",
                           hint="give the most tokens one request may ask for, e.g. 2048")
        if self.max_queue < 0:
            raise ArkError(f"--max-queue {self.max_queue} is negative",
                           hint="give 0 (refuse a request while one runs) or more")


def settings_for(model: ChatModel, limits: ServerLimits, body: SamplingRequest,
                 requested: int | None, prompt_tokens: int) -> GenerationSettings:
    """The request's generation settings, after the token-limit and context checks."""
    if requested is not None and requested > limits.max_tokens:
        raise RequestError(f"max_tokens {requested} is above this server's limit of "
                           f"{limits.max_tokens}", param="max_tokens",
                           hint=f"ask for {limits.max_tokens} tokens or fewer")
    max_tokens = requested or max(1, min(limits.max_tokens, model.context - prompt_tokens))
    check_context(prompt_tokens, max_tokens, model.context, flag="max_tokens",
                  limit=f"the context of {{context}} tokens, set by {model.context_source}")
    settings = GenerationSettings(max_tokens, body.temperature, body.top_p,
                                  body.seed if body.seed is not None else secrets.randbits(63))
    settings.check()
    return settings


class ChatServer:
    """The endpoints' work: encode, check, queue, generate, answer. Generation runs on
    `scheduler` when given (several requests at once), else on `queue`'s worker thread."""

    def __init__(self, model: ChatModel, limits: ServerLimits, queue: RunnerQueue,
                 scheduler: ParallelScheduler | None = None) -> None:
        self.model, self.limits, self.queue, self.scheduler = model, limits, queue, scheduler
        self.started = int(time.time())

    @property
    def parallel(self) -> int:
        """Requests generated at once (1: one after another on the queue)."""
        return 1 if self.scheduler is None else self.scheduler.n_seq

    @property
    def admitted(self) -> int:
        """Requests running or waiting."""
        return (self.queue if self.scheduler is None else self.scheduler).admitted

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
        self.queue.close()

    def _start(self, ids: list[int], settings: GenerationSettings) -> TokenChannel:
        """Queue the generation (QueueFullError at once when the queue is full)."""
        channel = TokenChannel(asyncio.get_running_loop())
        if self.scheduler is not None:
            self.scheduler.submit(ids, settings, channel)
            return channel
        model = self.model

        def job() -> None:
            if channel.cancelled():  # the client left while the request waited
                channel.end()
                return
            try:
                for token in model_tokens(model, ids, settings, channel.cancelled):
                    channel.put(token)
                channel.end()
            except Exception as exc:  # noqa: BLE001 - handed to the request that waits
                channel.end(exc)

        self.queue.submit(job)
        return channel

    async def complete(self, kind: Kind, ids: list[int], settings: GenerationSettings,
                       stream: bool):
        """The response body: a dict, or an async iterator of server-sent events."""
        completion = Completion(kind, self.model.name, len(ids))
        channel = self._start(ids, settings)
        if stream:
            return self._events(completion, channel)
        text, count, finish = TextStream(self.model.tokenizer), 0, "length"
        try:
            async for token in channel:
                count += 1
                if token in self.model.stop_ids:
                    finish = "stop"
                else:
                    text.push(token)
        except Exception as exc:  # the runtime failed: the server's fault, not the request's
            raise GenerationFailed(exc) from exc
        finally:
            channel.cancel()
        text.flush()
        return completion.whole(text.text, finish, count)

    async def _events(self, completion: Completion, channel: TokenChannel) -> AsyncIterator[str]:
        text, finish = TextStream(self.model.tokenizer), "length"
        try:
            if completion.kind == "chat":
                yield sse(completion.chunk("", role=True))
            async for token in channel:
                if token in self.model.stop_ids:
                    finish = "stop"
                    continue
                if piece := text.push(token):
                    yield sse(completion.chunk(piece))
            if tail := text.flush():
                yield sse(completion.chunk(tail))
            yield sse(completion.chunk(None, finish))
        except Exception as exc:  # noqa: BLE001 - headers are sent: the error goes in the stream
            message = exc.message if isinstance(exc, ArkError) else f"{type(exc).__name__}: {exc}"
            yield sse(error_body(message, "server_error"))
        finally:
            channel.cancel()  # also when the client went away: the worker stops
        yield DONE

    def chat_ids(self, body: ChatCompletionRequest) -> list[int]:
        messages = [{"role": m.role, "content": m.text(i)} for i, m in enumerate(body.messages)]
        return self.model.encode_chat(messages, enable_thinking=body.enable_thinking())

    def text_ids(self, body: CompletionRequest) -> list[int]:
        return self.model.encode_text(body.text())


def error_status(exc: Exception) -> tuple[int, dict]:
    """(HTTP status, OpenAI error body) for an exception raised while handling a request."""
    if isinstance(exc, GenerationFailed):
        return 500, error_body(str(exc), "server_error")
    if isinstance(exc, RequestError):
        message = exc.message + (f"; {exc.hint}" if exc.hint else "")
        return exc.status, error_body(message, param=exc.param, code=exc.code)
    if isinstance(exc, QueueFullError):
        return 429, error_body(f"{exc.message}; {exc.hint}", "rate_limit_error",
                               code="queue_full")
    if isinstance(exc, ContextError):
        return 400, error_body(f"{exc.message}; {exc.hint}", param="max_tokens",
                               code="context_length_exceeded")
    if isinstance(exc, ArkError):  # the prompt cannot be encoded or rendered, bad sampling values
        message = exc.message + (f"; {exc.hint}" if exc.hint else "")
        return 400, error_body(message)
    return 500, error_body(f"{type(exc).__name__}: {exc}", "server_error")
