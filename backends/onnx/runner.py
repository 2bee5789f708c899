"""An ONNX artifact (onnx or tensorrt backend) on this machine: model.onnx run by onnxruntime
(CPU), with the KV cache and the InfLLM v2 compressed-key caches carried between calls
(`arkinfer.backend.Runner`).

    runner = OnnxRunner(artifact_dir)                  # ops="contrib": onnxruntime's fused ops
    logits = runner.window_logits(ids)                 # [T, V] float32 from an empty cache
    runner.reset(); runner.prefill(ids[:-1]); nxt = runner.decode(ids[-1])
    rows = runner.extend(draft); runner.truncate(n)    # speculative decoding (InfLLM v2 too)
    draft = runner.first_layers(2)                     # the `self:2` draft: layers 0-1, norm, head
    runner.enable_taps((1, 2, 3)); runner.taps.rows()  # EAGLE-3's taps, one row per cached position

ops="function" runs every arkinfer-domain node through its ONNX function body (what any ONNX
runtime does); ops="contrib" first swaps the quantised linears for com.microsoft.MatMulNBits
(contrib.py) and RMSNorm / SkipRMSNorm / RotaryGQA for SimplifiedLayerNormalization /
SkipSimplifiedLayerNormalization / GroupQueryAttention (contrib_fused.py), then packs each
attention's q/k/v MatMulNBits into one, and every other group of MatMulNBits on the same
activations (an MLP's gate and up) into one plus a Split (contrib_pack.py); ops="nbits" swaps
the linears only.
All compute the same weights; tests check they agree. The rewritten graph is saved in ArkInfer's
cache on the first load and read from there afterwards (host_graph.py; cache=False: in memory).

`first_layers(N)` and `enable_taps(layers)` make sessions of their own over the same graph,
edited in memory (layer_graph.py): the first N layers only, or the residual stream entering the
tapped layers as further outputs. Both read the weights from the same files (onnxruntime's
external-initializer folder), so nothing is written or copied; plain decoding keeps its session
and pays nothing for the taps.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort
import torch

from arkinfer.backend import StepRunner
from arkinfer.errors import ArkError, NotAvailableError
from arkinfer.frontend.tokenizer import load_tokenizer
from arkinfer.speculative.taps import HiddenTaps, RecordsTaps, check_tap_layers

from . import layer_graph
from .compressed_cache import compressed_kernels, kept_rows
from .fn_fused import ROTARY_GQA
from .host_graph import host_graph, stored_accuracy_level
from .kv_shared import SharedKV, shareable

ONNX_FILE = "model.onnx"
Ops = Literal["contrib", "nbits", "function"]
DEFAULT_ACCURACY_LEVEL = 0  # MatMulNBits' fp32 activations (README.md, "Host runner")
INT8_FIDELITY_TOP1 = 0.95  # the gguf backend's `fidelity_top1` (llama.cpp: int8 activations)
#: onnxruntime's session config key: where a graph given as bytes finds its external weights
EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"


class OnnxRunner(RecordsTaps, StepRunner):
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
        self.threads = threads
        opts = self._session_options()
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
            self.source: str | bytes = graph.session_source()   # the graph this runner runs
            self.session = ort.InferenceSession(self.source, opts,
                                                providers=["CPUExecutionProvider"])
            if graph.shared_kv:  # KV in preallocated buffers GQA updates in place (kv_shared.py)
                self.shared_kv = SharedKV(self.session, self.max_positions)
        else:
            self.replaced = 0
            self.source = str(path)
            self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self._use(self.session, self.shared_kv)
        # InfLLM v2 graphs also carry compressed-key caches (past.{i}.fine / .coarse), cut back
        # by their kernel counts (compressed_cache.py); a cache of any other kind stops truncate.
        self.compressed = compressed_kernels(layer_graph.load_graph(self.source))
        self.speculates = all(i.name.endswith((".k", ".v")) or i.name in self.compressed
                              for i in self.past)
        logits = self.session.get_outputs()[0]
        self.vocab_size = int(logits.shape[-1])
        self.tokenizer = load_tokenizer(self.dir)
        # where the graph's external weights lie (None: in the bytes); edited graphs read them there
        self.weights_folder = layer_graph.external_folder(self.source)
        self._plain = (self.session, self.shared_kv)  # the session without taps
        self._tap_sessions: dict[tuple[int, ...], tuple] = {}  # layers -> (session, kv, names)
        self._taps: HiddenTaps | None = None
        self._tap_names: list[str] = []
        self.reset()

    def _session_options(self, folder: Path | None = None) -> ort.SessionOptions:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        if self.threads:
            opts.intra_op_num_threads = self.threads
            opts.inter_op_num_threads = 1
        if folder is not None:
            opts.add_session_config_entry(EXTERNAL_FOLDER, str(folder))
        return opts

    def _edited_session(self, graph: bytes) -> ort.InferenceSession:
        """A session over `graph` (this runner's graph, edited by layer_graph.py, serialised),
        reading its external weights from where this runner's graph reads them."""
        opts = self._session_options(self.weights_folder)
        return ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])

    def _use(self, session: ort.InferenceSession, shared_kv: SharedKV | None) -> None:
        self.session, self.shared_kv = session, shared_kv
        self.past = [i for i in session.get_inputs() if i.name.startswith("past.")]
        self.outputs = [o.name for o in session.get_outputs()]

    def _refuse_layers(self, what: str) -> None:
        if not self.speculates:
            raise NotAvailableError(
                f"{what} needs a runner that speculates; {self.dir / ONNX_FILE} carries caches "
                f"it cannot cut back ({', '.join(i.name for i in self.past)})",
                hint="use another backend (gguf, reference)")

    @property
    def layer_count(self) -> int:
        """Decoder layers of the graph this runner runs (its past.{i}.k inputs)."""
        return sum(1 for i in self.past if i.name.endswith(".k"))

    @property
    def hidden_size(self) -> int:
        """Width of the residual stream (the final norm's weight); 0 when not found."""
        if not hasattr(self, "_hidden_size"):
            model = layer_graph.load_graph(self.source)
            self._hidden_size = layer_graph.find_layers(model, str(self.dir)).hidden_size()
        return self._hidden_size

    def first_layers(self, n: int) -> OnnxRunner:
        """A runner over this graph's first `n` decoder layers, final norm and LM head
        (layer_graph.py; speculative decoding's `self:N` draft) with its own KV cache: the same
        ops mode, threads and weight files (nothing written), no taps."""
        self._refuse_layers(f"first_layers({n})")
        if not 1 <= n < self.layer_count:
            raise ArkError(f"first_layers({n}): {self.dir / ONNX_FILE} has {self.layer_count} "
                           f"layers; take 1..{self.layer_count - 1}", hint="pick fewer layers")
        model = layer_graph.load_graph(self.source)
        layer_graph.keep_first_layers(model, n, str(self.dir / ONNX_FILE))
        shared = self._plain[1] is not None and shareable(model)
        draft = copy.copy(self)
        draft.source = model.SerializeToString()   # its weights still read from weights_folder
        session = draft._edited_session(draft.source)
        kv = SharedKV(session, self.max_positions) if shared else None
        draft._use(session, kv)
        draft._plain, draft._tap_sessions, draft._taps, draft._tap_names = (session, kv), {}, None, []
        draft.graph_file = None  # its graph is in memory (its weights: weights_folder)
        draft.reset()
        return draft

    def enable_taps(self, layers) -> None:
        """Record, from now on, the residual stream entering decoder layers `layers` (EAGLE-3's
        taps, arkinfer/speculative/taps.py) of every evaluated position: the runner switches to
        a session whose graph has them as further outputs (made once per set of layers), so the
        cache starts empty; `disable_taps` switches back to the plain session."""
        self._refuse_layers("EAGLE-3's taps")
        layers = check_tap_layers(layers, self.layer_count, str(self.dir / ONNX_FILE))
        if layers not in self._tap_sessions:
            model = layer_graph.load_graph(self.source)
            names, width = layer_graph.add_tap_outputs(model, layers, str(self.dir / ONNX_FILE))
            session = self._edited_session(model.SerializeToString())
            kv = None if self._plain[1] is None else \
                SharedKV(session, self.max_positions, dict.fromkeys(names, width))
            self._tap_sessions[layers] = (session, kv, names)
        session, kv, self._tap_names = self._tap_sessions[layers]
        self._use(session, kv)
        self._taps = HiddenTaps(layers)
        self.reset()

    def disable_taps(self) -> None:
        """Stop recording taps: back to the session without them, cache empty."""
        self._use(*self._plain)
        self._taps, self._tap_names = None, []
        self.reset()

    def _record_taps(self, values: dict[str, np.ndarray]) -> None:
        """Append the last call's taps ({output name: [T, H]}) to `taps`."""
        self._taps.append([torch.from_numpy(values[n]) for n in self._tap_names])

    def reset(self) -> None:
        """Empty every cache (KV and compressed keys: zero-length along their sequence axis)."""
        self.cache = {}
        self.pos = 0
        if self._taps is not None:
            self._taps.clear()
        if self.shared_kv is not None:
            self.shared_kv.reset()
            return
        for i in self.past:
            shape = [0 if isinstance(d, str) or d is None else int(d) for d in i.shape]
            self.cache[i.name] = np.zeros(shape, np.float32)

    def truncate(self, n: int) -> None:
        """Keep the first `n` cached positions: past.{i}.k / .v [1, Hkv, P, D] sliced to P = n,
        an InfLLM v2 graph's compressed keys to the kernels n positions complete; with the
        shared buffers only the position goes back (GQA reads rows 0..pos-1)."""
        if not self.speculates:
            raise self._cannot_speculate("truncate")
        if not 0 <= n <= self.pos:
            raise ArkError(f"cannot truncate the cache to {n} positions: it holds {self.pos}",
                           hint=f"pass 0..{self.pos}")
        if self.shared_kv is None:
            self.cache = {name: np.ascontiguousarray(value[:, :, :kept_rows(name, n, self.compressed)])
                          for name, value in self.cache.items()}
        self.pos = n
        if self._taps is not None:
            self._taps.truncate(n)

    def decode(self, token: int) -> torch.Tensor:
        """logits [V] of one new token; with the shared KV buffers a step is one bound run whose
        token and position are written in place (no per-step arrays or bindings)."""
        if self.shared_kv is None or self.pos >= self.shared_kv.capacity or (
                self.fused.get(ROTARY_GQA) and self.pos + 1 > self.max_positions):
            return super().decode(token)   # the checks and the buffer growth
        logits = self.shared_kv.step(int(token), self.pos)
        self.pos += 1
        if self._taps is not None:
            self._record_taps(self.shared_kv.tap_values)
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
            logits = self.shared_kv.run(tokens, positions)[0]
            if self._taps is not None:
                self._record_taps(self.shared_kv.tap_values)
            return torch.from_numpy(logits)
        out = self.session.run(None, {"tokens": tokens, "positions": positions, **self.cache})
        for name, value in zip(self.outputs[1:], out[1:]):
            if name.startswith("present."):  # the rest: tap outputs
                self.cache[name.replace("present.", "past.", 1)] = value
        if self._taps is not None:
            values = dict(zip(self.outputs, out))
            self._record_taps({n: values[n][0] for n in self._tap_names})
        return torch.from_numpy(out[0][0])
