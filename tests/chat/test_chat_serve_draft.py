"""`arkinfer serve --draft`: requests generated speculatively, driven with the official `openai`
client. Greedy replies equal plain decoding's on the same runner, whole and streamed; a runner
that cannot verify drafts, or a malformed draft, is refused before the server starts."""

from __future__ import annotations

import json
import urllib.request

import pytest
from chat_support import QUESTION, alone

from arkinfer.backend import RunnerBase
from arkinfer.chat.app import serve_app
from arkinfer.chat.model import ChatModel, attach_draft
from arkinfer.chat.server import ServerLimits
from arkinfer.errors import ArkError, NotAvailableError

pytestmark = pytest.mark.usefixtures("one_thread")
LIMITS = ServerLimits(max_tokens=256, max_queue=4)
# a reply that repeats its prompt, so prompt lookup has something to propose
REPEAT = [{"role": "user", "content": "Repeat after me: the cat sat on the mat, the cat sat on "
           "the mat."}]


@pytest.fixture(scope="module")
def lookup_server(demo_artifact, serve):
    return serve(serve_app(str(demo_artifact("gguf")), LIMITS, draft="lookup", draft_k=4))


@pytest.mark.llamacpp
@pytest.mark.parametrize("messages", [QUESTION, REPEAT], ids=["question", "repeat"])
def test_greedy_chat_with_lookup_draft_equals_plain_decoding(lookup_server, messages,
                                                            monkeypatch):
    draft, proposals = lookup_server.app.state.chat.model.draft, []
    propose = draft.propose

    def spy(*args):
        proposals.append(propose(*args))
        return proposals[-1]

    monkeypatch.setattr(draft, "propose", spy)
    client, want = lookup_server.client(), alone(lookup_server, messages)
    whole = client.chat.completions.create(model="demo", messages=messages, max_tokens=64,
                                           temperature=0)
    assert whole.choices[0].message.content == want and want
    chunks = client.chat.completions.create(model="demo", messages=messages, max_tokens=64,
                                            temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert proposals  # the replies went through the draft
    if messages is REPEAT:
        assert any(p.tokens for p in proposals)


def test_reference_model_with_a_self_draft_equals_plain_decoding(serve):
    server = serve(serve_app("demo", LIMITS, draft="self:1", draft_k=3))
    whole = server.client().chat.completions.create(model="demo", messages=QUESTION,
                                                    max_tokens=32, temperature=0)
    assert whole.choices[0].message.content == alone(server, QUESTION, 32)


@pytest.mark.llamacpp
def test_sampled_and_text_requests_complete_with_a_draft(lookup_server):
    client = lookup_server.client()
    sampled = client.chat.completions.create(model="demo", messages=QUESTION, max_tokens=16,
                                             temperature=0.8, top_p=0.9, seed=3)
    assert sampled.choices[0].message.content
    again = client.chat.completions.create(model="demo", messages=QUESTION, max_tokens=16,
                                           temperature=0.8, top_p=0.9, seed=3)
    assert again.choices[0].message.content == sampled.choices[0].message.content  # seeded
    text = client.completions.create(model="demo", prompt="The kettle", max_tokens=12,
                                     temperature=0)
    assert text.choices[0].text
    with urllib.request.urlopen(f"{lookup_server.url}/health", timeout=60) as response:
        assert json.loads(response.read())["draft"] == "lookup"


def test_a_runner_that_cannot_speculate_is_refused():
    model = ChatModel("m", "onnx", RunnerBase(), None, 64, "test", "test")
    with pytest.raises(NotAvailableError, match="cannot verify drafts"):
        attach_draft(model, "lookup", 4)
    assert model.draft is None


def test_a_malformed_draft_is_refused_before_serving():
    pytest.importorskip("fastapi", reason="pip install 'arkinfer[serve]'")
    with pytest.raises(ArkError, match="self:N"):
        serve_app("demo", LIMITS, draft="self:x")
