"""ArkInfer's fast CPU InfLLM v2 (torch, plus C decode kernels): what the reference model and host
runners call.

Three variants: as shipped (the C decode kernels where they apply), pure torch (the fallback on
machines without a C compiler or AVX2), and with torch's private CPU flash-attention op unavailable
(older or future torch builds), which routes the prefill band through plain matmuls.
"""

from contextlib import contextmanager

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


IMPLS = [
    Infllmv2Impl("fast_cpu", infllmv2_attention, stage2=block_sparse_attention),
    Infllmv2Impl("fast_cpu_torch", _torch_only_attention, heavy=False),
    Infllmv2Impl("fast_cpu_no_flash", _no_flash_attention, stage2=_no_flash_stage2, heavy=False),
]
