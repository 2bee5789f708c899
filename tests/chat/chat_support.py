"""Constants the chat and server tests share (a module of its own: test folders have no
`__init__.py`, so `conftest` is not importable by name across them)."""

from __future__ import annotations

import threading

import pytest

from arkinfer.chat.generation import GenerationSettings, generate_tokens

# (backend, --quant) of each demo artifact: the cheapest build each runtime takes (gguf's q4_0 is
# RTN, no calibration; the reference keeps the float weights; onnx and mlx take their 4-bit preset
# on a short calibration, as tests/backends/e2e does).
BUILDS = {"gguf": "q4_0", "reference": "f32", "onnx": "int4", "mlx": "int4"}
QUESTION = [{"role": "user", "content": "What is bread made from?"}]
#: BUILDS' backends as test parameters, llama.cpp's marked like the other tests that need it.
RUNTIMES = [pytest.param(b, marks=pytest.mark.llamacpp) if b == "gguf" else b for b in BUILDS]


def alone(server, messages=QUESTION, n: int = 64) -> str:
    """The greedy reply generated directly on the server's own runner (on its worker thread)."""
    chat = server.app.state.chat
    model = chat.model
    ids = model.encode_chat(messages)
    tokens = chat.queue.call(lambda: list(generate_tokens(model.runner, ids, GenerationSettings(n),
                                                          model.stop_ids)))
    return model.tokenizer.decode([t for t in tokens if t not in model.stop_ids],
                                  skip_special_tokens=True)


def assert_refused_when_full(server, admitted, full: int) -> None:
    """Wait until `admitted()` reaches `full` (requests running and waiting), then check that one
    more request gets 429 ("already waiting")."""
    import openai

    for _ in range(500):
        if admitted() == full:
            break
        threading.Event().wait(0.01)
    assert admitted() == full
    with pytest.raises(openai.RateLimitError) as info:
        server.client().chat.completions.create(model="demo", messages=QUESTION, max_tokens=8)
    assert "already waiting" in info.value.body["message"]
