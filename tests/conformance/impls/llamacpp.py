"""InfLLM v2 inside llama.cpp (backends/gguf/llamacpp_patch), driven through a one-layer MiniCPM4 GGUF.

Every `attention(q, k, v, ...)` call writes a tiny F32 MiniCPM4 GGUF whose only layer reproduces the
call's q, k and v exactly and whose logits give back the attention output, then evaluates it in the
patched llama.cpp (a child process, `SubprocessLlamaCppRunner`). The B sequences of the batch run
side by side as B llama.cpp sequences with a KV stream each (`parallel_start` / `parallel_step`, as
llama-server's parallel slots): the cache positions 0 .. cache_len - 1 first, then the call's T
queries of every sequence as one llama_decode (one ubatch of B streams, so dense/sparse is decided
on cache_len + T like the reference's forward call).

The construction, for token b*S + i (= position i of sequence b) of B sequences of S (vocabulary
max(B*S, Hq*D + 1)), n_embd = E a power of two with E/4 dims of constant 2:

    embedding x_i = [a*q_i | a*k_i | a*v_i | 0 (Hq*D) | 0 ... | 2 (E/4 dims)], a a power of two
        small enough that the payload moves the mean square (1 + |a*p|^2 / E) by less than half
        an fp32 ulp of 1: attn_norm (weight 1, eps 1e-12) then scales every row by exactly 1, so
        the keys of the call are reproduced bit for bit (ties stay ties);
    wq, wk, wv pick their slices times 1/a (a power of two: exact); rope_freqs = 1e30 makes RoPE
    the identity (the call's q and k are already rotated); scale 1/sqrt(D) as the reference's;
    wo writes the attention output o into the zero slice; the FFN is zero; residual, embedding
    and logit scales are 1; the output rows read o and one constant dim: after output_norm that
    dim is 2 * s (s = 1/rms), so o = 2 * logits[:Hq*D] / logits[Hq*D].

idx comes from the graph itself (tensor `infllm_idx-0`, through ggml's graph callback) when the
queries' ubatch ran sparse; when llama.cpp ran it dense because no query can see more than
`budget` blocks (sparse == dense there, §6.1) it is written as "every past block". The returned
state is the compression cache llama.cpp wrote (tensor `infllm_chunk_sum-0`: per position the sum of
the last kernel_stride keys), turned into kernels with the graph's own arithmetic (chunk rows added
in order, times 1/kernel_size); both tensors hold the ubatch's streams one after the other. fp32
only (the GGUF is F32 and
the KV cache f32); the allocation check and the 32K tests do not apply (allocations happen in
llama.cpp, and every call re-evaluates its prefix).
"""

from __future__ import annotations


# Heavy (make test-all; `pytest tests/conformance -k llamacpp -m heavy`): every check writes and loads one-layer GGUFs in the patched llama.cpp, ~4.5 min;
# one pytest process running every implementation's checks outgrew this machine's 24 GB.
# CI runs the backend's own InfLLM v2 tests instead (tests/backends/gguf/test_gguf_infllmv2.py).
HEAVY = True

import atexit
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from infllmv2_checks import Infllmv2Impl

try:  # an ImportError here is reported by conftest.py as a skip with this reason
    import gguf
except ImportError as exc:
    raise ImportError(f"gguf is not importable ({exc}): pip install 'arkinfer[gguf]'") from None

from arkinfer.backends.gguf.llamacpp_build import patched_library_dir  # noqa: E402
from arkinfer.backends.gguf.metadata import _add_indexer  # noqa: E402

from arkinfer.ops.infllmv2.common import CompressedKeys, n_kernels  # noqa: E402

LIB = patched_library_dir()
if LIB is None:
    raise ImportError("the InfLLM v2 llama.cpp is not built: run `arkinfer doctor --build-llamacpp`")

_RUNNER = []   # one child process for the whole session
_WORK_DIRS: list[Path] = []   # one temporary folder of GGUFs, made on first use, removed at exit


def _work() -> Path:
    if not _WORK_DIRS:
        _WORK_DIRS.append(Path(tempfile.mkdtemp(prefix="arkinfer-llamacpp-conformance-")))
        atexit.register(shutil.rmtree, _WORK_DIRS[0], True)
    return _WORK_DIRS[0]


def _runner():
    if not _RUNNER:
        from arkinfer.backends.gguf.subprocess_runner import SubprocessLlamaCppRunner

        _RUNNER.append(SubprocessLlamaCppRunner(_write(_tiny_model()), LIB, n_ctx=256,
                                                kv_type="f32", debug_blocks=True))
    return _RUNNER[0]


