"""Fixtures of the chat and server tests: the demo built for each runtime once per test run, and
an OpenAI-compatible server on a free port in a background thread."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from chat_support import BUILDS

from arkinfer.backend import get_backend


@pytest.fixture(scope="session")
def demo_artifact(tmp_path_factory):
    """Factory: demo_artifact(backend) -> the demo built for that backend (cached); skips when
    its toolchain is not installed."""
    built: dict[str, Path] = {}

    def make(backend: str) -> Path:
        if backend not in built:
            if backend == "gguf":
                pytest.importorskip("llama_cpp", reason="llama-cpp-python (the [gguf] extra) "
                                    "is not installed")
            if not get_backend(backend).available():
                pytest.skip(f"{backend}: toolchain not installed "
                            f"({get_backend(backend).install_hint()})")
            from arkinfer.pipeline.build import build
            from arkinfer.pipeline.plan import CalibSettings, resolve_plan

            out = tmp_path_factory.mktemp("chat") / f"demo.{backend}"
            plan = resolve_plan("demo", target="host", quant=BUILDS[backend], backend=backend,
                                out=out, calib=CalibSettings(None, samples=8, seq_len=128))
            built[backend] = build(plan).path
        return built[backend]

    return make


class ServerThread:
    """uvicorn serving `app` on 127.0.0.1 at a free port, in a daemon thread."""

    def __init__(self, app) -> None:
        import uvicorn

        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def client(self, **kwargs):
        """The official openai client pointed at this server (no retries: a 429 stays a 429)."""
        from openai import OpenAI

        return OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def serve():
    """Factory: serve(app) -> a running ServerThread; every server stops after the module."""
    pytest.importorskip("fastapi", reason="pip install 'arkinfer[serve]'")
    pytest.importorskip("openai", reason="pip install openai")
    running: list[ServerThread] = []

    def start(app) -> ServerThread:
        running.append(ServerThread(app))
        return running[-1]

    yield start
    for server in running:
        server.stop()
