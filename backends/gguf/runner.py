"""llama.cpp as a Runner (through llama-cpp-python, the `[gguf]` extra).

Used as the GGUF backend's host runner and as the speed/quality anchor every other backend is
compared with on the CPU. Logits come back as float32 tensors [T, V] like the reference model's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from arkinfer.errors import NotAvailableError


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        raise NotAvailableError("llama-cpp-python is not installed",
                                hint="pip install 'arkinfer[gguf]' (compiles llama.cpp, ~5 min)") from None
    return llama_cpp


class LlamaCppRunner:
    """One GGUF file loaded in llama.cpp with a context of `n_ctx` tokens (CPU)."""

    def __init__(self, gguf_path: str | Path, n_ctx: int = 512, n_threads: int | None = None,
                 vocab_only: bool = False) -> None:
        llama_cpp = _llama_cpp()
        self.path = Path(gguf_path)
        self.llm = llama_cpp.Llama(model_path=str(self.path), n_ctx=n_ctx, n_batch=n_ctx,
                                   logits_all=True, vocab_only=vocab_only, verbose=False,
                                   n_threads=n_threads)

    def tokenize(self, text: str, add_bos: bool = False, special: bool = True) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def detokenize(self, ids: list[int]) -> str:
        return self.llm.detokenize(ids).decode("utf-8", errors="replace")

    def window_logits(self, window: list[int]) -> torch.Tensor:
        """Logits [T, V] fp32 of `window` evaluated from an empty KV cache."""
        self.llm.reset()
        self.llm.eval(window)
        return torch.from_numpy(np.array(self.llm.scores[: len(window)], dtype=np.float32))
