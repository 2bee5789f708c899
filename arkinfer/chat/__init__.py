"""Chat with a built artifact through its own runtime, and serve it over HTTP.

    model = open_chat_model("dist/demo.host.q4_0")       # runner + tokenizer + context
    ids = model.encode_chat([{"role": "user", "content": "Hi"}])
    for token in generate_tokens(model.runner, ids, GenerationSettings(max_tokens=32)):
        ...

- `tokenizer.py`: the artifact's tokenizer and chat template (its own files, its GGUF metadata or
  its float source).
- `context.py`: how many positions the artifact can hold, and the up-front context check.
- `generation.py`: prefill, sample, decode over any `arkinfer.backend.Runner`.
- `text_stream.py`: token ids to text pieces as they come (no split UTF-8 characters).
- `model.py`: `ChatModel`, the runner with everything a chat needs.
- `runner_queue.py`: one worker thread per runner, requests one after another.
- `parallel_scheduler.py`: several requests at once on the gguf runtime (a llama.cpp sequence
  each, one decode step for all of them).
- `protocol.py`, `responses.py`, `token_channel.py`, `server.py`, `app.py`: the
  OpenAI-compatible HTTP server (FastAPI + uvicorn).
"""
