"""`arkinfer serve`'s app driven with the official `openai` client over HTTP: streamed and whole
chat completions, text completions, /v1/models, /health; 8 concurrent requests get the tokens
each gets alone; refusals are 4xx in OpenAI's error shape and the server keeps serving."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from chat_support import BUILDS, QUESTION, alone, assert_refused_when_full

from arkinfer.chat.app import serve_app
from arkinfer.chat.server import ServerLimits

pytestmark = pytest.mark.usefixtures("one_thread")
LIMITS = ServerLimits(max_tokens=256, max_queue=16)


@pytest.fixture(scope="module")
def gguf_server(demo_artifact, serve):
    return serve(serve_app(str(demo_artifact("gguf")), LIMITS))


def post(url: str, body: bytes | dict) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


@pytest.mark.llamacpp
def test_health_and_models(gguf_server):
    assert get(f"{gguf_server.url}/health")["status"] == "ok"
    models = gguf_server.client().models.list()
    assert [m.id for m in models.data] == [gguf_server.app.state.chat.model.name]


@pytest.mark.llamacpp
def test_chat_completion_whole_and_streamed(gguf_server):
    client, want = gguf_server.client(), alone(gguf_server)
    whole = client.chat.completions.create(model="demo", messages=QUESTION, max_tokens=64,
                                           temperature=0)
    assert whole.choices[0].message.content == want and "flour" in want
    assert whole.choices[0].finish_reason == "stop"
    assert whole.usage.prompt_tokens == len(gguf_server.app.state.chat.model.encode_chat(QUESTION))
    chunks = list(client.chat.completions.create(model="demo", messages=QUESTION, max_tokens=64,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.llamacpp
def test_text_completion_whole_and_streamed(gguf_server):
    client = gguf_server.client()
    whole = client.completions.create(model="demo", prompt="The kettle", max_tokens=12,
                                      temperature=0)
    assert whole.choices[0].finish_reason in ("length", "stop") and whole.choices[0].text
    streamed = client.completions.create(model="demo", prompt="The kettle", max_tokens=12,
                                         temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text


@pytest.mark.llamacpp
def test_eight_concurrent_requests_get_the_tokens_each_gets_alone(gguf_server):
    questions = [[{"role": "user", "content": q}] for q in (
        "What is bread made from?", "Why is the sky blue?", "What is bread made from?",
        "Name a colour.", "What does a kettle do?", "Why is the sky blue?", "Hello!",
        "What is rain?")]
    want = [alone(gguf_server, q, 48) for q in questions]
    client = gguf_server.client(timeout=120)

    def ask(i: int) -> str:
        if i % 2:  # half of them streamed
            chunks = client.chat.completions.create(model="demo", messages=questions[i],
                                                    max_tokens=48, temperature=0, stream=True)
            return "".join(c.choices[0].delta.content or "" for c in chunks)
        reply = client.chat.completions.create(model="demo", messages=questions[i],
                                               max_tokens=48, temperature=0)
        return reply.choices[0].message.content

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ask, range(8)))
    assert got == want


@pytest.mark.llamacpp
@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "not valid JSON"),
    ({"model": "demo"}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": QUESTION, "max_tokens": 257}, 400, "above this server's limit of 256"),
    ({"messages": QUESTION, "temperature": -1}, 400, "temperature"),
    ({"messages": QUESTION, "n": 2}, 400, "one choice"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "text only"),
])
def test_malformed_requests_get_a_4xx_and_the_server_keeps_serving(gguf_server, body, status,
                                                                    words):
    code, answer = post(f"{gguf_server.url}/v1/chat/completions", body)
    assert code == status, answer
    assert set(answer["error"]) == {"message", "type", "param", "code"}
    assert words in answer["error"]["message"], answer
    assert get(f"{gguf_server.url}/health")["status"] == "ok"
    assert gguf_server.client().chat.completions.create(
        model="demo", messages=QUESTION, max_tokens=4, temperature=0).choices[0].message.content


@pytest.mark.llamacpp
def test_an_over_long_prompt_is_refused_before_generation(gguf_server):
    import openai

    client, context = gguf_server.client(), gguf_server.app.state.chat.model.context
    long = [{"role": "user", "content": "bread " * context}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="demo", messages=long, max_tokens=8)
    assert info.value.body["code"] == "context_length_exceeded"
    assert f"the context of {context} tokens" in info.value.body["message"]
    code, answer = post(f"{gguf_server.url}/v1/completions",
                        {"prompt": "bread", "max_tokens": 200, "stop": ["."]})
    assert code == 400 and answer["error"]["param"] == "stop"
    assert client.completions.create(model="demo", prompt="The kettle", max_tokens=4).choices


@pytest.mark.llamacpp
def test_too_many_requests_get_429_and_the_waiting_one_completes(demo_artifact, serve):
    server = serve(serve_app(str(demo_artifact("gguf")), ServerLimits(max_tokens=64, max_queue=1),
                             parallel=1))  # the queue; test_chat_parallel.py: the scheduler's 429
    queue, release = server.app.state.chat.queue, threading.Event()
    client = server.client(timeout=120)
    queue.submit(release.wait)  # the runner is busy
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.chat.completions.create, model="demo", messages=QUESTION,
                              max_tokens=8, temperature=0)
        assert_refused_when_full(server, lambda: queue.admitted, 2)  # 1 runs, 1 waits
        release.set()
        assert waiting.result().choices[0].message.content
    assert client.chat.completions.create(model="demo", messages=QUESTION,
                                          max_tokens=4).choices[0].message.content


@pytest.mark.parametrize("backend", [b for b in BUILDS if b != "gguf"])
def test_every_runtime_streams_a_chat_completion(demo_artifact, serve, backend):
    server = serve(serve_app(str(demo_artifact(backend)), LIMITS))
    chunks = server.client().chat.completions.create(model="demo", messages=QUESTION,
                                                     max_tokens=64, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == alone(server)
