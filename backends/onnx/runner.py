"""An ONNX artifact (onnx or tensorrt backend) on this machine: model.onnx run by onnxruntime
(CPU), with the KV cache and the InfLLM v2 compressed-key caches carried between calls
(`arkinfer.backend.Runner`).

    runner = OnnxRunner(artifact_dir)                  # ops="contrib": onnxruntime's fused ops
    logits = runner.window_logits(ids)                 # [T, V] float32 from an empty cache
    runner.reset(); runner.prefill(ids[:-1]); nxt = runner.decode(ids[-1])
    rows = runner.extend(draft); runner.truncate(n)    # speculative decoding (not InfLLM v2 graphs)

ops="function" runs every arkinfer-domain node through its ONNX function body (what any ONNX
runtime does); ops="contrib" first swaps the quantised linears for com.microsoft.MatMulNBits
(contrib.py) and RMSNorm / SkipRMSNorm / RotaryGQA for SimplifiedLayerNormalization /
SkipSimplifiedLayerNormalization / GroupQueryAttention (contrib_fused.py), then packs each
attention's q/k/v MatMulNBits into one, and every other group of MatMulNBits on the same
activations (an MLP's gate and up) into one plus a Split (contrib_pack.py); ops="nbits" swaps
the linears only.
All compute the same weights; tests check they agree. The rewritten graph is saved in ArkInfer's
cache on the first load and read from there afterwards (host_graph.py; cache=False: in memory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort
import torch

from arkinfer.backend import StepRunner
from arkinfer.errors import ArkError, NotAvailableError
from arkinfer.frontend.tokenizer import load_tokenizer

from .fn_fused import ROTARY_GQA
from .host_graph import host_graph, stored_accuracy_level
from .kv_shared import SharedKV

ONNX_FILE = "model.onnx"
Ops = Literal["contrib", "nbits", "function"]
DEFAULT_ACCURACY_LEVEL = 0  # MatMulNBits' fp32 activations (README.md, "Host runner")
INT8_FIDELITY_TOP1 = 0.95  # the gguf backend's `fidelity_top1` (llama.cpp: int8 activations)


class OnnxRunner(StepRunner):
    def __init__(self, artifact_dir: str | Path, ops: Ops = "contrib",
                 threads: int | None = None,
                 accuracy_level: int | None = None, cache: bool = True) -> None:
        """accuracy_level: MatMulNBits' compute precision (ops="contrib"): 0 = fp32
        activations, the reference's numbers; 4 = activations quantised to int8 per block and
        integer dot products, as llama.cpp does on CPUs (2.7x faster decode on SmolLM2 on an
        AVX-512 Xeon, 2.8x on an AVX2-only Zen 3; benchmarks/onnx_vs_llamacpp.py). None: the
        level the artifact was built with (`--option accuracy_level`), else 0. cache: keep the
        rewritten graph in ArkInfer's cache (host_graph.py); False rewrites it in memory on
        every load."""
        self.dir = Path(artifact_dir)
        path = self.dir / ONNX_FILE
        if not path.is_file():
            raise NotAvailableError(f"{path} does not exist",
                                    hint="build the artifact with arkinfer build --backend onnx (or tensorrt)")
        if accuracy_level is None:
            stored = stored_accuracy_level(path)
            accuracy_level = DEFAULT_ACCURACY_LEVEL if stored is None else stored
        self.accuracy_level = accuracy_level
        # verify's runtime-fidelity gate: int8 activations flip near-tied top-1 tokens as
        # llama.cpp's do, so they get the gguf backend's threshold
        self.fidelity_top1 = INT8_FIDELITY_TOP1 if accuracy_level == 4 else None
        self.settings = {"accuracy_level": accuracy_level}
        if ops not in ("contrib", "nbits", "function"):
            raise NotAvailableError(f"ops={ops!r} is not a runner mode",
                                    hint="use ops='contrib', 'nbits' or 'function'")
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        if threads:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        self.ops, self.notes, self.fused, self.max_positions = ops, [], {}, None
        self.packed_qkv = 0  # attentions whose q/k/v MatMulNBits were packed into one
        self.packed_siblings = 0  # other MatMulNBits groups on one input (gate + up) packed
        self.shared_kv: SharedKV | None = None
        self.graph_file: Path | None = None   # the cached rewritten graph the session reads
        if ops in ("contrib", "nbits"):
            graph = host_graph(path, ops, accuracy_level, cache=cache)
            self.replaced, self.notes, self.fused = graph.replaced, graph.notes, graph.fused
            self.max_positions, self.packed_qkv = graph.max_positions, graph.packed_qkv
            self.packed_siblings = graph.packed_siblings
            self.graph_file = graph.path
            self.session = ort.InferenceSession(graph.session_source(), opts,
                                                providers=["CPUExecutionProvider"])
            if graph.shared_kv:  # KV in preallocated buffers GQA updates in place (kv_shared.py)
                self.shared_kv = SharedKV(self.session, self.max_positions)
        else:
            self.replaced = 0
            self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.past = [i for i in self.session.get_inputs() if i.name.startswith("past.")]
        # InfLLM v2 graphs carry compressed-key caches (past.{i}.fine / .coarse) that cannot be
        # cut back by slicing: only graphs whose caches are all plain K/V truncate.
        self.speculates = all(i.name.endswith((".k", ".v")) for i in self.past)
        self.outputs = [o.name for o in self.session.get_outputs()]
        logits = self.session.get_outputs()[0]
        self.vocab_size = int(logits.shape[-1])
        self.tokenizer = load_tokenizer(self.dir)
        self.reset()

    def reset(self) -> None:
        """Empty every cache (KV and compressed keys: zero-length along their sequence axis)."""
        self.cache = {}
        self.pos = 0
        if self.shared_kv is not None:
            self.shared_kv.reset()
            return
        for i in self.past:
            shape = [0 if isinstance(d, str) or d is None else int(d) for d in i.shape]
            self.cache[i.name] = np.zeros(shape, np.float32)

    def truncate(self, n: int) -> None:
        """Keep the first `n` cached positions: past.{i}.k / .v [1, Hkv, P, D] sliced to P = n;
        with the shared buffers only the position goes back (GQA reads rows 0..pos-1)."""
        if not self.speculates:
            raise self._cannot_speculate("truncate")
        if not 0 <= n <= self.pos:
            raise ArkError(f"cannot truncate the cache to {n} positions: it holds {self.pos}",
                           hint=f"pass 0..{self.pos}")
        if self.shared_kv is None:
            self.cache = {name: np.ascontiguousarray(value[:, :, :n])
                          for name, value in self.cache.items()}
        self.pos = n

    def decode(self, token: int) -> torch.Tensor:
        """logits [V] of one new token; with the shared KV buffers a step is one bound run whose
        token and position are written in place (no per-step arrays or bindings)."""
        if self.shared_kv is None or self.pos >= self.shared_kv.capacity or (
                self.fused.get(ROTARY_GQA) and self.pos + 1 > self.max_positions):
            return super().decode(token)   # the checks and the buffer growth
        logits = self.shared_kv.step(int(token), self.pos)
        self.pos += 1
        return torch.from_numpy(logits)

    def _step(self, ids: list[int], last_only: bool = False) -> torch.Tensor:
        if self.fused.get(ROTARY_GQA) and self.pos + len(ids) > self.max_positions:
            raise NotAvailableError(
                f"{self.pos + len(ids)} tokens exceed the {self.max_positions} rows of "
                "GroupQueryAttention's cos/sin caches (the model's max_len)",
                hint="shorten the context, or load with ops='nbits' (no fused attention)")
        tokens = np.asarray([ids], np.int64)
        positions = np.arange(self.pos, self.pos + len(ids), dtype=np.int64)
        self.pos += len(ids)
        if self.shared_kv is not None:
            return torch.from_numpy(self.shared_kv.run(tokens, positions)[0])
        out = self.session.run(None, {"tokens": tokens, "positions": positions, **self.cache})
        for name, value in zip(self.outputs[1:], out[1:]):
            self.cache[name.replace("present.", "past.", 1)] = value
        return torch.from_numpy(out[0][0])
