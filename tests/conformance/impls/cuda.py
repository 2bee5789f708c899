"""The CUDA InfLLM v2 kernels (backends/tensorrt/kernels) via infllmv2_attention_cuda.

Runs only where a CUDA GPU and nvcc exist; elsewhere the suite reports it skipped with the reason.
"""

import torch
from infllmv2_checks import Infllmv2Impl

if not torch.cuda.is_available():
    raise ImportError("no CUDA GPU on this machine")

from arkinfer.backends.tensorrt.kernels import build  # noqa: E402

if build.nvcc() is None:
    raise ImportError("nvcc not found")

from arkinfer.backends.tensorrt.kernels.infllmv2_torch import (  # noqa: E402
    block_sparse_attention_cuda,
    infllmv2_attention_cuda,
)

IMPL = Infllmv2Impl("cuda", infllmv2_attention_cuda, dtypes=(torch.float32, torch.bfloat16),
                    tracks_memory=False, stage2=block_sparse_attention_cuda, heavy=False)
