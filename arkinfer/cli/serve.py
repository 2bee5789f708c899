"""`arkinfer serve` — an OpenAI-compatible HTTP server over an artifact's own runtime."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from arkinfer.cli._errors import handle_errors
from arkinfer.cli._options import DenseOpt, DraftKOpt, DraftOpt
from arkinfer.cli._output import err_console, terminal_safe

HELP = ("Serve a built artifact (or a model folder, a .gguf file or 'demo' on the reference "
        "model) over HTTP with OpenAI's API: POST /v1/chat/completions (through the chat "
        "template) and /v1/completions (plain text), both with `stream: true` as server-sent "
        "events, GET /v1/models and /health. On a gguf artifact up to --parallel requests "
        "(default 4) run at once, a llama.cpp sequence each; other runtimes run them one after "
        "another (one KV cache). Each request gets the tokens it would get alone; beyond "
        "--max-queue waiting requests the server answers 429. A prompt plus max_tokens over the "
        "context, or max_tokens over --max-tokens-limit, is a 400. With --draft every request is "
        "generated speculatively, one at a time (greedy: the same tokens as without). See "
        "docs/serving.md.")
EXAMPLES = [
    "arkinfer serve dist/demo.host.q4_0",
    "arkinfer serve dist/demo.host.q4_0 --port 8081 --max-tokens-limit 512 --max-queue 4",
    "arkinfer serve dist/demo.host.q4_0 --parallel 8",
    "arkinfer serve demo --host 0.0.0.0",
    "arkinfer serve dist/demo.host.q4_0 --draft lookup --draft-k 4",
    "arkinfer serve dist/demo.host.q4_0 --draft self:2",
]


@handle_errors
def command(
    model: Annotated[str, typer.Argument(help="A built artifact folder (with arkinfer.json), a "
                                         "Hugging Face model folder, a .gguf file or 'demo'.")],
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface; "
                                      "the server has no authentication).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0: any free one).")] = 8080,
    max_tokens_limit: Annotated[int, typer.Option(
        "--max-tokens-limit", min=1, help="The most tokens one request may ask for; also the "
        "default when it asks for none (cut to the context left).")] = 2048,
    max_queue: Annotated[int, typer.Option(
        "--max-queue", min=0, help="Requests that may wait behind the running ones; one more "
        "gets 429.")] = 16,
    parallel: Annotated[int | None, typer.Option(
        "--parallel", min=1, help="Requests generated at once. gguf artifacts: default 4, a "
        "KV cache of the context's size per request (--parallel 8 holds 8 x the context); "
        "1 runs them one after another. Other runtimes and --draft queue requests one at a "
        "time: --parallel above 1 is refused there.")] = None,
    dense: DenseOpt = False,
    draft: DraftOpt = None,
    draft_k: DraftKOpt = 4,
) -> None:
    from arkinfer.chat.app import serve_app
    from arkinfer.chat.server import ServerLimits

    app = serve_app(model, ServerLimits(max_tokens=max_tokens_limit, max_queue=max_queue),
                    dense=dense, draft=draft, draft_k=draft_k, parallel=parallel)
    import uvicorn

    chat = app.state.chat.model
    err_console.print(f"[dim]{escape(terminal_safe(chat.runtime))} runtime · "
                      f"{escape(terminal_safe(chat.name))} · context {chat.context} tokens · "
                      + (f"draft {escape(terminal_safe(chat.draft.name))}, k={chat.draft_k} · "
                         if chat.draft is not None else "") +
                      f"{app.state.chat.parallel} at once · " +
                      f"serving on http://{escape(terminal_safe(host))}:{port}/v1[/]",
                      markup=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
