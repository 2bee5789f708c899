"""ctypes bindings of libarkinfer_kernels.so (arkinfer_kernels.h) on torch CUDA tensors.

Layouts (one sequence, batch 1): q [Hq, D]; k, v [Hkv, cap, D] (the first `length` rows valid);
compressed keys fp32 [Hkv, n_cap, D]; Marlin x fp16 [m, K], B int32 [K/16, 2N], s fp16 [G, N].
Every call runs on torch's current stream; a non-zero cudaError_t raises RuntimeError.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

import torch
from arkinfer.backends.tensorrt.kernels.build import library_path
from torch import Tensor

from arkinfer.ops.infllmv2.common import n_kernels
from arkinfer.ops.infllmv2.config import SparseConfig

__all__ = ["CudaKernels", "load"]

_P, _I, _L, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_float
_DTYPES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}   # arkinfer_kernels.h
_SIGNATURES = {
    "arkinfer_marlin_gemm": (_P, _P, _P, _P, _I, _I, _I, _I, _P),
    "arkinfer_infllmv2_compress": (_P, _I, _I, _I, _L, _I, _I, _I, _I, _P, _L, _P),
    "arkinfer_infllmv2_workspace_bytes": (_I, _I, _I, _I, _I, _I, _I, _I),
    "arkinfer_infllmv2_select": (_P, _I, _P, _L, _P, _L, _I, _I, _I, _I, _I, _I, _I, _I, _I, _I,
                                 _F, _P, _P, _P),
    "arkinfer_infllmv2_sparse_decode": (_P, _P, _P, _I, _L, _P, _I, _I, _I, _I, _I, _I, _F, _P,
                                        _P, _P),
}


def _ptr(t: Tensor) -> int:
    if not t.is_cuda or not t.is_contiguous():
        raise ValueError(f"expected a contiguous CUDA tensor, got {t.device} {tuple(t.shape)}")
    return t.data_ptr()


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


class CudaKernels:
    """The C entry points as methods taking torch tensors (see arkinfer_kernels.h)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        for name, args in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = list(args)
            fn.restype = ctypes.c_size_t if name.endswith("_bytes") else ctypes.c_int

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} returned cudaError_t {rc}")

    def marlin_gemm(self, x: Tensor, b: Tensor, s: Tensor, group_size: int) -> Tensor:
        """x fp16 [m, K] @ Marlin (B, s) -> fp16 [m, N]."""
        m, k = x.shape
        n = b.shape[1] // 2
        y = torch.empty(m, n, dtype=torch.float16, device=x.device)
        self._check(self.lib.arkinfer_marlin_gemm(_ptr(x), _ptr(b), _ptr(s), _ptr(y), m, n, k,
                                                  group_size, _stream()), "arkinfer_marlin_gemm")
        return y

    def compress(self, k: Tensor, old_len: int, new_len: int, kernel: int, stride: int,
                 out: Tensor) -> None:
        """Write kernels n(old_len) .. n(new_len) - 1 of k [Hkv, cap, D] into out fp32."""
        hkv, cap, d = k.shape
        self._check(self.lib.arkinfer_infllmv2_compress(
            _ptr(k), _DTYPES[k.dtype], hkv, d, cap * d, old_len, new_len, kernel, stride,
            _ptr(out), out.shape[1] * d, _stream()), "arkinfer_infllmv2_compress")

    def compress_all(self, k: Tensor, length: int, config: SparseConfig) -> tuple[Tensor, Tensor]:
        """Fine and coarse kernels of the first `length` keys: fp32 [Hkv, n1, D], [Hkv, n2, D]."""
        hkv, _, d = k.shape
        out = []
        for kernel, stride in ((config.kernel_size, config.kernel_stride),
                               (config.coarse_kernel_size, config.coarse_kernel_stride)):
            buf = torch.zeros(hkv, max(n_kernels(length, kernel, stride), 1), d,
                              dtype=torch.float32, device=k.device)
            self.compress(k, 0, length, kernel, stride, buf)
            out.append(buf[:, :n_kernels(length, kernel, stride)])
        return out[0], out[1]

    def workspace(self, hq: int, hkv: int, d: int, length: int, config: SparseConfig,
                  device: torch.device, budget: int | None = None) -> Tensor:
        """Device workspace for select/sparse_decode up to `length` keys and `budget` idx slots
        (default config.budget)."""
        size = self.lib.arkinfer_infllmv2_workspace_bytes(
            hq, hkv, d, length, config.kernel_size, config.kernel_stride, config.block_size,
            budget or config.budget)
        return torch.empty(size, dtype=torch.uint8, device=device)

    def select(self, q: Tensor, fine: Tensor, coarse: Tensor, length: int, config: SparseConfig,
               scale: float, workspace: Tensor) -> Tensor:
        """q [Hq, D], fine/coarse fp32 [Hkv, n_cap, D] (contiguous) -> idx int32 [Hkv, budget]."""
        hq, d = q.shape
        hkv = fine.shape[0]
        idx = torch.empty(hkv, config.budget, dtype=torch.int32, device=q.device)
        self._check(self.lib.arkinfer_infllmv2_select(
            _ptr(q), _DTYPES[q.dtype], _ptr(fine), fine.shape[1] * d, _ptr(coarse),
            coarse.shape[1] * d, hq, hkv, d, length, config.kernel_size, config.kernel_stride,
            config.block_size, config.init_blocks, config.local_blocks, config.budget, scale,
            _ptr(idx), _ptr(workspace), _stream()), "arkinfer_infllmv2_select")
        return idx

    def sparse_decode(self, q: Tensor, k: Tensor, v: Tensor, idx: Tensor, length: int,
                      config: SparseConfig, scale: float, workspace: Tensor) -> Tensor:
        """q [Hq, D], k/v [Hkv, cap, D], idx int32 [Hkv, budget] -> out [Hq, D] (q's dtype)."""
        hq, d = q.shape
        hkv, cap, _ = k.shape
        out = torch.empty_like(q)
        self._check(self.lib.arkinfer_infllmv2_sparse_decode(
            _ptr(q), _ptr(k), _ptr(v), _DTYPES[q.dtype], cap * d, _ptr(idx), hq, hkv, d, length,
            config.block_size, idx.shape[1], scale, _ptr(out), _ptr(workspace), _stream()),
            "arkinfer_infllmv2_sparse_decode")
        return out


@lru_cache(maxsize=1)
def load() -> CudaKernels:
    """Build (once per machine, needs nvcc) and load the kernels library."""
    return CudaKernels(ctypes.CDLL(str(library_path())))
