"""Several sequences side by side in one llama.cpp context, a KV stream each.

This is how llama.cpp serves parallel requests (llama-server's slots, `-np N`): one context with
n_seq_max = N and kv_unified = false holds a separate KV stream per sequence, and one llama_decode
may carry tokens of several sequences. llama.cpp splits such a batch into ubatches holding an
equal number of tokens of consecutive sequence ids (its `split_equal`), and the patched InfLLM v2
graph runs every stream of a ubatch sparse or dense by that stream's own length
(llamacpp_patch/0003). With kv_unified = true the patched graph cannot tell the sequences' blocks
apart and runs dense (it says so once on stderr).

    seqs = ParallelSequences(runner.llm, n_seq=2, n_ctx_seq=2048)
    out = seqs.step({0: prompt_a, 1: prompt_b})   # one llama_decode; {seq: logits [T, V] fp32}
    out = seqs.step({0: [tok_a], 1: [tok_b]})     # a decode step for both sequences
    seqs.clear(1)                                 # sequence 1's stream is empty again
    seqs.close()

    seqs = sequences_like(runner, n_seq=4, n_ctx_seq=2048)   # the runner's KV type and attention

`step` gives logits for every token it was handed (all_logits; `last_only=True`: for each
sequence's last token only), so a step holds at most n_batch tokens in all. Positions continue
where each sequence stopped; `clear(seq)` empties one stream, `reset()` every stream.
"""

from __future__ import annotations

import numpy as np
import torch

from arkinfer.errors import ArkError

from .llamacpp_lib import KV_TYPES, load_llama_cpp


class ParallelSequences:
    """`n_seq` sequences over the model a llama-cpp-python `Llama` has loaded (its weights are
    shared, the context is new): n_ctx_seq cache cells per sequence, tokens per step at most
    `n_batch` (also the ubatch size). kv_unified=True shares one cell pool between the sequences
    (the patched graph then runs dense). `cb_eval`: a ggml graph callback (debug capture)."""

    def __init__(self, llm, n_seq: int, n_ctx_seq: int, kv_type: str = "f16", n_batch: int = 512,
                 flash_attn: bool = True, kv_unified: bool = False, cb_eval=None) -> None:
        llama_cpp = load_llama_cpp()
        from llama_cpp import _internals

        if n_seq < 1:
            raise ArkError(f"n_seq must be at least 1, got {n_seq}", hint="give the number of sequences")
        self.n_seq, self.n_ctx_seq, self.n_batch = n_seq, n_ctx_seq, n_batch
        self.vocab_size = int(llm.n_vocab())
        params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
        params.n_ctx = n_seq * n_ctx_seq
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = n_seq
        params.kv_unified = kv_unified
        params.type_k = params.type_v = KV_TYPES[kv_type]
        params.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                                  else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        if cb_eval is not None:
            params.cb_eval = cb_eval
        self._llama_cpp = llama_cpp
        self._ctx = _internals.LlamaContext(model=llm._model, params=params, verbose=False)
        self._batch = _internals.LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=False)
        self.length = [0] * n_seq

    def reset(self) -> None:
        """Empty every sequence's stream."""
        self._ctx.kv_cache_clear()
        self.length = [0] * self.n_seq

    def clear(self, seq: int) -> None:
        """Empty sequence `seq`'s stream (its next step starts at position 0)."""
        self._ctx.kv_cache_seq_rm(seq, -1, -1)
        self.length[seq] = 0

    def step(self, tokens: dict[int, list[int]],
             last_only: bool = False) -> dict[int, torch.Tensor]:
        """Append tokens[seq] to each given sequence in one llama_decode; {seq: logits [T, V]}
        ([1, V] of each sequence's last token with `last_only`: a prompt's prefill needs no
        more, and skips T x V copies)."""
        total = sum(len(ids) for ids in tokens.values())
        bad = [s for s in tokens if not 0 <= s < self.n_seq]
        if bad:
            raise ArkError(f"sequence ids {bad} are outside 0 .. {self.n_seq - 1}",
                           hint=f"this context holds {self.n_seq} sequences")
        if total == 0 or total > self.n_batch:
            raise ArkError(f"a step takes 1 .. {self.n_batch} tokens in all, got {total}",
                           hint="split the tokens over several steps, or create it with a larger n_batch")
        full = [s for s, ids in tokens.items() if self.length[s] + len(ids) > self.n_ctx_seq]
        if full:
            raise ArkError(f"sequences {full} would exceed their {self.n_ctx_seq} cache cells",
                           hint="create it with a larger n_ctx_seq, or reset() first")
        b = self._batch.batch
        rows: dict[int, range] = {}
        i = 0
        for seq in sorted(tokens):
            ids = tokens[seq]
            rows[seq] = range(i, i + len(ids))
            for j, tok in enumerate(ids):
                b.token[i] = int(tok)
                b.pos[i] = self.length[seq] + j
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq
                b.logits[i] = not last_only or j == len(ids) - 1
                i += 1
        b.n_tokens = total
        code = self._llama_cpp.llama_decode(self._ctx.ctx, b)
        if code != 0:
            raise ArkError(f"llama_decode failed (code {code}) for {total} tokens of sequences "
                           f"{sorted(tokens)}", hint="see llama.cpp's messages above")
        out = {}
        for seq, r in rows.items():
            self.length[seq] += len(r)
            r = r[-1:] if last_only else r
            logits = np.empty((len(r), self.vocab_size), dtype=np.float32)
            for k, row in enumerate(r):
                ptr = self._llama_cpp.llama_get_logits_ith(self._ctx.ctx, row)
                logits[k] = np.ctypeslib.as_array(ptr, shape=(self.vocab_size,))
            out[seq] = torch.from_numpy(logits)
        return out

    def close(self) -> None:
        batch, self._batch = getattr(self, "_batch", None), None
        ctx, self._ctx = getattr(self, "_ctx", None), None
        if batch is not None:
            batch.close()
        if ctx is not None:
            ctx.close()


def sequences_like(runner, n_seq: int, n_ctx_seq: int) -> ParallelSequences:
    """`n_seq` sequences over `runner`'s model with its context's KV type, attention path (flash
    attention or not) and n_batch (a long prompt is cut into the same chunks), so each
    sequence's logits follow the runner's own arithmetic."""
    params = runner.llm.context_params
    n_batch = max(int(params.n_batch), n_seq)  # a decode step carries a token per sequence
    kv_type = next((name for name, ggml_type in KV_TYPES.items() if ggml_type == params.type_k),
                   None)
    if kv_type is None:
        raise ArkError(f"the runner's KV cache has ggml type {params.type_k}, which parallel "
                       f"sequences do not take", hint=f"use a KV type of {sorted(KV_TYPES)}")
    flash_attn = params.flash_attn_type == load_llama_cpp().LLAMA_FLASH_ATTN_TYPE_ENABLED
    return ParallelSequences(runner.llm, n_seq, n_ctx_seq, kv_type=kv_type, n_batch=n_batch,
                             flash_attn=flash_attn)
