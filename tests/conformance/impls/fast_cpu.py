"""ArkInfer's fast CPU InfLLM v2 (torch, plus C decode kernels): what the reference model and host
runners call.

Four variants: as shipped (the C decode step where it applies), pure torch (the fallback on
machines without a C compiler or AVX2), with torch's private CPU flash-attention op unavailable
(older or future torch builds), which routes the prefill band through plain matmuls, and with decode
steps on three threads (the suite runs one), so the C decode step splits every phase of a step
over threads (the suite's 1, 2 or 4 heads are not a multiple of 3) instead of giving each thread
whole heads.
"""

from contextlib import contextmanager

import torch

from infllmv2_checks import Infllmv2Impl

from arkinfer.ops.infllmv2 import (
    block_major,
    block_sparse_attention,
    infllmv2_attention,
)
from arkinfer.ops.infllmv2.native import torch_only


@contextmanager
def _without_flash():
    saved, block_major._flash = block_major._flash, None
    try:
        yield
    finally:
        block_major._flash = saved


def _no_flash_attention(*args, **kwargs):
    with _without_flash():
        return infllmv2_attention(*args, **kwargs)


def _no_flash_stage2(*args, **kwargs):
    with _without_flash():
        return block_sparse_attention(*args, **kwargs)


def _torch_only_attention(*args, **kwargs):
    with torch_only():
        return infllmv2_attention(*args, **kwargs)


def _three_threads_attention(q, *args, **kwargs):
    before = torch.get_num_threads()
    torch.set_num_threads(3 if q.shape[2] == 1 else before)
    try:
        return infllmv2_attention(q, *args, **kwargs)
    finally:
        torch.set_num_threads(before)


IMPLS = [
    Infllmv2Impl("fast_cpu", infllmv2_attention, stage2=block_sparse_attention),
    Infllmv2Impl("fast_cpu_torch", _torch_only_attention, heavy=False),
    Infllmv2Impl("fast_cpu_no_flash", _no_flash_attention, stage2=_no_flash_stage2, heavy=False),
    Infllmv2Impl("fast_cpu_threads", _three_threads_attention, heavy=False),
]
