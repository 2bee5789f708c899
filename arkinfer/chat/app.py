"""The FastAPI application: routes and error handlers over a `ChatServer` (server.py).

    app = serve_app("dist/demo.host.q4_0", ServerLimits())   # then uvicorn.run(app, ...)
    app = serve_app("dist/demo.host.q4_0", draft="lookup", draft_k=4)   # speculative
    app = serve_app("dist/demo.host.q4_0", parallel=8)   # 8 requests at once (gguf; default 4)
    app = create_app(model, ServerLimits())       # a ChatModel opened already

`serve_app` opens the model, and its draft, on the runner queue's worker thread, the thread every
generation then runs on (MLX's runner works only on the thread that loaded it), unless the
runtime runs several requests at once: then a `ParallelScheduler` thread owns a llama.cpp context
of `parallel` sequences (parallel_scheduler.py).

Every error, FastAPI's own included (a body that is not JSON, a missing field, an unknown path),
is answered in OpenAI's error shape; an unexpected one is a 500 and the server keeps serving.
"""

from __future__ import annotations

import contextlib
from typing import Any

from arkinfer.errors import NotAvailableError

from .model import ChatModel, open_chat_model
from .parallel_scheduler import (
    ParallelScheduler,
    check_parallel_with_draft,
    resolve_parallel,
)
from .protocol import ChatCompletionRequest, CompletionRequest, error_body
from .responses import Kind
from .runner_queue import RunnerQueue
from .server import ChatServer, ServerLimits, error_status, settings_for


def _fastapi():
    """The fastapi module; NotAvailableError with the install command without FastAPI or
    uvicorn (the `[serve]` extra)."""
    try:
        import fastapi
        import uvicorn  # noqa: F401 - checked here, run by the caller
    except ImportError:
        raise NotAvailableError("the server needs FastAPI and uvicorn, which are not installed",
                                hint="pip install 'arkinfer[serve]'") from None
    return fastapi


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """(message, param) of FastAPI's validation errors: the first one's field and reason."""
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    reason = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {reason}", None
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return (f"{param}: {reason}" if param else reason) + more, param


def serve_app(target: str, limits: ServerLimits | None = None, *, dense: bool = False,
              draft: str | None = None, draft_k: int = 4, parallel: int | None = None):
    """The FastAPI app serving the artifact, model folder, .gguf file or "demo" `target`, opened
    on the runner queue's worker thread (see runner_queue.py); with `draft` ("lookup", "self:N"
    or a draft artifact's folder) every request is generated speculatively, `draft_k` draft
    tokens per verify step (a runner that cannot speculate is refused here). `parallel`:
    requests generated at once (default 4 on a gguf artifact without a draft, else 1; > 1 where
    the runtime queues, or with a draft, is refused here)."""
    _fastapi()  # before loading a model for minutes
    check_parallel_with_draft(parallel, draft)
    limits = limits or ServerLimits()
    queue = RunnerQueue(limits.max_queue)
    try:
        model = queue.call(lambda: open_chat_model(target, dense=dense, draft=draft,
                                                   draft_k=draft_k))
        scheduler = open_scheduler(model, resolve_parallel(model, parallel), limits.max_queue)
    except BaseException:
        queue.close()
        raise
    return create_app(model, limits, queue, scheduler)


def open_scheduler(model: ChatModel, parallel: int, max_waiting: int) -> ParallelScheduler | None:
    """A scheduler running `parallel` requests at once on `model`'s gguf runner (a llama.cpp
    context of `parallel` KV streams of `model.context` cells each); None for parallel = 1."""
    if parallel == 1:
        return None
    return ParallelScheduler(model, model.runner.parallel_sequences(parallel, model.context),
                             max_waiting)


def create_app(model: ChatModel, limits: ServerLimits | None = None,
               queue: RunnerQueue | None = None, scheduler: ParallelScheduler | None = None):
    """The FastAPI app serving `model` under `limits` (default ServerLimits()); generation runs
    on `scheduler` when given (several requests at once, see `open_scheduler`), else on
    `queue`'s worker thread (default: a new queue; give the one `model` was loaded on when its
    runtime is bound to a thread)."""
    fastapi = _fastapi()
    from fastapi.concurrency import run_in_threadpool
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException

    limits = limits or ServerLimits()
    server = ChatServer(model, limits, queue or RunnerQueue(limits.max_queue), scheduler)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        server.close()

    app = fastapi.FastAPI(title=f"ArkInfer: {model.name}", lifespan=lifespan)
    app.state.chat = server

    def error_response(exc: Exception) -> JSONResponse:
        status, body = error_status(exc)
        headers = {"Retry-After": "1"} if status == 429 else None
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(list(exc.errors()))
        return JSONResponse(error_body(message, param=param), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(_request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(exc.detail), code=str(exc.status_code)),
                            status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def failed(_request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    async def answer(kind: Kind, ids: list[int], body, requested: int | None):
        settings = settings_for(model, server.limits, body, requested, len(ids))
        result = await server.complete(kind, ids, settings, body.stream)
        if body.stream:
            return StreamingResponse(result, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return result

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest):
        try:
            body.check_supported()
            ids = await run_in_threadpool(server.chat_ids, body)
            return await answer("chat", ids, body, body.token_limit())
        except Exception as exc:  # noqa: BLE001 - every refusal in OpenAI's shape
            return error_response(exc)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        try:
            body.check_supported()
            ids = await run_in_threadpool(server.text_ids, body)
            return await answer("text", ids, body, body.max_tokens)
        except Exception as exc:  # noqa: BLE001 - every refusal in OpenAI's shape
            return error_response(exc)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": model.name, "object": "model", "created": server.started,
            "owned_by": "arkinfer", "runtime": model.runtime, "context_length": model.context}]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model.name, "runtime": model.runtime,
                "draft": None if model.draft is None else model.draft.name,
                "parallel": server.parallel, "requests_admitted": server.admitted,
                "max_batch": server.scheduler.max_batch if server.scheduler else 1}

    return app
