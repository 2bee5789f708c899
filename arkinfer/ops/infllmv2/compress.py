"""Key compression (docs/infllmv2.md §2): parameter-free mean pooling, full and incremental.

Both implementations use this file: compression is O(S * D) either way, and one summation order
makes incremental decode compression bit-identical to recompressing the whole cache.
"""

from __future__ import annotations

import torch
from torch import Tensor

from arkinfer.ops.infllmv2.common import CompressedKeys, n_kernels
from arkinfer.ops.infllmv2.config import SparseConfig
from arkinfer.ops.infllmv2.native import kernels as kernels_or_none

__all__ = ["KernelRoom", "compress_keys", "kernel_means", "reserve_room", "update_compressed"]


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


def _kernel_shapes(config: SparseConfig) -> tuple[tuple[int, int], tuple[int, int]]:
    """(kernel, stride) of the fine and of the coarse compressed keys."""
    return ((config.kernel_size, config.kernel_stride),
            (config.coarse_kernel_size, config.coarse_kernel_stride))


class KernelRoom:
    """Spare capacity behind a decode state's compressed keys (`CompressedKeys.room`).

    fine / coarse: fp32 [B, Hkv, capacity, D] buffers; a state's fine / coarse are their leading
    views [:, :, :n]. `ends` = the kernel counts written so far. A state may append in place only
    while its own counts equal `ends`: a second update of an older state (a branch, a rewind)
    finds them different and copies instead, so no state ever sees its kernels change."""

    def __init__(self, fine: Tensor, coarse: Tensor, ends: tuple[int, int]) -> None:
        self.fine, self.coarse, self.ends = fine, coarse, ends
        self.plan = None    # the layer's native.DecodePlan, set by decode.decode_step

    @staticmethod
    def grown(n: int) -> int:
        """Capacity for n kernels: an eighth more (at least 64), so a long decode copies its
        state once per ~n/8 kernels, i.e. rarely, at ~12 % extra memory."""
        return n + max(64, n // 8)


def reserve_room(state: CompressedKeys, for_kernels: tuple[int, int] = (0, 0)) -> CompressedKeys:
    """The same kernels in a fresh `KernelRoom` (one copy) with room for at least for_kernels
    (fine, coarse) and an eighth more, so the decode steps that follow append in place (e.g.
    right after a prefill's full compression)."""
    b, h, n1, d = state.fine.shape
    n2 = state.coarse.shape[2]
    grow = dict(dtype=torch.float32, device=state.fine.device)
    room = KernelRoom(torch.empty(b, h, KernelRoom.grown(max(n1, for_kernels[0])), d, **grow),
                      torch.empty(b, h, KernelRoom.grown(max(n2, for_kernels[1])), d, **grow),
                      (n1, n2))
    room.fine[:, :, :n1] = state.fine
    room.coarse[:, :, :n2] = state.coarse
    return CompressedKeys(room.fine[:, :, :n1], room.coarse[:, :, :n2], state.length, room)


def _append_in_place(k: Tensor, config: SparseConfig, state: CompressedKeys,
                     need: tuple[int, ...], means) -> CompressedKeys:
    """The state extended to need = (n1, n2) kernels of the cache k: written into the spare room
    behind state (made, with one copy, when there is none or it is full or taken)."""
    have = (state.fine.shape[2], state.coarse.shape[2])
    room = state.room
    if (not isinstance(room, KernelRoom) or room.ends != have
            or need[0] > room.fine.shape[2] or need[1] > room.coarse.shape[2]):
        room = reserve_room(state, need).room
    native = kernels_or_none() if means is kernel_means else None
    for buf, n_have, n_need, (kernel, stride) in zip((room.fine, room.coarse), have, need,
                                                     _kernel_shapes(config)):
        if n_need > n_have:
            into = buf[:, :, n_have:n_need]
            if native is None or not native.kernel_means_into(k, kernel, stride, n_have, into):
                into.copy_(means(k, kernel, stride, n_have, n_need - n_have))
    room.ends = need
    return CompressedKeys(fine=room.fine[:, :, :need[0]], coarse=room.coarse[:, :, :need[1]],
                          length=k.shape[2], room=room)


def compress_keys(k: Tensor, config: SparseConfig, *, means=kernel_means) -> CompressedKeys:
    """Fine and coarse compressed keys of the whole cache k [B, Hkv, S, D].

    `means`: `kernel_means` of another array library with the same signature (the MLX runtime
    passes its own), so every implementation shares this bookkeeping."""
    s = k.shape[2]
    fine, coarse = (means(k, kernel, stride, 0, n_kernels(s, kernel, stride))
                    for kernel, stride in _kernel_shapes(config))
    return CompressedKeys(fine=fine, coarse=coarse, length=s)


def update_compressed(k: Tensor, config: SparseConfig, state: CompressedKeys | None = None, *,
                      means=kernel_means, cat=None) -> CompressedKeys:
    """Bring `state` up to the cache k [B, Hkv, S, D]: only kernels completed by the keys after
    state.length are computed (from the cache itself); None compresses the whole cache.

    Returns a new CompressedKeys; the incoming one's kernels are never modified, and when no kernel
    completes (15 of 16 decode steps) the same tensors are returned without a copy. With torch
    tensors (cat None) the new kernels are written into spare room behind the state (`KernelRoom`:
    a decode step costs O(new kernels), not a copy of the state). `means` / `cat(old, new)`
    (concatenation along the kernel axis): another array library's (see compress_keys).
    """
    if state is None:
        return compress_keys(k, config, means=means)
    s = k.shape[2]
    if state.length > s:
        raise ValueError(f"CompressedKeys covers {state.length} keys but the cache holds only {s}")
    have = (state.fine.shape[2], state.coarse.shape[2])
    need = []
    for n_have, (kernel, stride) in zip(have, _kernel_shapes(config)):
        if n_have != n_kernels(state.length, kernel, stride):
            raise ValueError(f"CompressedKeys holds {n_have} kernels of size {kernel}, not "
                             f"the {n_kernels(state.length, kernel, stride)} of {state.length} "
                             "keys; was it made with another sparse_config? pass state=None")
        need.append(n_kernels(s, kernel, stride))
    if have == tuple(need):
        return state if state.length == s else CompressedKeys(state.fine, state.coarse, s,
                                                              state.room)
    if cat is None:
        return _append_in_place(k, config, state, tuple(need), means)
    fine, coarse = (old if n_need == n_have else
                    cat(old, means(k, kernel, stride, n_have, n_need - n_have))
                    for old, n_have, n_need, (kernel, stride)
                    in zip((state.fine, state.coarse), have, need, _kernel_shapes(config)))
    return CompressedKeys(fine=fine, coarse=coarse, length=s)
