"""The CUDA InfLLM v2 kernels behind the signature of `arkinfer.ops.infllmv2.infllmv2_attention`,
so the conformance suite (tests/conformance) and any torch caller can run them.

Inputs may live on the CPU (they are moved to the GPU per call) in fp16 or bf16; the dense path
below dense_len is `common.dense_attention` (torch), as in every implementation. Prefill (T > 1)
runs the decode kernels once per query: query t at absolute position cache_len + t is a decode
over length = cache_len + t + 1 keys — exactly the prefill visibility of §3 (a fine kernel is
visible iff it is complete within those keys, and qb = (length - 1) // block_size). Correct, not
fast: the kernels are decode kernels.
"""

from __future__ import annotations

import torch
from arkinfer.backends.tensorrt.kernels.bindings import load
from torch import Tensor

from arkinfer.ops.infllmv2.common import (
    AttentionResult,
    CompressedKeys,
    check_keys_cover,
    n_kernels,
    run_infllmv2,
)
from arkinfer.ops.infllmv2.config import SparseConfig

__all__ = ["block_sparse_attention_cuda", "infllmv2_attention_cuda"]

_DEV = torch.device("cuda")


def _kernel_specs(config: SparseConfig) -> tuple[tuple[int, int], tuple[int, int]]:
    return ((config.kernel_size, config.kernel_stride),
            (config.coarse_kernel_size, config.coarse_kernel_stride))


def _compress(k: Tensor, config: SparseConfig, state: CompressedKeys | None) -> CompressedKeys:
    """k [B, Hkv, S, D] -> the CompressedKeys of all S keys (fp32, on k's device); only kernels
    completed after state.length are computed by the CUDA kernel."""
    kern = load()
    b, hkv, s, d = k.shape
    old = 0 if state is None else state.length
    parts: list[list[Tensor]] = [[], []]
    for bi in range(b):
        kd = k[bi].to(_DEV).contiguous()
        for which, (kernel, stride) in enumerate(_kernel_specs(config)):
            buf = torch.zeros(hkv, max(n_kernels(s, kernel, stride), 1), d, dtype=torch.float32,
                              device=_DEV)
            done = n_kernels(old, kernel, stride)
            if state is not None and done:
                prev = state.coarse if which else state.fine
                buf[:, :done] = prev[bi, :, :done].to(_DEV)
            kern.compress(kd, old, s, kernel, stride, buf)
            parts[which].append(buf[:, :n_kernels(s, kernel, stride)].to(k.device))
    return CompressedKeys(fine=torch.stack(parts[0]), coarse=torch.stack(parts[1]), length=s)


def _select(q: Tensor, keys: CompressedKeys, *, config: SparseConfig, scale: float,
            cache_len: int) -> Tensor:
    """q [B, Hq, T, D] -> idx int64 [B, Hkv, T, budget] (per query, as a decode)."""
    check_keys_cover(keys, cache_len + q.shape[2])
    kern = load()
    b, hq, t, d = q.shape
    hkv = keys.fine.shape[1]
    out = torch.empty(b, hkv, t, config.budget, dtype=torch.int64)
    ws = kern.workspace(hq, hkv, d, keys.length, config, _DEV)
    for bi in range(b):
        fine = keys.fine[bi].to(_DEV).contiguous()
        coarse = keys.coarse[bi].to(_DEV).contiguous()
        if fine.shape[1] == 0:
            fine = torch.zeros(hkv, 1, d, device=_DEV)
        if coarse.shape[1] == 0:
            coarse = torch.zeros(hkv, 1, d, device=_DEV)
        qd = q[bi].to(_DEV)
        for ti in range(t):
            idx = kern.select(qd[:, ti].contiguous(), fine, coarse, cache_len + ti + 1, config,
                              scale, ws)
            out[bi, :, ti] = idx.long().cpu()
    return out.to(q.device)


def block_sparse_attention_cuda(q: Tensor, k: Tensor, v: Tensor, idx: Tensor, *,
                                config: SparseConfig, scale: float, cache_len: int) -> Tensor:
    """Stage 2: q [B, Hq, T, D], k/v [B, Hkv, S, D], idx [B, Hkv, T, W] (-1 unused) ->
    [B, Hq, T, D] in q.dtype; query t sees the keys t' <= cache_len + t of its selected blocks."""
    kern = load()
    b, hq, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    out = torch.empty_like(q)
    ws = kern.workspace(hq, hkv, d, s, config, _DEV, budget=idx.shape[-1])
    for bi in range(b):
        qd, kd, vd = q[bi].to(_DEV), k[bi].to(_DEV).contiguous(), v[bi].to(_DEV).contiguous()
        idx_d = idx[bi].to(_DEV, torch.int32)
        for ti in range(t):
            o = kern.sparse_decode(qd[:, ti].contiguous(), kd, vd, idx_d[:, ti].contiguous(),
                                   cache_len + ti + 1, config, scale, ws)
            out[bi, :, ti] = o.to(out.device)
    return out


def infllmv2_attention_cuda(q: Tensor, k: Tensor, v: Tensor, *, config: SparseConfig,
                            scale: float, cache_len: int, state: CompressedKeys | None = None,
                            q_sel: Tensor | None = None, k_sel: Tensor | None = None
                            ) -> AttentionResult:
    """InfLLM v2 with the CUDA kernels (same arguments and results as `fast.infllmv2_attention`)."""
    return run_infllmv2(q, k, v, config=config, scale=scale, cache_len=cache_len, state=state,
                        q_sel=q_sel, k_sel=k_sel, compress=_compress, select=_select,
                        attend=block_sparse_attention_cuda)
