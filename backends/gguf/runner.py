"""llama.cpp as a Runner (through llama-cpp-python, the `[gguf]` extra).

Used as the GGUF backend's host runner (`arkinfer.backend.Runner`: tokenize, window_logits, reset,
prefill, decode) and as the speed/quality anchor every other backend is compared with on the CPU.
Logits come back as float32 tensors ([T, V] or [V]) like the reference model's.

    runner = LlamaCppRunner("artifact/model.gguf", n_ctx=2048)
    logits = runner.window_logits(ids)              # [T, V] from an empty KV cache
    runner.reset(); last = runner.prefill(ids[:-1]); nxt = runner.decode(ids[-1])
    rows = runner.extend(draft); runner.truncate(n)   # speculative decoding's verify / rollback

The KV cache holds at most `n_ctx` tokens. `window_logits` asks llama.cpp for the logits of every
position (an n_ctx x vocab float32 buffer); `prefill` / `decode` ask for the last position only,
so their timing is llama.cpp's own (no lm_head over the whole prompt, no copy of its logits).
`extend` asks for the logits of the positions it appends only and reads them from the context's
output buffer, so it works on timing runners (all_logits=False) too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from arkinfer.backend import RunnerBase, check_token_ids
from arkinfer.errors import ArkError, NotAvailableError
from arkinfer.speculative.taps import HiddenTaps, RecordsTaps, check_tap_layers

from .llamacpp_lib import KV_TYPES, load_llama_cpp, quiet_llama_logs


class LlamaCppRunner(RecordsTaps, RunnerBase):
    """One GGUF file loaded in llama.cpp with a context of `n_ctx` tokens (CPU)."""

    # Upstream llama.cpp ignores arkinfer.sparse.*: MiniCPM4 runs dense attention at every length.
    fixed_attention = "dense"
    speculates = True

    def __init__(self, gguf_path: str | Path, n_ctx: int = 512, n_threads: int | None = None,
                 vocab_only: bool = False, kv_type: str = "f16", all_logits: bool = True,
                 flash_attn: bool = False, n_batch: int | None = None) -> None:
        """kv_type: KV cache element type, "f16" (llama.cpp's default) or "f32" (exact parity
        checks: an f16 cache rounds K and V to 11 significant bits). all_logits=False (timing
        runs) skips the n_ctx x vocab logits buffer; window_logits then takes at most 512 tokens.
        flash_attn: llama.cpp's flash-attention path (the InfLLM v2 build needs it for sparse
        attention, see subprocess_runner.py). n_batch: tokens per llama_decode call and per
        ubatch (default min(n_ctx, 512))."""
        llama_cpp = load_llama_cpp()
        self.path = Path(gguf_path)
        if not self.path.is_file():
            raise NotAvailableError(f"GGUF file {self.path} does not exist",
                                    hint="build the artifact again (arkinfer build ... --backend gguf)")
        self.n_ctx = n_ctx
        self.all_logits = all_logits
        n_batch = n_batch or min(n_ctx, 512)
        self.llm = llama_cpp.Llama(model_path=str(self.path), n_ctx=n_ctx, n_batch=n_batch,
                                   n_ubatch=n_batch,
                                   logits_all=all_logits, vocab_only=vocab_only, verbose=False,
                                   n_threads=n_threads, n_threads_batch=n_threads,
                                   type_k=KV_TYPES[kv_type],
                                   type_v=KV_TYPES[kv_type], flash_attn=flash_attn)
        self.vocab_size = int(self.llm.n_vocab())
        quiet_llama_logs(llama_cpp)
        self._taps: HiddenTaps | None = None  # None: not recording taps
        self._capture = None
        self._plain_ctx = None  # the context without graph callback, once taps were enabled
        self._tap_contexts: dict[tuple[int, ...], tuple] = {}  # layers -> (ctx, capture, names)

    def tokenize(self, text: str, add_bos: bool = False, special: bool = True) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def detokenize(self, ids: list[int]) -> str:
        return self.llm.detokenize(ids).decode("utf-8", errors="replace")

    def window_logits(self, window: list[int]) -> torch.Tensor:
        """Logits [T, V] fp32 of `window` evaluated from an empty KV cache."""
        self.reset()
        self._eval(window, every_position=True)
        return torch.from_numpy(np.array(self.llm.scores[: len(window)], dtype=np.float32))

    def reset(self) -> None:
        """Empty the KV cache."""
        # Rewinds the token count; the next eval removes every cache cell from there on.
        self.llm.reset()
        if self._taps is not None:
            self._taps.clear()

    def prefill(self, ids: list[int]) -> torch.Tensor:
        """Append `ids` to the cache; logits [V] of the last one."""
        self._eval(ids)
        return self._last()

    def decode(self, token: int) -> torch.Tensor:
        """Append one token; its logits [V]."""
        self._eval([token])
        return self._last()

    def chunk_logits(self, ids: list[int]) -> torch.Tensor:
        """Append `ids` (at most n_batch: one llama_decode call, one ubatch); logits [T, V] of
        each of them. Needs all_logits=True."""
        if len(ids) > self.llm.n_batch:
            raise ArkError(f"{len(ids)} tokens do not fit one batch of {self.llm.n_batch}",
                           hint="load the runner with a larger n_batch")
        start = self.llm.n_tokens
        self._eval(ids, every_position=True)
        return torch.from_numpy(np.array(self.llm.scores[start:start + len(ids)], dtype=np.float32))

    @property
    def layer_count(self) -> int:
        """Decoder blocks of the loaded GGUF (`{arch}.block_count`); 0 when the file has none."""
        meta = self.llm.metadata  # the GGUF's keys, as strings, read by llama.cpp at load
        return int(meta.get(f"{meta.get('general.architecture', '')}.block_count", 0))

    @property
    def hidden_size(self) -> int:
        """Width of the residual stream (`{arch}.embedding_length`); 0 when the file has none."""
        meta = self.llm.metadata
        return int(meta.get(f"{meta.get('general.architecture', '')}.embedding_length", 0))

    def first_layers(self, n: int) -> LlamaCppRunner:
        """A runner over a GGUF of this file's first `n` blocks, final norm and output layer
        (truncate.py; written once into the ArkInfer cache, never into the artifact), with this
        runner's n_ctx and threads: speculative decoding's `self:N` draft. all_logits=False: a
        draft asks for the last position's logits only."""
        from .truncate import truncated_gguf

        if not 1 <= n < self.layer_count:
            raise ArkError(f"first_layers({n}): {self.path} has {self.layer_count} blocks; take "
                           f"1..{self.layer_count - 1}", hint="pick fewer layers")
        return LlamaCppRunner(truncated_gguf(self.path, n), n_ctx=self.n_ctx,
                              n_threads=self.llm.n_threads, all_logits=False)

    def extend(self, ids: list[int]) -> torch.Tensor:
        """Append `ids` (at most n_batch: one llama_decode call) with the logits of each
        position marked in the batch; logits [len(ids), V] float32, copied out of llama.cpp's
        output buffer (llama-cpp-python's `scores` has only n_batch rows on a timing runner)."""
        llm = self.llm
        if len(ids) > llm.n_batch:
            raise ArkError(f"{len(ids)} tokens do not fit one batch of {llm.n_batch}",
                           hint="draft fewer tokens, or load the runner with a larger n_batch")
        check_token_ids(ids, self.vocab_size, cached=llm.n_tokens, max_positions=self.n_ctx,
                        length_hint="load the runner with a larger n_ctx, or reset() first")
        start = llm.n_tokens
        # What Llama.eval does for one batch, with every position's logits requested.
        llm._ctx.kv_cache_seq_rm(-1, start, -1)
        llm._batch.set_batch(batch=list(ids), n_past=start, logits_all=True)
        llm._ctx.decode(llm._batch)
        llm.input_ids[start:start + len(ids)] = ids
        llm.n_tokens = start + len(ids)
        self._record_taps()
        rows = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(len(ids), self.vocab_size))
        return torch.from_numpy(np.array(rows, dtype=np.float32))

    def truncate(self, n: int) -> None:
        """Keep the first `n` cached positions: llama.cpp removes the cells n.. of every
        sequence now, and the token count (where the next eval writes) goes back to n."""
        if not 0 <= n <= self.llm.n_tokens:
            raise ArkError(f"cannot truncate the cache to {n} positions: it holds "
                           f"{self.llm.n_tokens}", hint=f"pass 0..{self.llm.n_tokens}")
        if not self.llm._ctx.kv_cache_seq_rm(-1, n, -1):
            raise NotAvailableError(f"llama.cpp cannot remove cache cells {n}.. of {self.path.name}"
                                    " (a recurrent or sliding-window cache keeps no positions)",
                                    hint="decode without a draft")
        self.llm.n_tokens = n
        if self._taps is not None:
            self._taps.truncate(n)

    def parallel_sequences(self, n_seq: int, n_ctx_seq: int):
        """`n_seq` sequences side by side over this runner's model, `n_ctx_seq` cache cells each,
        with its KV type, attention path and n_batch (parallel.py `sequences_like`): what
        `arkinfer serve --parallel` decodes with."""
        from .parallel import sequences_like

        return sequences_like(self, n_seq, n_ctx_seq)

    def enable_taps(self, layers) -> None:
        """Record, from now on, the hidden states at the input of decoder blocks `layers`
        (EAGLE-3's taps, arkinfer/speculative/taps.py: llama.cpp's `l_out-<i-1>` nodes, copied
        by a graph callback) of every evaluated position; `taps` then holds one row per cached
        position. The runner switches to a llama.cpp context of its own with that callback
        (made once per set of layers), so the cache starts empty; `disable_taps` switches back
        to the context without callback (plain decoding pays nothing for the taps)."""
        from .graph_capture import attach, capture_of

        layers = check_tap_layers(layers, self.layer_count, str(self.path))
        if self._plain_ctx is None:
            self._plain_ctx = self.llm._ctx
        if layers not in self._tap_contexts:
            names = [f"l_out-{i - 1}" for i in layers]
            capture = attach(self, capture_of(names, self.hidden_size, self.n_ctx))
            self._tap_contexts[layers] = (self.llm._ctx, capture, names)
        self.llm._ctx, self._capture, self._tap_names = self._tap_contexts[layers]
        self._taps = HiddenTaps(layers)
        self.reset()

    def disable_taps(self) -> None:
        """Stop recording taps: back to the context without graph callback, cache empty."""
        if self._plain_ctx is not None:
            self.llm._ctx = self._plain_ctx
        self._taps = None
        self.reset()

    def _record_taps(self) -> None:
        """Move the captured tap tensors of the last evaluation into `taps`."""
        if self._taps is None:
            return
        captured = self._capture.tensors
        missing = [n for n in self._tap_names if n not in captured]
        if missing:
            raise NotAvailableError(f"llama.cpp's graph for {self.path.name} has no node "
                                    f"{missing[0]}", hint="this architecture's graph names its "
                                    "block outputs otherwise: use another draft")
        self._taps.append([torch.from_numpy(np.concatenate(captured[n])) for n in self._tap_names])
        self._capture.clear()

    def _eval(self, ids: list[int], every_position: bool = False) -> None:
        check_token_ids(ids, self.vocab_size, cached=self.llm.n_tokens, max_positions=self.n_ctx,
                        length_hint="load the runner with a larger n_ctx, or reset() first")
        if every_position and not self.all_logits and self.llm.n_tokens + len(ids) > 512:
            raise ArkError(f"{len(ids)} tokens need logits of every position, but this runner "
                           "was loaded for timing (all_logits=False, at most 512)",
                           hint="load it with all_logits=True")
        # llama-cpp-python marks every position for logits when `_logits_all` is set (needed for
        # window_logits) and only the last one otherwise; it reads the flag on each eval.
        self.llm._logits_all = every_position
        try:
            self.llm.eval(ids)
        finally:
            self.llm._logits_all = self.all_logits
        self._record_taps()

    def _last(self) -> torch.Tensor:
        """Logits [V] of the last evaluated position (llama_get_logits_ith(ctx, -1))."""
        ptr = self.llm._ctx.get_logits_ith(-1)
        row = np.ctypeslib.as_array(ptr, shape=(self.vocab_size,))
        return torch.from_numpy(np.array(row, dtype=np.float32))
