"""Optional C kernels for the decode path (`decode_kernel.c`), built on first use; torch otherwise.

The kernels read the selected KV blocks in place (no gather copy) and keep the GQA group's
accumulators in registers, which torch cannot do in a few ops. They are compiled once per machine
with the system C compiler into ~/.cache/arkinfer/kernels (a file name keyed by the source and the
flags, written atomically, so concurrent processes are safe). When no compiler is found, the build
fails, or ARKINFER_NATIVE=0 is set, `kernels()` returns None and decode uses the pure-torch path:
both are held to the same conformance suite.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["NativeKernels", "kernels", "torch_only"]

_SOURCE = Path(__file__).with_name("decode_kernel.c")
_GROUPS = (8, 16)        # query heads per KV head the kernels support
_D_MULTIPLE = 16         # head_dim must be a multiple of this
_loaded: list[NativeKernels | None] = []
_off: list[bool] = [False]   # torch_only() in force


class NativeKernels:
    """ctypes bindings of `ark_scores` / `ark_pv` (see decode_kernel.c for the contracts)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
        self._scores, self._pv = lib.ark_scores, lib.ark_pv
        self._scores.argtypes = [ptr, c_int, i64, ptr, i64, ptr, i64, i64, i64, i64, ptr, i64]
        self._pv.argtypes = [ptr, c_int, i64, ptr, i64, i64, ptr, i64, i64, i64, i64, ptr]
        self._scores.restype = self._pv.restype = c_int

    @staticmethod
    def supports(group: int, d: int, *tensors: Tensor) -> bool:
        """fp32 CPU tensors whose rows (last dim) are contiguous, a supported group and head_dim."""
        return (group in _GROUPS and d % _D_MULTIPLE == 0
                and all(t.dtype == torch.float32 and t.device.type == "cpu" and t.stride(-1) == 1
                        for t in tensors))

    def scores(self, q_t: Tensor, rows: Tensor, blocks: Tensor, block_size: int, tail0: int,
               n_tail: int, out: Tensor) -> None:
        """out [G, N] = q . row for the rows of `blocks` then rows tail0 .. tail0 + n_tail - 1.
        q_t [D, G] contiguous (scaled queries, transposed), rows [S, D] (row stride any),
        blocks int64 contiguous, out contiguous fp32 with N >= len(blocks) * bs + n_tail."""
        d, group = q_t.shape
        rc = self._scores(q_t.data_ptr(), group, d, rows.data_ptr(), rows.stride(0),
                          blocks.data_ptr(), blocks.numel(), block_size, tail0, n_tail,
                          out.data_ptr(), out.shape[1])
        _check(rc, "ark_scores", group, d)

    def pv(self, probs: Tensor, rows: Tensor, blocks: Tensor, block_size: int, tail0: int,
           n_tail: int, out: Tensor) -> None:
        """out [G, D] = probs [G, N] @ the same rows as `scores` (probs rows contiguous)."""
        group = probs.shape[0]
        rc = self._pv(probs.data_ptr(), group, probs.stride(0), rows.data_ptr(), rows.stride(0),
                      rows.shape[1], blocks.data_ptr(), blocks.numel(), block_size, tail0,
                      n_tail, out.data_ptr())
        _check(rc, "ark_pv", group, rows.shape[1])


def _check(rc: int, name: str, group: int, d: int) -> None:
    if rc:
        raise ValueError(f"{name}: group {group} / head_dim {d} not supported by the C kernel "
                         f"(group in {_GROUPS}, head_dim a multiple of {_D_MULTIPLE})")


def kernels() -> NativeKernels | None:
    """The compiled kernels, or None (no compiler, build failed, ARKINFER_NATIVE=0, or inside
    `torch_only()`)."""
    if _off[0] or os.environ.get("ARKINFER_NATIVE", "1") == "0":
        return None
    if not _loaded:
        _loaded.append(_build_and_load())
    return _loaded[0]


@contextmanager
def torch_only() -> Iterator[None]:
    """Run the pure-torch path inside the block (tests hold both paths to the same suite)."""
    saved, _off[0] = _off[0], True
    try:
        yield
    finally:
        _off[0] = saved


_FLAGS = ["-O3", "-fPIC", "-shared", "-std=c99", "-mavx2", "-mfma"]


def _build_and_load() -> NativeKernels | None:
    """Compile (once) and load the kernels; None where they cannot run (no AVX2/FMA CPU)."""
    if platform.machine() not in ("x86_64", "AMD64") or \
            torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not _SOURCE.is_file():
        return None
    source = _SOURCE.read_bytes()
    flags = _FLAGS
    key = hashlib.sha256(source + " ".join([compiler, *flags]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "arkinfer" / \
        "kernels"
    lib_path = cache / f"infllmv2_decode_{key}.so"
    try:
        if not lib_path.exists():
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                built = Path(tmp) / lib_path.name
                subprocess.run([compiler, *flags, str(_SOURCE), "-o", str(built)], check=True,
                               capture_output=True, timeout=120)
                os.replace(built, lib_path)
        return NativeKernels(ctypes.CDLL(str(lib_path)))
    except (OSError, subprocess.SubprocessError) as exc:
        warnings.warn(f"InfLLM v2 C decode kernels unavailable ({exc}); using the torch path",
                      RuntimeWarning, stacklevel=3)
        return None
