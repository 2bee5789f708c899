"""What every InfLLM v2 implementation shares: decode state, input checks, the dense path and the
dense <-> sparse switch (docs/infllmv2.md §5).

Layout everywhere: q [B, Hq, T, D] holds the T new queries at absolute positions
cache_len .. cache_len + T - 1; k, v [B, Hkv, S, D] hold the whole cache including the new keys
(S = cache_len + T); Hq % Hkv == 0 and query head h belongs to KV group h // (Hq // Hkv).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from arkinfer.ops.infllmv2.config import SparseConfig

__all__ = ["AttentionResult", "CompressedKeys", "check_inputs", "check_keys_cover",
           "dense_attention", "n_kernels", "run_infllmv2"]

AttentionResult = tuple[Tensor, "CompressedKeys | None", "Tensor | None"]


@dataclass(frozen=True)
class CompressedKeys:
    """Per-layer decode state: the mean-pooled keys of the first `length` cached keys.

    fine:   fp32 [B, Hkv, n1(length), D], fine[..., j, :] = mean(K[kernel_stride*j : +kernel_size])
    coarse: fp32 [B, Hkv, n2(length), D], the same with the 4x coarse kernel and stride
    length: number of keys summarised; kernels that are complete within them are all present, so
    appending keys only ever adds kernels (the tail is re-read from the cache, never stored).
    room:   None, or the buffers fine / coarse are leading views of (`compress.KernelRoom`), so a
            decode step appends the kernels it completes in place instead of copying the state
            (an O(cache) copy every 16 tokens otherwise). An implementation detail: equality
            and repr ignore it.
    """

    fine: Tensor
    coarse: Tensor
    length: int
    room: object = field(default=None, compare=False, repr=False)


def n_kernels(length: int, kernel: int, stride: int) -> int:
    """Complete kernels in `length` keys: floor((L - kernel) / stride) + 1, 0 if L < kernel."""
    return 0 if length < kernel else (length - kernel) // stride + 1


def dense_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, cache_len: int) -> Tensor:
    """Causal GQA attention, fp32 softmax: query t (absolute position cache_len + t) sees keys
    0 .. cache_len + t.  q [B, Hq, T, D], k/v [B, Hkv, cache_len + T, D] -> [B, Hq, T, D] in q.dtype.
    """
    b, hq, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    group = hq // hkv
    qf, kf, vf = q.float(), k.float(), v.float()
    if t == 1:
        # One query sees the whole cache: fold the group into the query axis so each KV head is
        # read once (SDPA's enable_gqa path re-reads K/V once per query head).
        out = F.scaled_dot_product_attention(qf.view(b, hkv, group, d), kf, vf, scale=scale)
        return out.view(b, hq, 1, d).to(q.dtype)
    if t == s:
        out = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True, scale=scale,
                                             enable_gqa=group > 1)
        return out.to(q.dtype)
    # Chunked prefill: a [T, S] boolean mask (the new chunk against the cache), never S x S.
    rows = torch.arange(cache_len, s, device=q.device)[:, None]
    mask = torch.arange(s, device=q.device)[None, :] <= rows
    out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, scale=scale,
                                         enable_gqa=group > 1)
    return out.to(q.dtype)


def check_inputs(q: Tensor, k: Tensor, v: Tensor, cache_len: int, config: SparseConfig,
                 state: CompressedKeys | None, q_sel: Tensor | None, k_sel: Tensor | None
                 ) -> None:
    """Raise ValueError with a readable message when shapes or arguments do not fit together."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D [B, H, T, D]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    b, hq, t, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must both be [B={b}, Hkv, S, "
                         f"D={d}] for q {tuple(q.shape)}")
    if k.shape[1] == 0 or hq % k.shape[1]:
        raise ValueError(f"query heads Hq={hq} must be a multiple of KV heads Hkv={k.shape[1]}")
    if cache_len < 0 or k.shape[2] != cache_len + t:
        raise ValueError(f"k/v hold {k.shape[2]} positions but cache_len={cache_len} + T={t} new "
                         f"queries = {cache_len + t}; pass the whole cache including the new keys")
    if (q_sel is None) != (k_sel is None):
        raise ValueError("pass q_sel and k_sel together (the pre-RoPE queries and keys)")
    if q_sel is not None:
        if not config.use_nope:
            raise ValueError("q_sel/k_sel (pre-RoPE selection inputs) are only used with "
                             "use_nope=True; this sparse_config has use_nope=False")
        if q_sel.shape != q.shape or k_sel.shape != k.shape:
            raise ValueError(f"q_sel {tuple(q_sel.shape)} / k_sel {tuple(k_sel.shape)} must have "
                             f"the shapes of q {tuple(q.shape)} / k {tuple(k.shape)}")
    elif config.use_nope and not config.is_dense(k.shape[2]):
        raise ValueError("sparse_config has use_nope=True: pass q_sel and k_sel, the queries and "
                         "keys before RoPE, which InfLLM v2 uses to select blocks")
    if state is not None:
        hkv = k.shape[1]
        if (state.length > k.shape[2] or state.fine.shape[:2] != (b, hkv)
                or state.fine.shape[-1] != d):
            raise ValueError(f"CompressedKeys state (fine {tuple(state.fine.shape)}, length "
                             f"{state.length}) does not belong to this cache "
                             f"(k {tuple(k.shape)}); pass state=None to recompress")


def check_keys_cover(keys: CompressedKeys, total: int) -> None:
    """Block selection needs the compressed keys of exactly the cache the queries attend to."""
    if keys.length != total:
        raise ValueError(f"compressed keys cover {keys.length} keys, but the queries attend to a "
                         f"cache of {total}; bring the state up to date with update_compressed")


class SelectFn(Protocol):
    def __call__(self, q: Tensor, keys: CompressedKeys, *, config: SparseConfig, scale: float,
                 cache_len: int) -> Tensor: ...


class AttendFn(Protocol):
    def __call__(self, q: Tensor, k: Tensor, v: Tensor, idx: Tensor, *, config: SparseConfig,
                 scale: float, cache_len: int) -> Tensor: ...


class CompressFn(Protocol):
    def __call__(self, k: Tensor, config: SparseConfig,
                 state: CompressedKeys | None) -> CompressedKeys: ...


def run_infllmv2(q: Tensor, k: Tensor, v: Tensor, *, config: SparseConfig, scale: float,
                 cache_len: int, state: CompressedKeys | None, q_sel: Tensor | None,
                 k_sel: Tensor | None, compress: CompressFn, select: SelectFn,
                 attend: AttendFn) -> AttentionResult:
    """The InfLLM v2 forward both implementations share; they plug in their three stages.

    Returns (out [B, Hq, T, D] in q.dtype, state, idx [B, Hkv, T, budget] int64 or None).
    A dense call (total < dense_len) returns the incoming state untouched: the first sparse call
    after it brings the state up to date (one-time compression when crossing dense_len).
    """
    check_inputs(q, k, v, cache_len, config, state, q_sel, k_sel)
    if config.is_dense(k.shape[2]):
        return dense_attention(q, k, v, scale, cache_len), state, None
    sel_q, sel_k = (q_sel, k_sel) if q_sel is not None else (q, k)
    keys = compress(sel_k, config, state)
    idx = select(sel_q, keys, config=config, scale=scale, cache_len=cache_len)
    out = attend(q, k, v, idx, config=config, scale=scale, cache_len=cache_len)
    return out, keys, idx
