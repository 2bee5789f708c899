"""`LlamaCppRunner` in a child process bound to another libllama: the InfLLM v2 build of llama.cpp.

llama-cpp-python loads its shared library once, when `llama_cpp` is first imported (it reads
LLAMA_CPP_LIB_PATH at that moment), and a process cannot hold two copies of llama.cpp's symbols
side by side. The patched library (`llamacpp_build.py`) therefore runs in a child Python process
started with LLAMA_CPP_LIB_PATH=<cache>/llamacpp/<version>/lib; the parent keeps the wheel's own
library for dense GGUF files and never has to import llama_cpp first or last.

    runner = SubprocessLlamaCppRunner("model.gguf", lib_dir, n_ctx=4096, kv_type="f32")
    logits = runner.window_logits(ids)           # same Runner protocol as LlamaCppRunner
    runner.close()

Protocol: the parent writes pickled `(method, args, kwargs)` to the child's stdin; the child
answers one pickled `("ok", result)` or `("err", (class name, message, hint))` on a duplicate of its
stdout, whose fd 1 is pointed at stderr so nothing llama.cpp prints can corrupt the stream. Logits
cross as float32 tensors (one [V] row per decode step: 4 * V bytes, ~0.3 MB for MiniCPM4.1).

Debug path (`debug_blocks=True`): the child's llama.cpp context gets a graph callback (ggml's
`cb_eval`, as llama.cpp's eval-callback tool uses) that copies the tensors the patched graph names
`infllm_idx-<layer>` (the blocks it selected, I32 [K, T, HKV]) and `infllm_chunk_sum-<layer>` (the
rows it writes into its compression cache, F32 [1, E, T]). `selected_blocks()` returns the blocks of
the last evaluation per layer as int64 [HKV, T, K] (K sorted ascending), `graph_tensors()` all of
them as numpy arrays in ggml's order reversed ([ne3, ne2, ne1, ne0]).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import torch

from arkinfer import errors
from arkinfer.backend import RunnerBase
from arkinfer.errors import ArkError


class RemoteSequences:
    """`ParallelSequences` (parallel.py) living in the child, over its loaded model: what `serve
    --parallel` steps (n_seq, n_ctx_seq, n_batch, clear, step, close)."""

    def __init__(self, runner: SubprocessLlamaCppRunner, n_seq: int, n_ctx_seq: int) -> None:
        self.runner, self.n_seq, self.n_ctx_seq = runner, n_seq, n_ctx_seq
        self.n_batch = runner._call("parallel_like", n_seq, n_ctx_seq)

    def clear(self, seq: int) -> None:
        self.runner._call("parallel_clear", int(seq))

    def step(self, tokens: dict[int, list[int]],
             last_only: bool = False) -> dict[int, torch.Tensor]:
        return self.runner._call("parallel_step", {int(s): list(ids) for s, ids in tokens.items()},
                                 last_only=last_only)

    def close(self) -> None:
        if self.runner._proc is not None:
            self.runner._call("parallel_close")


class SubprocessLlamaCppRunner(RunnerBase):
    """The Runner protocol over a LlamaCppRunner living in a child process with `lib_dir`'s
    libllama. Sparse models run InfLLM v2 there (flash attention on: the sparse path needs it).
    It speculates: `extend` / `truncate` work (the InfLLM v2 indexer cache holds one row per
    position, cut with the KV cells: a cut-back step is bit-identical), and past dense_len a
    position scored inside a multi-token step has bit-for-bit the logits of its one-token step
    (the patch's decode path gathers the selected blocks in ascending order, the order in which
    the batched path's masked attention visits them), so verify steps reproduce plain greedy
    decoding (docs/speculative.md)."""

    fixed_attention = None  # attention as the model's sparse_config says (InfLLM v2 past dense_len)
    speculates = True

    def __init__(self, gguf_path: str | Path, lib_dir: str | Path, n_ctx: int = 512,
                 n_threads: int | None = None, kv_type: str = "f16", all_logits: bool = True,
                 debug_blocks: bool = False) -> None:
        env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(lib_dir))
        self.path = Path(gguf_path)
        self.n_ctx = n_ctx
        self._proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=env)
        # The child's start (Python, torch, llama.cpp, the model: ~3 s) overlaps with what the
        # caller does next (verify loads the float reference meanwhile): the load request is sent
        # now and its answer read by the first call that needs the child.
        self._pending: str | None = None
        # one call at a time on the pipe: `serve` steps sequences on its scheduler thread while
        # request threads may tokenize
        self._lock = threading.RLock()
        self._send("load", str(gguf_path), n_ctx=n_ctx, n_threads=n_threads, kv_type=kv_type,
                   all_logits=all_logits, flash_attn=True, debug_blocks=debug_blocks, n_batch=None)
        self._pending = "load"

    @property
    def vocab_size(self) -> int:
        self._finish_load()
        return self._vocab_size

    def load(self, gguf_path: str | Path, n_ctx: int = 512, n_threads: int | None = None,
             kv_type: str = "f16", all_logits: bool = True, debug_blocks: bool = False,
             n_batch: int | None = None) -> None:
        """Replace the model in the same child process (no new process, no re-import)."""
        self.path, self.n_ctx = Path(gguf_path), n_ctx
        self._vocab_size = self._call("load", str(gguf_path), n_ctx=n_ctx, n_threads=n_threads,
                                      kv_type=kv_type, all_logits=all_logits, flash_attn=True,
                                      debug_blocks=debug_blocks, n_batch=n_batch)

    def _finish_load(self) -> None:
        """The answer to the constructor's load request, if not read yet."""
        if self._pending is not None:
            self._pending = None
            self._vocab_size = self._receive("load")

    def _call(self, name: str, *args, **kwargs):
        with self._lock:
            self._finish_load()
            self._send(name, *args, **kwargs)
            return self._receive(name)

    def _send(self, name: str, *args, **kwargs) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise ArkError(f"the llama.cpp child process for {self.path.name} is not running",
                           hint="create the runner again")
        try:
            pickle.dump((name, args, kwargs), self._proc.stdin)
            self._proc.stdin.flush()
        except BrokenPipeError:
            self._died(name)

    def _receive(self, name: str):
        try:
            status, payload = pickle.load(self._proc.stdout)
        except (EOFError, pickle.UnpicklingError):
            self._died(name)
        if status == "err":
            cls_name, message, hint = payload
            cls = getattr(errors, cls_name, ArkError)
            raise cls(message, hint=hint)
        return payload

    def _died(self, name: str):
        code = self._proc.wait()
        raise ArkError(f"the llama.cpp child process for {self.path.name} died during "
                       f"{name}() (exit status {code})",
                       hint="run it again with the dense runner, or rebuild the patched "
                            "library: arkinfer doctor --build-llamacpp") from None

    def tokenize(self, text: str, add_bos: bool = False, special: bool = True) -> list[int]:
        return self._call("tokenize", text, add_bos=add_bos, special=special)

    def detokenize(self, ids: list[int]) -> str:
        return self._call("detokenize", list(ids))

    def window_logits(self, window: list[int]) -> torch.Tensor:
        return self._call("window_logits", list(window))

    def reset(self) -> None:
        self._call("reset")

    def prefill(self, ids: list[int]) -> torch.Tensor:
        return self._call("prefill", list(ids))

    def decode(self, token: int) -> torch.Tensor:
        return self._call("decode", int(token))

    def chunk_logits(self, ids: list[int]) -> torch.Tensor:
        return self._call("chunk_logits", list(ids))

    def extend(self, ids: list[int]) -> torch.Tensor:
        """Append `ids` with the logits [len(ids), V] of each (LlamaCppRunner.extend)."""
        return self._call("extend", list(ids))

    def truncate(self, n: int) -> None:
        """Keep the first `n` cached positions (KV cells and InfLLM v2 indexer rows)."""
        self._call("truncate", int(n))

    def parallel_sequences(self, n_seq: int, n_ctx_seq: int) -> RemoteSequences:
        """`n_seq` sequences side by side in the child over its model, with its KV type,
        attention path and n_batch (parallel.sequences_like): what `arkinfer serve --parallel`
        decodes with; InfLLM v2 runs per sequence (a KV stream each)."""
        return RemoteSequences(self, n_seq, n_ctx_seq)

    def parallel_start(self, n_seq: int, n_ctx_seq: int, kv_type: str = "f16",
                       n_batch: int = 512, kv_unified: bool = False) -> None:
        """Open `n_seq` sequences side by side in the child (parallel.ParallelSequences over the
        loaded model, a KV stream each); replaces any open before. debug_blocks captures their
        graphs too."""
        self._call("parallel_start", n_seq, n_ctx_seq, kv_type=kv_type, n_batch=n_batch,
                   kv_unified=kv_unified)

    def parallel_step(self, tokens: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """One llama_decode over tokens of several sequences: {seq: logits [T, V]}."""
        return self._call("parallel_step", {int(s): list(ids) for s, ids in tokens.items()})

    def selected_blocks(self) -> dict[int, list[torch.Tensor]]:
        """{layer: [idx int64 [HKV, T, K] per ubatch of the last evaluation]} (debug_blocks=True)."""
        tensors = self._call("graph_tensors")
        out: dict[int, list[torch.Tensor]] = {}
        for name, arrays in tensors.items():
            if name.startswith("infllm_idx-"):
                out[int(name.rsplit("-", 1)[1])] = [
                    torch.from_numpy(a.reshape(a.shape[-3:]).astype("int64")).sort(-1).values
                    for a in arrays]
        return out

    def graph_tensors(self) -> dict:
        """{tensor name: [numpy array per ubatch of the last evaluation]} (debug_blocks=True)."""
        return self._call("graph_tensors")

    def close(self) -> None:
        proc, self._proc = getattr(self, "_proc", None), None
        if proc is not None and proc.poll() is None:
            try:
                proc.stdin.close()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()

    def __del__(self) -> None:
        self.close()


#: the graph tensors the debug path copies (GraphCapture, graph_capture.py)
CAPTURED = ("infllm_idx", "infllm_chunk_sum")


def _captured(name: str) -> bool:
    prefix, _, layer = name.rpartition("-")
    return prefix in CAPTURED and layer.isdigit()


def _with_capture(runner, lib_dir: Path):
    """Give runner.llm a new llama.cpp context whose graph callback copies the CAPTURED tensors."""
    from arkinfer.backends.gguf.graph_capture import GraphCapture, attach

    return attach(runner, GraphCapture(lib_dir, _captured))


def _serve() -> None:
    """Child process: answer pickled calls on stdin until it closes."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)   # whatever llama.cpp writes to stdout goes to stderr
    from arkinfer.backends.gguf.runner import LlamaCppRunner

    runner, capture, parallel = None, None, None
    inp = sys.stdin.buffer
    while True:
        try:
            name, args, kwargs = pickle.load(inp)
        except EOFError:
            return
        try:
            if name == "load":
                debug = kwargs.pop("debug_blocks")
                if parallel is not None:
                    parallel.close()
                runner = capture = parallel = None   # free the previous model first
                runner = LlamaCppRunner(*args, **kwargs)
                if debug:
                    capture = _with_capture(runner, Path(os.environ["LLAMA_CPP_LIB_PATH"]))
                result = runner.vocab_size
            elif name == "parallel_start":
                from arkinfer.backends.gguf.parallel import ParallelSequences

                if parallel is not None:
                    parallel.close()
                parallel = ParallelSequences(runner.llm, *args, **kwargs,
                                             cb_eval=capture.callback if capture else None)
                result = None
            elif name == "parallel_like":
                from arkinfer.backends.gguf.parallel import sequences_like

                if parallel is not None:
                    parallel.close()
                parallel = sequences_like(runner, *args)
                result = parallel.n_batch
            elif name in ("parallel_step", "parallel_clear", "parallel_close"):
                if parallel is None:
                    raise ArkError("no parallel sequences are open",
                                   hint="call parallel_start(n_seq, n_ctx_seq) first")
                if capture is not None:
                    capture.clear()
                result = getattr(parallel, name.removeprefix("parallel_"))(*args, **kwargs)
                if name == "parallel_close":
                    parallel = None
            elif name == "graph_tensors":
                if capture is None:
                    raise ArkError("graph tensors need a runner created with debug_blocks=True",
                                   hint="create SubprocessLlamaCppRunner(..., debug_blocks=True)")
                result = capture.tensors
            else:
                if capture is not None and name in ("window_logits", "prefill", "decode",
                                                    "chunk_logits", "extend"):
                    capture.clear()
                result = getattr(runner, name)(*args, **kwargs)
            reply = ("ok", result)
        except ArkError as e:
            reply = ("err", (type(e).__name__, e.message, e.hint))
        except Exception as e:  # noqa: BLE001 - everything else crosses as one ArkError
            reply = ("err", ("ArkError", f"llama.cpp child: {type(e).__name__}: {e}", None))
        pickle.dump(reply, out)
        out.flush()


if __name__ == "__main__":
    _serve()
