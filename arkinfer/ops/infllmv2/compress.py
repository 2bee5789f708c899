"""Key compression (docs/infllmv2.md §2): parameter-free mean pooling, full and incremental.

Both implementations use this file: compression is O(S * D) either way, and one summation order
makes incremental decode compression bit-identical to recompressing the whole cache.
"""

from __future__ import annotations

import torch
from torch import Tensor

from arkinfer.ops.infllmv2.common import CompressedKeys, n_kernels
from arkinfer.ops.infllmv2.config import SparseConfig

__all__ = ["compress_keys", "kernel_means", "update_compressed"]


def kernel_means(k: Tensor, kernel: int, stride: int, first: int, count: int) -> Tensor:
    """Means of kernels first .. first + count - 1: out[..., j, :] = mean(k[..., s*(first+j) :
    s*(first+j) + kernel, :]) in fp32.  k [B, H, S, D] (any float dtype) -> [B, H, count, D].

    Summed offset by offset (a fixed order independent of `first` and `count`), so a kernel has
    the same bits whether it is computed alone during decode or with all others in a prefill.
    """
    b, h, _, d = k.shape
    if count <= 0:
        return torch.zeros(b, h, 0, d, dtype=torch.float32, device=k.device)
    start = stride * first
    span = stride * (count - 1) + 1
    acc = k[:, :, start:start + span:stride].to(torch.float32, copy=True)  # never alias the cache
    for off in range(1, kernel):
        acc += k[:, :, start + off:start + off + span:stride]
    return acc.mul_(1.0 / kernel)


def _cat(old: Tensor, new: Tensor) -> Tensor:
    return torch.cat([old, new], 2)


def compress_keys(k: Tensor, config: SparseConfig, *, means=kernel_means) -> CompressedKeys:
    """Fine and coarse compressed keys of the whole cache k [B, Hkv, S, D].

    `means`: `kernel_means` of another array library with the same signature (the MLX runtime
    passes its own), so every implementation shares this bookkeeping."""
    s = k.shape[2]
    fk, fs = config.kernel_size, config.kernel_stride
    ck, cs = config.coarse_kernel_size, config.coarse_kernel_stride
    return CompressedKeys(fine=means(k, fk, fs, 0, n_kernels(s, fk, fs)),
                          coarse=means(k, ck, cs, 0, n_kernels(s, ck, cs)), length=s)


def update_compressed(k: Tensor, config: SparseConfig, state: CompressedKeys | None = None, *,
                      means=kernel_means, cat=_cat) -> CompressedKeys:
    """Bring `state` up to the cache k [B, Hkv, S, D]: only kernels completed by the keys after
    state.length are computed (from the cache itself); None compresses the whole cache.

    Returns a new CompressedKeys; the incoming one is never modified, and when no kernel completes
    (15 of 16 decode steps) the same tensors are returned without a copy. `means` / `cat(old,
    new)` (concatenation along the kernel axis): another array library's (see compress_keys).
    """
    if state is None:
        return compress_keys(k, config, means=means)
    s = k.shape[2]
    if state.length > s:
        raise ValueError(f"CompressedKeys covers {state.length} keys but the cache holds only {s}")
    parts = []
    for old, kernel, stride in ((state.fine, config.kernel_size, config.kernel_stride),
                                (state.coarse, config.coarse_kernel_size,
                                 config.coarse_kernel_stride)):
        have, need = old.shape[2], n_kernels(s, kernel, stride)
        if have != n_kernels(state.length, kernel, stride):
            raise ValueError(f"CompressedKeys holds {have} kernels of size {kernel}, not the "
                             f"{n_kernels(state.length, kernel, stride)} of {state.length} keys; "
                             "was it made with another sparse_config? pass state=None")
        parts.append(old if need == have else cat(old, means(k, kernel, stride, have, need - have)))
    return CompressedKeys(fine=parts[0], coarse=parts[1], length=s)
