"""The GGUF backend object registered in the `arkinfer.backends` entry-point group."""

from __future__ import annotations

import importlib.util


class GGUFBackend:
    """llama.cpp: GGUF files; host runner through llama-cpp-python (`runner.LlamaCppRunner`)."""

    name = "gguf"

    def available(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in ("gguf", "llama_cpp"))

    def install_hint(self) -> str:
        return "pip install 'arkinfer[gguf]'  (compiles llama.cpp, ~5 min on 2 cores)"


BACKEND = GGUFBackend()
