"""The GGUF backend object registered in the `arkinfer.backends` entry-point group.

    artifact/
      model.gguf       one GGUF file upstream llama.cpp loads (weights, tokenizer, chat template)
      arkinfer.json    the manifest (written by the pipeline)

`lower` writes model.gguf (lower.py); `load` opens it in llama.cpp through llama-cpp-python
(runner.py). Files, keys and type rules: README.md.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from arkinfer.backend import BackendBase, LowerRequest, LowerResult
from arkinfer.errors import TargetError

FORMATS = ("gguf-q4_0", "gguf-q4_1", "gguf-q8_0", "gguf-tq1_0", "gguf-tq2_0")
DEFAULT_N_CTX = 2048


class GGUFBackend(BackendBase):
    """llama.cpp: GGUF files; host runner through llama-cpp-python (`runner.LlamaCppRunner`)."""

    name = "gguf"
    # verify's runtime-vs-reference gate on the same (dequantised) weights: llama.cpp multiplies
    # quantised weights with 8-bit-rounded activations, which flips near-tied top-1 tokens (the
    # demo at q4_0: 98 % top-1 with mean KL 3e-4); a layout or scale bug gives far less.
    fidelity_top1 = 0.95
    # model.gguf is written from config.json and the (quantised) tensors; the IR is not read.
    lowers_from_ir = False

    def available(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in ("gguf", "llama_cpp"))

    def install_hint(self) -> str:
        return "pip install 'arkinfer[gguf]'  (compiles llama.cpp, ~5 min on 2 cores)"

    def preflight(self, raw_config: dict, recipe: Any, target: Any,
                  dtype: str = "f32") -> list[str]:
        """Raise TargetError when llama.cpp cannot run this model or store the recipe's format
        (found before any weight is read); no notes otherwise."""
        from .lower import ARCH_OF

        model_type = raw_config.get("model_type")
        if model_type not in ARCH_OF:
            raise TargetError(f"model_type {model_type!r} has no llama.cpp architecture here "
                              f"(supported: {', '.join(ARCH_OF)})",
                              hint="pick another backend with --backend (`arkinfer targets show "
                              "TARGET` lists them)")
        if recipe is not None and recipe.format not in FORMATS:
            raise TargetError(f"quant format {recipe.format!r} cannot be stored in GGUF; use one "
                              f"of {', '.join(FORMATS)}",
                              hint="pick a --quant preset of those formats, e.g. q4_0")
        return []

    def lower(self, request: LowerRequest) -> LowerResult:
        from .lower import lower

        return lower(request)

    def load(self, artifact_dir: str | Path, manifest: dict | None = None, *,
             n_ctx: int | None = None, n_threads: int | None = None, bench: bool = False):
        """LlamaCppRunner over artifact/model.gguf; n_ctx defaults to the manifest's
        `runner.n_ctx`, else 2048. bench=True: no all-position logits buffer (like llama-bench)."""
        from .lower import GGUF_FILE
        from .runner import LlamaCppRunner

        import torch

        runner_cfg = (manifest or {}).get("runner") or {}
        n_ctx = n_ctx or int(runner_cfg.get("n_ctx", DEFAULT_N_CTX))
        # Same thread count as every other runner (torch's; `arkinfer bench -t` sets it), for
        # decode too: llama-cpp-python's own default is half the cores for single-token steps.
        return LlamaCppRunner(Path(artifact_dir) / GGUF_FILE, n_ctx=n_ctx,
                              n_threads=n_threads or torch.get_num_threads(), all_logits=not bench)

    def reference_weights(self, artifact_dir: str | Path) -> Path:
        """The GGUF file itself: ArkInfer's reference model runs it dequantised (imported once into
        the cache), so verify can separate llama.cpp's runtime error from quantisation error."""
        from .lower import GGUF_FILE

        return Path(artifact_dir) / GGUF_FILE


BACKEND = GGUFBackend()
