"""`arkinfer serve --parallel` on a gguf artifact run by llama.cpp's InfLLM v2 build (its child
process, `SubprocessLlamaCppRunner.parallel_sequences`): concurrent requests, one of them past the
demo's dense_len (InfLLM v2 sparse attention in its own KV stream), each get the greedy tokens
they get alone. Skipped unless `arkinfer doctor --build-llamacpp` has built it."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from arkinfer.backends.gguf.llamacpp_runtime import infllmv2_built
from chat_support import alone

from arkinfer.chat.app import serve_app
from arkinfer.chat.server import ServerLimits

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.llamacpp]
if not infllmv2_built():
    pytest.skip("the InfLLM v2 build of llama.cpp is not built (arkinfer doctor --build-llamacpp)",
                allow_module_level=True)

PARALLEL = 3
LONG = "Flour, water, salt and yeast make bread. " * 110 + "What is bread made from?"
QUESTIONS = ["What is bread made from?", LONG, "Why is the sky blue?", "Name a colour."]


@pytest.fixture(scope="module")
def server(demo_artifact, serve):
    return serve(serve_app(str(demo_artifact("gguf")), ServerLimits(max_tokens=64, max_queue=8),
                           parallel=PARALLEL))


def test_concurrent_requests_on_the_infllmv2_build_get_their_tokens_alone(server):
    chat = server.app.state.chat
    assert type(chat.model.runner).__name__ == "SubprocessLlamaCppRunner"
    messages = [[{"role": "user", "content": q}] for q in QUESTIONS]
    assert len(chat.model.encode_chat(messages[1])) > 1024  # past the demo's dense_len
    want = [alone(server, m, 24) for m in messages]
    client = server.client(timeout=300)

    def ask(i: int) -> str:
        reply = client.chat.completions.create(model="demo", messages=messages[i], max_tokens=24,
                                               temperature=0)
        return reply.choices[0].message.content

    with ThreadPoolExecutor(len(messages)) as pool:
        got = list(pool.map(ask, range(len(messages))))
    assert got == want
    with urllib.request.urlopen(f"{server.url}/health", timeout=60) as response:
        health = json.loads(response.read())
    assert health["parallel"] == PARALLEL
    assert 1 < health["max_batch"] <= PARALLEL  # requests ran in the same decode steps
