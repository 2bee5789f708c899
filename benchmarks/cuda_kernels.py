"""CUDA kernels (backends/tensorrt/kernels) on a GPU: InfLLM v2 decode attention vs dense SDPA, and
W4A16 GEMV over Marlin bytes vs torch fp16 matmul; achieved bandwidth vs a measured device copy.

Decode attention: one MiniCPM4.1-8B layer (32 query heads, 2 KV heads, head_dim 128, bf16, its
sparse_config with dense_len -1) at 32K and 128K context. Dense = torch SDPA of the 16 query heads
of each KV group against that head's whole cache (each KV head read once). InfLLM v2 = the
incremental compression of the new key + stage 1 (select) + stage 2 (sparse_decode), every call.
W4A16: K x N (in_features x out_features) 4096x4096, 4096x16384, 16384x4096, batch 1 (and 16),
group size 128. Every timed call runs after a 256 MiB read that evicts L2 (a real decode step
reads other layers' weights in between; a write would leave dirty lines whose write-back the timed
call would pay); times are CUDA-event medians of CUDA-graph replays (the
GPU's time; the attention rows also give the eager time of Python launching each call).

    .venv/bin/python benchmarks/cuda_kernels.py [--out benchmarks/results/cuda_kernels.json]

Exits with status 2 and a message when no CUDA GPU (or no nvcc) is present.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from arkinfer.backends.tensorrt.kernels import build
from machine import machine_info

from arkinfer.ops.infllmv2 import SparseConfig

HQ, HKV, D = 32, 2, 128
CONTEXTS = (32768, 131072)
GEMV_SHAPES = ((4096, 4096), (4096, 16384), (16384, 4096))
GROUP = 128


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path,
                   default=Path(__file__).parent / "results" / "cuda_kernels.json")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--batches", default="1,16", help="W4A16 token batches")
    return p.parse_args(argv)


class Timer:
    """CUDA-event time of fn() in ms, median over iters, L2 evicted (by a read) before each call.

    graph=True (the default) replays fn captured once as a CUDA graph, so the time is the GPU's
    alone; graph=False calls fn from Python each time, so a call that launches small kernels also
    pays the ctypes/torch launch overhead (what an eager Python caller sees). Falls back to eager
    (and says so in `self.fallbacks`) where capture fails."""

    def __init__(self, iters: int) -> None:
        self.iters = iters
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        self.fallbacks: list[str] = []

    def _captured(self, fn: Callable[[], object]) -> Callable[[], object]:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):        # warm-up off the default stream, as torch asks
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay

    def __call__(self, fn: Callable[[], object], graph: bool = True) -> float:
        run = fn
        if graph:
            try:
                run = self._captured(fn)
            except RuntimeError as e:
                self.fallbacks.append(f"{getattr(fn, '__name__', fn)}: {e}".splitlines()[0])
        for _ in range(3):
            run()
        times = []
        for _ in range(self.iters):
            self.flush.sum(dtype=torch.int64)   # read 256 MiB: L2 holds other (clean) data
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)


def copy_bandwidth(timer: Timer) -> float:
    """Device-to-device copy of 1 GiB: GB/s counting the read and the write."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), graph=False)
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def attention_row(kern, timer: Timer, length: int) -> dict:
    cfg = SparseConfig(dense_len=-1)
    scale = 1.0 / math.sqrt(D)
    gen = torch.Generator(device="cuda").manual_seed(length)
    q = torch.randn(HQ, D, device="cuda", generator=gen).bfloat16()
    k = torch.randn(HKV, length, D, device="cuda", generator=gen).bfloat16()
    v = torch.randn(HKV, length, D, device="cuda", generator=gen).bfloat16()
    fine, coarse = kern.compress_all(k, length, cfg)
    fine, coarse = fine.contiguous(), coarse.contiguous()
    ws = kern.workspace(HQ, HKV, D, length, cfg, torch.device("cuda"))
    qg = q.view(1, HKV, HQ // HKV, D)
    idx = kern.select(q, fine, coarse, length, cfg, scale, ws)

    def dense() -> torch.Tensor:
        return F.scaled_dot_product_attention(qg, k[None], v[None], scale=scale)

    def select() -> torch.Tensor:
        return kern.select(q, fine, coarse, length, cfg, scale, ws)

    def attend() -> torch.Tensor:
        return kern.sparse_decode(q, k, v, idx, length, cfg, scale, ws)

    def decode_step() -> torch.Tensor:
        kern.compress(k, length - 1, length, cfg.kernel_size, cfg.kernel_stride, fine)
        chosen = kern.select(q, fine, coarse, length, cfg, scale, ws)
        return kern.sparse_decode(q, k, v, chosen, length, cfg, scale, ws)

    dense_ms, sparse_ms = timer(dense), timer(decode_step)
    select_ms, attend_ms = timer(select), timer(attend)
    dense_eager_ms, sparse_eager_ms = timer(dense, graph=False), timer(decode_step, graph=False)
    # bytes a step must read: dense the whole cache; sparse the fine compressed keys (fp32) and
    # the selected blocks' K and V rows
    sparse_bytes = fine.numel() * 4 + 2 * HKV * cfg.budget * cfg.block_size * D * 2
    print(f"attention {length:>6}: dense {dense_ms:.3f} ms  infllmv2 {sparse_ms:.3f} ms "
          f"(select {select_ms:.3f}, attend {attend_ms:.3f})  x{dense_ms / sparse_ms:.2f}; "
          f"eager (Python launches) dense {dense_eager_ms:.3f} ms infllmv2 {sparse_eager_ms:.3f} ms")
    return {"context": length, "dense_sdpa_ms": dense_ms, "infllmv2_ms": sparse_ms,
            "select_ms": select_ms, "sparse_attention_ms": attend_ms,
            "speedup": dense_ms / sparse_ms,
            "dense_eager_ms": dense_eager_ms, "infllmv2_eager_ms": sparse_eager_ms,
            "speedup_eager": dense_eager_ms / sparse_eager_ms,
            "dense_GBps": 2 * k.numel() * 2 / (dense_ms * 1e-3) / 1e9,
            "infllmv2_GBps": sparse_bytes / (sparse_ms * 1e-3) / 1e9}


def gemv_row(kern, timer: Timer, b: torch.Tensor, s: torch.Tensor, w16: torch.Tensor, m: int,
             copy_gbps: float) -> dict:
    """One W4A16 row: b/s the Marlin tensors, w16 the same weight dequantised fp16 [k, n]."""
    k, n = w16.shape
    x = torch.randn(m, k, device="cuda").half()
    y = kern.marlin_gemm(x, b, s, GROUP)
    ref = x.float() @ w16.float()
    err = float((y.float() - ref).abs().max() / ref.abs().max())
    w4_ms = timer(lambda: kern.marlin_gemm(x, b, s, GROUP))
    fp16_ms = timer(lambda: x @ w16)
    w4_bytes = b.numel() * 4 + s.numel() * 2 + x.numel() * 2 + m * n * 2
    gbps = w4_bytes / (w4_ms * 1e-3) / 1e9
    print(f"w4a16 {k}x{n} m={m}: {w4_ms * 1e3:.1f} us vs fp16 {fp16_ms * 1e3:.1f} us "
          f"x{fp16_ms / w4_ms:.2f}  {gbps:.0f} GB/s ({gbps / copy_gbps:.0%} of copy)  err {err:.1e}")
    return {"k": k, "n": n, "batch": m, "w4a16_ms": w4_ms, "fp16_ms": fp16_ms,
            "speedup": fp16_ms / w4_ms, "w4a16_GBps": gbps,
            "fp16_GBps": w16.numel() * 2 / (fp16_ms * 1e-3) / 1e9,
            "w4a16_fraction_of_copy": gbps / copy_gbps, "max_rel_err": err}


def gemv_rows(kern, timer: Timer, batches: list[int], copy_gbps: float) -> list[dict]:
    from arkinfer.quant.formats.marlin import MARLIN
    from arkinfer.quant.weight import QuantizedWeight
    rows = []
    rng = np.random.default_rng(0)
    for k, n in GEMV_SHAPES:
        groups = k // GROUP
        qw = QuantizedWeight(codes=rng.integers(0, 16, (n, k)).astype(np.uint8),
                             # Marlin stores fp16 scales: draw them fp16-representable
                             scales=(rng.random((n, groups)) * 0.02).astype(np.float16)
                             .astype(np.float32),
                             zeros=np.full((n, groups), 8, np.int32), bits=4, group_size=GROUP,
                             sym=True)
        packed = MARLIN.pack(qw)
        b = torch.from_numpy(np.ascontiguousarray(packed["B"])).cuda()
        s = torch.from_numpy(np.ascontiguousarray(packed["s"])).cuda()
        w16 = qw.dequantize().T.contiguous().half().cuda()            # [k, n] fp16
        rows.extend(gemv_row(kern, timer, b, s, w16, m, copy_gbps) for m in batches)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("cuda_kernels: no CUDA GPU here (torch.cuda.is_available() is False); run this on "
              "the device (H100/H200 or Jetson Orin).", file=sys.stderr)
        return 2
    if build.nvcc() is None:
        print("cuda_kernels: nvcc not found; set $NVCC or put the CUDA toolkit on PATH.",
              file=sys.stderr)
        return 2
    from arkinfer.backends.tensorrt.kernels.bindings import load
    kern = load()
    timer = Timer(args.iters)
    copy_gbps = copy_bandwidth(timer)
    print(f"{torch.cuda.get_device_name()}: measured copy {copy_gbps:.0f} GB/s")
    result = {
        "benchmark": "cuda_kernels",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "machine": machine_info(),
        "copy_GBps": copy_gbps,
        "attention": [attention_row(kern, timer, length) for length in CONTEXTS],
        "w4a16": gemv_rows(kern, timer, [int(b) for b in args.batches.split(",")], copy_gbps),
        "timing": "CUDA-graph replay (GPU time) unless listed in graph_fallbacks; *_eager_ms: "
                  "Python launches each call",
    }
    result["graph_fallbacks"] = timer.fallbacks
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
