"""The GGUF backend object registered in the `arkinfer.backends` entry-point group.

    artifact/
      model.gguf       one GGUF file upstream llama.cpp loads (weights, tokenizer, chat template)
      arkinfer.json    the manifest (written by the pipeline)

`lower` writes model.gguf (lower.py); `load` opens it in llama.cpp through llama-cpp-python
(runner.py), or in the InfLLM v2 build when one is built (llamacpp_runtime.py). What the backend
can do is `CAPABILITIES`. Files, keys and type rules: README.md.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

from arkinfer.backend import (BackendBase, Capabilities, LowerRequest, LowerResult,
                              OptionalRuntime)
from arkinfer.errors import TargetError

from .llamacpp_runtime import infllmv2_built, library_for
from .options import OPTIONS

DEFAULT_N_CTX = 2048
CAPABILITIES = Capabilities(
    # the GGUF block types lower() writes from the canonical weights (README.md's type table)
    formats=("gguf-q4_0", "gguf-q4_1", "gguf-q8_0", "gguf-iq4_nl", "gguf-tq1_0", "gguf-tq2_0"),
    # model.gguf is written from the weights, not the IR (lowers_from_ir = False): llama.cpp's
    # graph of each architecture in lower.ARCH_OF runs every op that architecture traces to
    # (every IR op but rope_table, which only the fold_rope_tables pass makes)
    ops=("embed", "linear", "rms_norm", "rope", "attention", "add", "mul", "mul_scalar",
         "div_scalar", "silu", "cast", "reshape", "transpose", "concat", "slice"),
    cache_dtypes=("f16", "f32"),  # runner.KV_TYPES: f16 is llama.cpp's default
    # upstream llama.cpp runs MiniCPM dense; the patched build runs InfLLM v2
    runtime=OptionalRuntime(
        flag="llamacpp", title="InfLLM v2 llama.cpp", built=infllmv2_built,
        without="llama.cpp runs MiniCPM with dense attention; sparse_config is kept as "
                "metadata only (docs/infllmv2.md §7)"),
    extra="gguf",
    packages={"gguf": "writer, GGUF import", "llama-cpp-python": "host runner"},
)


class GGUFBackend(BackendBase):
    """llama.cpp: GGUF files; host runner through llama-cpp-python (`runner.LlamaCppRunner`)."""

    name = "gguf"
    capabilities = CAPABILITIES
    # verify's runtime-vs-reference gate on the same (dequantised) weights: llama.cpp multiplies
    # quantised weights with 8-bit-rounded activations, which flips near-tied top-1 tokens (the
    # demo at q4_0: 98 % top-1 with mean KL 3e-4); a layout or scale bug gives far less.
    fidelity_top1 = 0.95
    # model.gguf is written from config.json and the (quantised) tensors; the IR is not read.
    lowers_from_ir = False
    options = OPTIONS

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
        formats = self.capabilities.formats
        if recipe is not None and recipe.format not in formats:
            raise TargetError(f"quant format {recipe.format!r} cannot be stored in GGUF; use one "
                              f"of {', '.join(formats)}",
                              hint="pick a --quant preset of those formats, e.g. q4_0")
        return []

    def build_runtime(self, progress=None) -> dict[str, str]:
        """`arkinfer doctor --build-llamacpp`: llama.cpp with the InfLLM v2 patch set, built into
        the cache (reused when current); the Runner then runs sparse artifacts with it."""
        from .llamacpp_build import PINNED_VERSION, build_patched_llamacpp, patch_set_hash

        lib = build_patched_llamacpp(progress=progress)
        return {"llama_cpp_python": PINNED_VERSION, "patches": patch_set_hash(),
                "library": str(lib),
                "used_by": "gguf runner, for artifacts with a sparse_config"}

    def quantizes_in_lower(self, recipe: Any, options: dict[str, str]) -> bool:
        """RTN recipes with rtn=ggml (the default): ggml's reference quantiser rounds the float
        source in lower, byte-identical to llama-quantize; no quantised folder is written."""
        from .plan import ggml_rtn

        return ggml_rtn(recipe, options)

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
        n_threads = n_threads or torch.get_num_threads()
        path = Path(artifact_dir) / GGUF_FILE
        lib = library_for(path)
        path, alias_dir = utf8_path(path)
        if lib is not None:
            # InfLLM v2: the patched libllama, in a child process (subprocess_runner.py)
            from .subprocess_runner import SubprocessLlamaCppRunner

            runner = SubprocessLlamaCppRunner(path, lib, n_ctx=n_ctx, n_threads=n_threads,
                                              all_logits=not bench)
        else:
            runner = LlamaCppRunner(path, n_ctx=n_ctx, n_threads=n_threads, all_logits=not bench)
        if alias_dir is not None:  # the alias goes when the runner does
            weakref.finalize(runner, shutil.rmtree, alias_dir, True)
        return runner

    def reference_weights(self, artifact_dir: str | Path) -> Path:
        """The GGUF file itself: ArkInfer's reference model runs it dequantised (imported once into
        the cache), so verify can separate llama.cpp's runtime error from quantisation error."""
        from .lower import GGUF_FILE

        return Path(artifact_dir) / GGUF_FILE


def utf8_path(path: Path) -> tuple[Path, str | None]:
    """`path`, or a symlink to it in a new temporary folder (returned second) when the path is
    not UTF-8: llama.cpp takes the file name as a UTF-8 string, and a folder named b'\\xff'
    (Python's '\\udcff') cannot be encoded as one."""
    try:
        str(path).encode("utf-8")
        return path, None
    except UnicodeEncodeError:
        folder = tempfile.mkdtemp(prefix="arkinfer-gguf-")
        link = Path(folder) / "model.gguf"
        os.symlink(os.path.abspath(path), link)
        return link, folder


BACKEND = GGUFBackend()
