"""`arkinfer serve` on a gguf artifact with several requests at once (`--parallel`, one llama.cpp
sequence each, arkinfer/chat/parallel_scheduler.py): concurrent requests overlap in one decode
step and each gets the tokens it gets alone, greedy or seeded; beyond the slots and the queue a
request gets 429; runtimes that queue, and drafts, refuse --parallel above 1."""

from __future__ import annotations

import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from chat_support import QUESTION, alone, assert_refused_when_full

from arkinfer.backend import RunnerBase
from arkinfer.chat.app import serve_app
from arkinfer.chat.model import ChatModel
from arkinfer.chat.parallel_scheduler import DEFAULT_PARALLEL, resolve_parallel
from arkinfer.chat.server import ServerLimits
from arkinfer.errors import ArkError

pytestmark = pytest.mark.usefixtures("one_thread")
LIMITS = ServerLimits(max_tokens=256, max_queue=16)
QUESTIONS = ["What is bread made from?", "Why is the sky blue?", "What is bread made from?",
             "Name a colour.", "What does a kettle do?", "Why is the sky blue?", "Hello!",
             "What is rain?"]


@pytest.fixture(scope="module", autouse=True)
def upstream_llamacpp():
    """The demo's gguf in upstream llama.cpp, in this process (parallel sequences), even where
    the InfLLM v2 build exists: its subprocess runner queues requests (one sequence)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ARKINFER_LLAMACPP", "upstream")
        yield


@pytest.fixture(scope="module")
def parallel_server(demo_artifact, serve):
    return serve(serve_app(str(demo_artifact("gguf")), LIMITS))


def health(server) -> dict:
    with urllib.request.urlopen(f"{server.url}/health", timeout=60) as response:
        return json.loads(response.read())


@pytest.mark.llamacpp
def test_concurrent_requests_share_decode_steps_and_get_their_tokens_alone(parallel_server):
    before = health(parallel_server)
    assert before["parallel"] == DEFAULT_PARALLEL and before["max_batch"] == 0
    questions = [[{"role": "user", "content": q}] for q in QUESTIONS]
    lengths = [48, 40, 48, 24, 48, 32, 48, 16]  # slots free at different steps
    want = [alone(parallel_server, q, n) for q, n in zip(questions, lengths)]
    client = parallel_server.client(timeout=120)

    def ask(i: int) -> str:
        if i % 2:  # half of them streamed
            chunks = client.chat.completions.create(model="demo", messages=questions[i],
                                                    max_tokens=lengths[i], temperature=0,
                                                    stream=True)
            return "".join(c.choices[0].delta.content or "" for c in chunks)
        reply = client.chat.completions.create(model="demo", messages=questions[i],
                                               max_tokens=lengths[i], temperature=0)
        return reply.choices[0].message.content

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ask, range(8)))
    assert got == want
    after = health(parallel_server)
    assert 1 < after["max_batch"] <= DEFAULT_PARALLEL  # requests ran in the same decode steps
    assert after["requests_admitted"] == 0


@pytest.mark.llamacpp
def test_a_prompt_longer_than_a_batch_is_prefilled_in_chunks(parallel_server):
    long = [{"role": "user", "content": "Bread, flour and water. " * 120 + "What is bread?"}]
    model = parallel_server.app.state.chat.model
    assert len(model.encode_chat(long)) > parallel_server.app.state.chat.scheduler.sequences.n_batch
    want = [alone(parallel_server, long, 16), alone(parallel_server, QUESTION, 32)]
    client = parallel_server.client(timeout=120)
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda mn: client.chat.completions.create(
            model="demo", messages=mn[0], max_tokens=mn[1], temperature=0
        ).choices[0].message.content, [(long, 16), (QUESTION, 32)]))
    assert got == want


@pytest.mark.llamacpp
def test_a_seeded_sampled_request_gets_the_same_text_beside_others(parallel_server):
    client = parallel_server.client(timeout=120)

    def sampled() -> str:
        return client.chat.completions.create(
            model="demo", messages=QUESTION, max_tokens=32, temperature=0.9, top_p=0.95,
            seed=7).choices[0].message.content

    def other(i: int) -> str:
        return client.completions.create(model="demo", prompt=f"The kettle {i}", max_tokens=32,
                                         temperature=1.0, seed=i).choices[0].text

    alone_text = sampled()
    with ThreadPoolExecutor(4) as pool:
        others = [pool.submit(other, i) for i in range(3)]
        beside = pool.submit(sampled)
        assert beside.result() == alone_text  # its own generator, whatever runs beside it
        assert all(f.result() is not None for f in others)


@pytest.mark.llamacpp
def test_requests_beyond_the_slots_and_the_queue_get_429(demo_artifact, serve):
    server = serve(serve_app(str(demo_artifact("gguf")), ServerLimits(max_tokens=64, max_queue=1),
                             parallel=2))
    scheduler, release = server.app.state.chat.scheduler, threading.Event()
    step = scheduler.sequences.step

    def held(*args, **kwargs):  # the context is busy until release
        release.wait()
        return step(*args, **kwargs)

    scheduler.sequences.step = held
    client = server.client(timeout=120)
    with ThreadPoolExecutor(3) as pool:
        admitted = [pool.submit(client.chat.completions.create, model="demo", messages=QUESTION,
                                max_tokens=8, temperature=0) for _ in range(3)]
        assert_refused_when_full(server, lambda: scheduler.admitted, 3)  # 2 run, 1 waits
        release.set()
        texts = {f.result().choices[0].message.content for f in admitted}
    assert len(texts) == 1 and texts.pop()
    assert health(server)["requests_admitted"] == 0


def test_parallel_above_one_is_refused_where_requests_queue():
    model = ChatModel("m", "onnx", RunnerBase(), None, 64, "test", "test")
    assert resolve_parallel(model, None) == 1
    assert resolve_parallel(model, 1) == 1
    with pytest.raises(ArkError, match="onnx runtime of m runs one sequence at a time"):
        resolve_parallel(model, 4)
    with pytest.raises(ArkError, match="below 1"):
        resolve_parallel(model, 0)


@pytest.mark.llamacpp
def test_a_draft_keeps_the_queue(demo_artifact):
    with pytest.raises(ArkError, match="--parallel 2 with --draft lookup"):
        serve_app(str(demo_artifact("gguf")), LIMITS, draft="lookup", parallel=2)