def _tiny_model():
    q = torch.zeros(1, 1, 1, 1, 16)
    return q, q, q, 1, None


def _write(spec) -> Path:
    """GGUF for B sequences: spec = (q [B, Hq, T, D] of the last T positions, k, v [B, Hkv, S, D],
    cache_len, sparse_config or None); token b*S + i is position i of sequence b."""
    q, k, v, cache_len, config = spec
    q, k, v = (x.reshape(-1, *x.shape[-3:]).double() for x in (q, k, v))
    batch, hq, t, d = q.shape
    _, hkv, s, _ = k.shape
    qd, kd = hq * d, hkv * d
    payload = qd + 2 * kd
    n_embd = 1 << math.ceil(math.log2((payload + qd) * 4 / 3))
    vocab = max(batch * s, qd + 1)
    rows = torch.zeros(batch, s, payload, dtype=torch.float32)
    rows[:, cache_len:, :qd] = q.permute(0, 2, 1, 3).reshape(batch, t, qd).float()
    rows[:, :, qd:qd + kd] = k.permute(0, 2, 1, 3).reshape(batch, s, kd).float()
    rows[:, :, qd + kd:] = v.permute(0, 2, 1, 3).reshape(batch, s, kd).float()
    rows = rows.reshape(batch * s, payload)
    biggest = max(float(rows.double().pow(2).sum(1).max()), 1e-30)
    a = 2.0 ** math.floor(0.5 * math.log2(n_embd * 2.0 ** -26 / biggest))
    emb = torch.zeros(vocab, n_embd, dtype=torch.float64)
    emb[:batch * s, :payload] = a * rows.double()
    emb[:, -(n_embd // 4):] = 2.0
    eye = torch.eye(n_embd, dtype=torch.float64)
    wq, wk, wv = eye[:qd] / a, eye[qd:qd + kd] / a, eye[qd + kd:payload] / a
    wo = torch.zeros(n_embd, qd, dtype=torch.float64)
    wo[payload:payload + qd] = torch.eye(qd, dtype=torch.float64)
    out = torch.zeros(vocab, n_embd, dtype=torch.float64)
    out[:qd, payload:payload + qd] = torch.eye(qd, dtype=torch.float64)
    out[qd, -1] = 1.0

    path = _work() / f"attn-{batch}-{hq}-{hkv}-{d}-{s}.gguf"
    w = gguf.GGUFWriter(str(path), "minicpm")
    w.add_context_length(1 << 20)
    w.add_embedding_length(n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(32)
    w.add_head_count(hq)
    w.add_head_count_kv(hkv)
    w.add_key_length(d)
    w.add_value_length(d)
    w.add_layer_norm_rms_eps(1e-12)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(d)
    w.add_vocab_size(vocab)
    w.add_embedding_scale(1.0)
    w.add_residual_scale(1.0)
    w.add_logit_scale(1.0)
    if config is not None:
        _add_indexer(w, "minicpm", config.to_dict())
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>".encode() for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([int(gguf.TokenType.NORMAL)] * vocab)
    f32 = lambda x: np.ascontiguousarray(x.numpy().astype(np.float32))  # noqa: E731
    w.add_tensor("token_embd.weight", f32(emb))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", f32(out))
    w.add_tensor("rope_freqs.weight", np.full(d // 2, 1e30, dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", f32(wq))
    w.add_tensor("blk.0.attn_k.weight", f32(wk))
    w.add_tensor("blk.0.attn_v.weight", f32(wv))
    w.add_tensor("blk.0.attn_output.weight", f32(wo))
    for name, shape in (("ffn_gate", (32, n_embd)), ("ffn_up", (32, n_embd)), ("ffn_down", (n_embd, 32))):
        w.add_tensor(f"blk.0.{name}.weight", np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _state(chunk_sums: list[np.ndarray], s: int, hkv: int, d: int, config) -> CompressedKeys:
    """Kernels from llama.cpp's compression-cache rows (one [E] row per position, in order)."""
    rows = torch.from_numpy(np.concatenate([c.reshape(-1, hkv * d) for c in chunk_sums]))[:s]
    c = config.kernel_stride
    chunk = rows[c - 1::c]                                  # sums of keys c*m .. c*m + c - 1
    parts = []
    for ks, stride, n in ((config.kernel_size, c, n_kernels(s, config.kernel_size, c)),
                          (config.coarse_kernel_size, config.coarse_kernel_stride,
                           n_kernels(s, config.coarse_kernel_size, config.coarse_kernel_stride))):
        step, per = stride // c, ks // c
        acc = None
        for t in range(per):                               # the graph's order: chunk t, t+1, ...
            part = chunk[t::step][:n] if n else chunk[:0]
            acc = part.clone() if acc is None else acc + part
        acc = acc * np.float32(1.0 / ks)
        parts.append(acc.view(n, hkv, d).permute(1, 0, 2).unsqueeze(0).contiguous())
    return CompressedKeys(parts[0], parts[1], s)


def _all_blocks(t: int, cache_len: int, config) -> torch.Tensor:
    """idx [T, budget] when every query sees all its past blocks: 0 .. qb, then -1."""
    qb = torch.arange(cache_len, cache_len + t) // config.block_size
    blk = torch.arange(config.budget)
    return torch.where(blk[None, :] <= qb[:, None], blk[None, :], -1)


def _stream_rows(arrays: list[np.ndarray], batch: int, b: int, width: int) -> list[np.ndarray]:
    """Rows of sequence b from captured per-ubatch tensors whose tokens are B streams in a row."""
    return [a.reshape(batch, -1, width)[b] for a in arrays]


def _sequences(q, k, v, config, cache_len):
    """The B sequences side by side: out [B, Hq, T, D], per sequence (state, idx [Hkv, T, budget])."""
    batch, hq, t, d = q.shape
    _, hkv, s, _ = k.shape
    runner = _runner()
    runner.load(_write((q, k, v, cache_len, config)), n_ctx=256, kv_type="f32",
                debug_blocks=True, all_logits=False)
    n_batch = max(batch * t, 512)
    runner.parallel_start(batch, s + 1, kv_type="f32", n_batch=n_batch)
    ids = [list(range(b * s, (b + 1) * s)) for b in range(batch)]
    per, sums = n_batch // batch, []
    for start in range(0, cache_len, per):           # the prefix, n_batch tokens a step
        end = min(start + per, cache_len)
        runner.parallel_step({b: ids[b][start:end] for b in range(batch)})
        sums += runner.graph_tensors().get("infllm_chunk_sum-0", [])
    logits = runner.parallel_step({b: ids[b][cache_len:] for b in range(batch)})
    tensors = runner.graph_tensors()
    sums += tensors.get("infllm_chunk_sum-0", [])
    out = torch.stack([2.0 * logits[b].double()[:, :hq * d] / logits[b].double()[:, hq * d:hq * d + 1]
                       for b in range(batch)])
    out = out.view(batch, t, hq, d).permute(0, 2, 1, 3).float()
    if config.is_dense(s):
        return out, None
    qb = (torch.arange(cache_len, s) // config.block_size)[None, :, None]
    results = []
    for b in range(batch):
        if "infllm_idx-0" in tensors:
            got = tensors["infllm_idx-0"][-1].reshape(hkv, batch, t, -1)[:, b]
            got = torch.from_numpy(got.astype(np.int64))
            got = torch.where(got > qb, 1 << 30, got).sort(-1).values
            idx = torch.where(got == 1 << 30, -1, got)
            pad = config.budget - idx.shape[-1]
            if pad > 0:
                idx = torch.cat([idx, idx.new_full((hkv, t, pad), -1)], -1)
        else:
            idx = _all_blocks(t, cache_len, config).expand(hkv, t, config.budget)
        results.append((_state(_stream_rows(sums, batch, b, hkv * d), s, hkv, d, config), idx))
    return out, results


def attention(q, k, v, *, config, scale, cache_len, state=None, q_sel=None, k_sel=None):
    if abs(scale - q.shape[-1] ** -0.5) > 1e-12:
        raise NotImplementedError("the GGUF carries no attention scale: 1/sqrt(head_dim) only")
    out, results = _sequences(q, k, v, config, cache_len)
    out = out.to(q.dtype)
    if results is None:
        return out, state, None
    new_state = CompressedKeys(torch.cat([r[0].fine for r in results]),
                               torch.cat([r[0].coarse for r in results]), results[0][0].length)
    return out, new_state, torch.stack([r[1] for r in results])


IMPL = Infllmv2Impl(name="llamacpp", attention=attention, dtypes=(torch.float32,),
                    tracks_memory=False, heavy=False, exact_dense=False)
