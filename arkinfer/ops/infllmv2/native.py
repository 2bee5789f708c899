"""The C decode step (`decode_kernel.c`), built on first use; decode.py runs torch otherwise.

One call does a whole sparse decode step for every KV head: block selection (stage 1) and
block-sparse attention (stage 2), reading the selected KV rows in place, on torch's thread count.
It is compiled once per machine with the system C compiler into ~/.cache/arkinfer/kernels (a file
name keyed by the sources and the flags, written atomically, so concurrent processes are safe),
with -fopenmp where the compiler supports it: the library then uses the libgomp that torch has
already loaded (same soname), i.e. torch's own thread pool, so the two never oversubscribe the
cores. When no compiler is found, the build fails, the CPU lacks AVX2/FMA or ARKINFER_NATIVE=0 is
set, `kernels()` returns None and decode uses the pure-torch path: both are held to the same
conformance suite.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor

from arkinfer.native_build import NativeBuildError, load_library
from arkinfer.ops.infllmv2.common import CompressedKeys, n_kernels
from arkinfer.ops.infllmv2.config import COARSE_FACTOR, SparseConfig

__all__ = ["DecodePlan", "NativeKernels", "describe", "kernels", "torch_only"]

_SOURCES = [Path(__file__).with_name(n) for n in ("decode_kernel.c", "decode_simd.h", "decode_amx.h")]
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}   # enum of decode_simd.h
_D_MULTIPLE = 16         # head_dim must be a multiple of this
_loaded: list[NativeKernels | None] = []
_off: list[bool] = [False]   # torch_only() in force
_workspace = threading.local()   # per calling thread: a float32 tensor the kernel carves up

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p


class DecodeArgs(ctypes.Structure):
    """`ark_decode_args` of decode_kernel.c, field for field (strides in elements)."""

    _fields_ = [(n, _I64) for n in ("batch", "kv_heads", "group", "head_dim")] + [
        ("q_sel", _PTR), *[(n, _I64) for n in ("q_sel_dtype", "q_sel_sb", "q_sel_sh")],
        ("q", _PTR), *[(n, _I64) for n in ("q_dtype", "q_sb", "q_sh")],
        ("scale", ctypes.c_double),
        ("fine", _PTR), *[(n, _I64) for n in ("fine_sb", "fine_sh", "fine_sr", "n1")],
        ("coarse", _PTR), *[(n, _I64) for n in ("coarse_sb", "coarse_sh", "coarse_sr", "n2")],
        ("k", _PTR), ("v", _PTR),
        *[(n, _I64) for n in ("kv_dtype", "k_sb", "k_sh", "k_sr", "v_sb", "v_sh", "v_sr")],
        *[(n, _I64) for n in ("cache_len", "block_size", "init_blocks", "local_blocks", "topk",
                              "kernels_per_block", "coarse_factor", "coarse_step")],
        ("idx", _PTR), ("out", _PTR), ("out_dtype", _I64),
        ("work", _PTR), ("work_floats", _I64), ("threads", _I64)]


class MeansArgs(ctypes.Structure):
    """`ark_means_args` of decode_kernel.c (strides in elements)."""

    _fields_ = [("k", _PTR), *[(n, _I64) for n in ("k_dtype", "k_sb", "k_sh", "k_sr", "batch",
                                                    "heads", "head_dim", "kernel", "stride",
                                                    "first", "count")],
                ("out", _PTR), *[(n, _I64) for n in ("out_sb", "out_sh", "out_sr")]]


_ERRORS = {-1: "head_dim must be a multiple of 16 and the group >= 1",
           -2: "tensors must be float32, bfloat16 or float16",
           -3: "not a sparse decode step (too few blocks), or block ids reach 2^24",
           -4: "more selected rows than one step can merge"}


class NativeKernels:
    """ctypes binding of `ark_decode` (contract in decode_kernel.c)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._decode = lib.ark_decode
        self._decode.argtypes = [ctypes.POINTER(DecodeArgs)]
        self._decode.restype = _I64
        lib.ark_decode_threaded.restype = _I64
        self.threaded = bool(lib.ark_decode_threaded())   # built with OpenMP
        self._set_zmm = lib.ark_set_zmm
        self._set_zmm.argtypes, self._set_zmm.restype = [_I64], _I64
        self._set_amx = lib.ark_set_amx
        self._set_amx.argtypes, self._set_amx.restype = [_I64], _I64
        if os.environ.get("ARKINFER_AMX", "1") == "0":   # the AVX path's bits for bf16 too
            self.use_amx(False)
        self._means = lib.ark_kernel_means
        self._means.argtypes = [ctypes.POINTER(MeansArgs)]
        self._means.restype = _I64

    def use_avx512(self, on: bool | None = None) -> bool:
        """Whether the AVX-512 tiles (groups of more than 4 heads) run; `on` switches them (True
        only takes effect on a CPU with AVX-512F). Same bits either way."""
        return bool(self._set_zmm(-1 if on is None else int(on)))

    def use_amx(self, on: bool | None = None) -> bool:
        """Whether stage 2 of a bf16 step (bf16 cache and query, head_dim a multiple of 32) runs
        on AMX tiles; `on` switches them (True only takes effect on a CPU with AMX-BF16 whose OS
        grants the tile state). Not the same bits as the AVX path: the scores sum in another
        order and the weights enter as two bf16 parts (docs/infllmv2.md §10)."""
        return bool(self._set_amx(-1 if on is None else int(on)))

    def kernel_means_into(self, k: Tensor, kernel: int, stride: int, first: int,
                          out: Tensor) -> bool:
        """out [B, H, count, D] fp32 (rows contiguous) = compress.kernel_means(k, kernel, stride,
        first, count), bit for bit, for a CPU cache k [B, H, S, D]. False (nothing written) where
        the C code does not take the tensors (head_dim not a multiple of 8, other dtypes)."""
        if (k.shape[3] % 8 or not k.is_cpu or k.dtype not in _DTYPES or k.stride(-1) != 1
                or out.dtype != torch.float32 or out.stride(-1) != 1 or not out.is_cpu):
            return False
        b, h, count, d = out.shape
        args = MeansArgs(k.data_ptr(), _DTYPES[k.dtype], k.stride(0), k.stride(1), k.stride(2),
                         b, h, d, kernel, stride, first, count,
                         out.data_ptr(), out.stride(0), out.stride(1), out.stride(2))
        return self._means(ctypes.byref(args)) == 0

    @staticmethod
    def supports(d: int, *tensors: Tensor) -> bool:
        """CPU tensors of a supported dtype whose rows (last dim) are contiguous, head_dim a
        multiple of 16 (compressed keys, when among the tensors, are always fp32). Every GQA
        group size is supported."""
        return d % _D_MULTIPLE == 0 and all(
            t.is_cpu and t.dtype in _DTYPES and t.stride(-1) == 1 for t in tensors)

    def decode(self, q_sel: Tensor, q: Tensor | None, keys: CompressedKeys, k: Tensor | None,
               v: Tensor | None, *, config: SparseConfig, scale: float, cache_len: int,
               idx: Tensor, out: Tensor | None) -> None:
        """One sparse decode step for all B * Hkv heads.

        q_sel [B, Hq, 1, D] selects the blocks (with the compressed keys `keys`); q attends to
        k / v [B, Hkv, cache_len + 1, D] (same dtype). Writes idx int64 [B, Hkv, 1, budget]
        (contiguous) and out [B, Hq, 1, D] (contiguous, any supported dtype). With q, k, v and
        out None, stage 1 only: just idx."""
        self.call(_decode_args(q_sel, q, keys, k, v, config, scale, cache_len, idx, out),
                  q_sel, cache_len, keys)

    def call(self, args: DecodeArgs, q_sel: Tensor, cache_len: int, keys: CompressedKeys
             ) -> None:
        """Run ark_decode on filled-in arguments (the workspace is this module's, per thread)."""
        work = getattr(_workspace, "buf", None)
        args.work, args.work_floats = (None, 0) if work is None else (work.data_ptr(),
                                                                      work.numel())
        rc = self._decode(ctypes.byref(args))
        if rc > 0:    # the workspace is too small: grow it (rarely: it only grows with the cache)
            work = _workspace.buf = torch.empty(rc + rc // 4, dtype=torch.float32)
            args.work, args.work_floats = work.data_ptr(), work.numel()
            rc = self._decode(ctypes.byref(args))
        if rc:
            raise ValueError(f"ark_decode: {_ERRORS.get(rc, rc)} (q {tuple(q_sel.shape)}, "
                             f"cache_len {cache_len}, fine keys {tuple(keys.fine.shape)})")


def _decode_args(q_sel: Tensor, q: Tensor | None, keys: CompressedKeys, k: Tensor | None,
                 v: Tensor | None, config: SparseConfig, scale: float, cache_len: int,
                 idx: Tensor, out: Tensor | None) -> DecodeArgs:
    """ark_decode_args for NativeKernels.decode (same arguments)."""
    b, hq, _, d = q_sel.shape
    hkv = keys.fine.shape[1]
    fine, coarse = keys.fine, keys.coarse
    step = config.kernel_size // config.kernel_stride
    if config.kernel_size % config.kernel_stride:
        step = 0        # the coarse logits are not means of fine ones: score Kc2
    attend = out is not None
    q2, k2, v2 = (q, k, v) if attend else (q_sel, q_sel, q_sel)
    return DecodeArgs(
        b, hkv, hq // hkv, d,
        q_sel.data_ptr(), _DTYPES[q_sel.dtype], q_sel.stride(0), q_sel.stride(1),
        q2.data_ptr(), _DTYPES[q2.dtype], q2.stride(0), q2.stride(1),
        scale,
        fine.data_ptr(), fine.stride(0), fine.stride(1), fine.stride(2), fine.shape[2],
        coarse.data_ptr(), coarse.stride(0), coarse.stride(1), coarse.stride(2),
        coarse.shape[2],
        k2.data_ptr() if attend else None, v2.data_ptr() if attend else None,
        _DTYPES[k2.dtype], k2.stride(0), k2.stride(1), k2.stride(2),
        v2.stride(0), v2.stride(1), v2.stride(2),
        cache_len, config.block_size, config.init_blocks, config.local_blocks, config.topk,
        config.kernels_per_block, COARSE_FACTOR, step,
        idx.data_ptr(), out.data_ptr() if attend else None,
        _DTYPES[out.dtype] if attend else 0,
        None, 0, torch.get_num_threads())


class DecodePlan:
    """One layer's decode-step arguments, built once and kept on its compressed-key buffers
    (`KernelRoom.plan`), so a step fills in only what changes: the query pointers, the cache
    length, the kernel counts and the outputs. `fits` says whether this step's tensors are the
    ones it was built for (same cache buffers, strides, dtypes, shapes, config, scale, threads);
    a cache that moves (grown by concatenation) simply builds a new plan each step."""

    def __init__(self, native: NativeKernels, q_sel: Tensor, q: Tensor, keys: CompressedKeys,
                 k: Tensor, v: Tensor, config: SparseConfig, scale: float) -> None:
        self.native, self.key = native, _plan_key(q_sel, q, keys, k, v, config, scale)
        self.same_q = q_sel is q
        self.idx_shape = (q.shape[0], k.shape[1], 1, config.budget)
        self.args: DecodeArgs | None = None
        # what `step` compares: `key`'s fields, kept apart so a step checks them in a few compares
        self.config, self.scale, self.threads = config, scale, torch.get_num_threads()
        self.q_layout = (q.shape, q.stride(), q.dtype)
        self.kv_layout = (k.data_ptr(), k.stride(), v.data_ptr(), v.stride(), k.dtype, v.dtype)
        self.kv_rows = (k.shape[0], k.shape[1], k.shape[3])
        self.keys_layout = _keys_layout(keys)
        self.kernels = ((config.kernel_size, config.kernel_stride),
                        (config.coarse_kernel_size, config.coarse_kernel_stride))

    def step(self, q: Tensor, k: Tensor, v: Tensor, state: CompressedKeys, config: SparseConfig,
             scale: float, cache_len: int) -> tuple[Tensor, CompressedKeys, Tensor] | None:
        """`infllmv2_attention`'s sparse decode step (the caller checked that it is one) for the
        layer this plan belongs to (state.room's plan, q_sel None), when the step can run as
        built: (out, keys, idx) as that function returns them, or None, and the caller takes the
        general path (every argument checked, readable errors). It holds when nothing changed but
        q's data and the cache length: the same config, scale, threads, q layout and cache
        buffers, k / v holding cache_len + 1 rows, and a state no longer than the cache that
        needs no new kernel (15 steps in 16; the 16th computes one through
        `update_compressed`). A handful of comparisons, then the one C call (docs/infllmv2.md
        §10 gives the time it saves)."""
        total = cache_len + 1
        if (not self.same_q or (config is not self.config and config != self.config)
                or scale != self.scale or state.length > total
                or (q.shape, q.stride(), q.dtype) != self.q_layout
                or (k.data_ptr(), k.stride(), v.data_ptr(), v.stride(), k.dtype, v.dtype)
                != self.kv_layout
                or k.shape != (*self.kv_rows[:2], total, self.kv_rows[2]) or v.shape != k.shape
                or torch.get_num_threads() != self.threads):
            return None
        (fk, fs), (ck, cs) = self.kernels
        if (_keys_layout(state) != self.keys_layout
                or state.fine.shape[2] != n_kernels(total, fk, fs)
                or state.coarse.shape[2] != n_kernels(total, ck, cs)):
            return None
        keys = state if state.length == total else CompressedKeys(state.fine, state.coarse, total,
                                                                  state.room)
        out, idx = self.run(q, q, keys, k, v, config, scale, cache_len)
        return out, keys, idx

    def fits(self, q_sel: Tensor, q: Tensor, keys: CompressedKeys, k: Tensor, v: Tensor,
             config: SparseConfig, scale: float) -> bool:
        return _plan_key(q_sel, q, keys, k, v, config, scale) == self.key

    def run(self, q_sel: Tensor, q: Tensor, keys: CompressedKeys, k: Tensor, v: Tensor,
            config: SparseConfig, scale: float, cache_len: int) -> tuple[Tensor, Tensor]:
        """(out [B, Hq, 1, D] in q.dtype, idx int64 [B, Hkv, 1, budget]) of one step."""
        out = torch.empty(q.shape, dtype=q.dtype)
        idx = torch.empty(self.idx_shape, dtype=torch.int64)
        a = self.args
        if a is None:
            a = self.args = _decode_args(q_sel, q, keys, k, v, config, scale, cache_len, idx, out)
        else:
            a.q_sel = q_sel.data_ptr()
            a.q = a.q_sel if self.same_q else q.data_ptr()
            a.n1, a.n2, a.cache_len = keys.fine.shape[2], keys.coarse.shape[2], cache_len
            a.idx, a.out = idx.data_ptr(), out.data_ptr()
        self.native.call(a, q_sel, cache_len, keys)
        return out, idx


def _keys_layout(keys: CompressedKeys) -> tuple:
    """Where the compressed keys live (a state's are leading views of its room's buffers)."""
    return (keys.fine.data_ptr(), keys.fine.stride(), keys.coarse.data_ptr(),
            keys.coarse.stride())


def _plan_key(q_sel: Tensor, q: Tensor, keys: CompressedKeys, k: Tensor, v: Tensor,
              config: SparseConfig, scale: float) -> tuple:
    """What a DecodePlan's fixed arguments depend on (not: q's data, the cache length)."""
    return (q_sel.shape, q_sel.stride(), q_sel.dtype, q_sel is q, q.shape, q.stride(), q.dtype,
            k.data_ptr(), k.stride(), k.dtype, v.data_ptr(), v.stride(), v.dtype,
            _keys_layout(keys), config, scale, torch.get_num_threads())


def kernels() -> NativeKernels | None:
    """The compiled kernels, or None (no compiler, build failed, ARKINFER_NATIVE=0, or inside
    `torch_only()`)."""
    if _off[0] or os.environ.get("ARKINFER_NATIVE", "1") == "0":
        return None
    if not _loaded:
        _loaded.append(_build_and_load())
    return _loaded[0]


def describe() -> dict[str, object]:
    """What a sparse decode step runs on in this process (`arkinfer doctor` prints it): the C
    kernel, with its threads and tiles, or the pure-torch path and why."""
    if os.environ.get("ARKINFER_NATIVE", "1") == "0":
        return {"path": "torch", "why": "ARKINFER_NATIVE=0"}
    native = kernels()
    if native is None:
        return {"path": "torch", "why": "the C kernel did not build here or this CPU lacks "
                                        "AVX2 / FMA (a RuntimeWarning says which)"}
    return {"path": "C kernel", "openmp": native.threaded, "avx512": native.use_avx512(),
            "amx_bf16": native.use_amx()}


@contextmanager
def torch_only() -> Iterator[None]:
    """Run the pure-torch path inside the block (tests hold both paths to the same suite)."""
    saved, _off[0] = _off[0], True
    try:
        yield
    finally:
        _off[0] = saved


def _build_and_load() -> NativeKernels | None:
    """Compile (once) and load the kernels; None where they cannot run (no AVX2/FMA CPU)."""
    try:
        lib = load_library("infllmv2_decode", _SOURCES, openmp=True)
    except NativeBuildError as exc:
        warnings.warn(f"InfLLM v2 C decode kernels unavailable ({exc}); using the torch path",
                      RuntimeWarning, stacklevel=3)
        return None
    return None if lib is None else NativeKernels(lib)
