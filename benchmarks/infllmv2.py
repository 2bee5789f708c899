"""InfLLM v2 vs dense attention on the CPU: one MiniCPM4.1-8B attention layer.

32 query heads, 2 KV heads, head_dim 128, MiniCPM4.1's sparse_config (with dense_len forced to -1 so
every row measures the sparse kernel; a model with dense_len=8192 runs dense below 8192 tokens).
Decode = one new query against the whole cache, the CompressedKeys state carried step to step
(mean over consecutive steps, so the one-in-16 kernel emission is amortised; each pass starts
from a state with spare room, as a decode past its first steps has, and one untimed step that
rebuilds what settling the caches evicted: its time is reported apart, `*_first_step_ms`).
Before every timed call the KV the call reads leaves every cache level (`--flush kv`, the
default: clflushopt over the K / V cache and the compressed keys), as in a model's decode loop,
where 31 other layers' KV and the weights pass through between two steps of one layer while the
interpreter, the kernel code and its workspace stay warm. `--flush llc` instead reads twice the
last-level cache (`--flush-mib`) before each call, evicting everything, the interpreter included
(a harsher condition: fixed per-call costs then read from DRAM too); it reads rather than
writes, since dirty lines left by a write would be written back during the timed call (an
earlier version wrote; that made the sparse steps 5-33 % slower).
`--flush none` keeps caches warm. Prefill = the whole sequence in one call. Dense baseline: torch
scaled_dot_product_attention on the same dtype. Sparse decode uses the C decode step
(decode_kernel.c) when it builds; `--torch-only` measures the pure-torch fallback instead.
Threads: torch's default unless --threads is given.

Each decode row reports, for both paths, the KV bytes the step must read per second and that rate
as a fraction of the machine's measured copy bandwidth (read + write bytes per second of a 512 MiB
copy, best of 5), and for the sparse path its FLOP rate as a fraction of the measured sgemm rate
(a decode step of a 16-head GQA group does 8 FLOP per fp32 KV byte: it is compute-bound on a CPU
without wide FMA units, whatever its memory traffic).

`--groups 2,4,8,16` sweeps the GQA group (query heads per KV head) at 2 KV heads, i.e. 4 .. 32
query heads, decode only.

    .venv/bin/python benchmarks/infllmv2.py                       # 8K..128K, prefill up to 32K
    .venv/bin/python benchmarks/infllmv2.py --dtype bfloat16 --max-prefill 0
    .venv/bin/python benchmarks/infllmv2.py --groups 2,4,8,16 --contexts 32768,131072
    .venv/bin/python benchmarks/infllmv2.py --contexts 32768 --repeats 1 --max-prefill 0  # quick
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from machine import machine_info

from arkinfer.ops.infllmv2 import (
    SparseConfig,
    compress_keys,
    dense_attention,
    infllmv2_attention,
    n_kernels,
    reserve_room,
)
from arkinfer.ops.infllmv2.native import kernels, torch_only

HQ, HKV, D = 32, 2, 128
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", default="8192,16384,32768,65536,131072",
                   help="comma-separated context lengths (default: %(default)s)")
    p.add_argument("--max-prefill", type=int, default=32768,
                   help="longest context also timed for prefill (dense prefill is O(L^2); "
                        "default: %(default)s)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="KV cache and query dtype (default: %(default)s; on a CPU without bf16 "
                        "arithmetic both paths upcast 16-bit values to fp32)")
    p.add_argument("--groups", default=None,
                   help="comma-separated GQA group sizes (query heads per KV head, 2 KV heads): "
                        "a decode-only sweep; default: MiniCPM4.1-8B's 16 (32 query heads)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--decode-steps", type=int, default=32,
                   help="consecutive decode steps averaged per pass (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3,
                   help="decode passes; the median pass is reported (default: %(default)s)")
    p.add_argument("--flush", choices=("kv", "llc", "none"), default="kv",
                   help="before every timed call: evict the KV it reads from every cache level "
                        "(kv), read twice the last-level cache (llc), or nothing (none) "
                        "(default: %(default)s)")
    p.add_argument("--warm", action="store_true", help="same as --flush none")
    p.add_argument("--flush-mib", type=int, default=None,
                   help="with --flush llc: MiB read before every timed call (default: twice "
                        "the last-level cache, at least 64)")
    p.add_argument("--torch-only", action="store_true",
                   help="sparse decode without the C kernels (the pure-torch fallback)")
    p.add_argument("--avx2", action="store_true",
                   help="force the AVX2 path of the C kernels on a CPU with AVX-512 / AMX (what an "
                        "AVX2-only CPU runs; the JSON's decode_kernels says so)")
    p.add_argument("--system-malloc", action="store_true",
                   help="keep glibc's default mmap/trim thresholds (by default they are raised so "
                        "freed temporaries are reused, as in a long-running server process)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "infllmv2.json",
                   help="JSON output (default: %(default)s)")
    return p.parse_args(argv)


def keep_freed_memory() -> bool:
    """Raise glibc's mmap threshold (32 MiB, its maximum) and trim threshold (1 GiB) so freed
    per-call temporaries are reused instead of being unmapped and page-faulted back every call
    (which costs the sparse decode several ms at 32K). jemalloc / tcmalloc behave like this."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 32 * 2**20)
                    and libc.mallopt(m_trim_threshold, 2**30))
    except (OSError, AttributeError):
        return False


# -- machine ------------------------------------------------------------------------------------
def bandwidth_gbs(mib: int = 512) -> dict[str, float]:
    """Best of 5: copy (bytes read + written per second) and read-only (sum) of `mib` MiB."""
    a = torch.ones(mib * 2**20 // 4)
    b = torch.empty_like(a)
    copy, read = [], []
    for _ in range(5):
        t = time.perf_counter()
        b.copy_(a)
        copy.append(2 * a.numel() * 4 / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        a.sum()
        read.append(a.numel() * 4 / (time.perf_counter() - t) / 1e9)
    return {"copy_gbs": max(copy), "read_gbs": max(read)}


def matmul_gflops(n: int = 1024) -> float:
    """Best of 5 fp32 [n, n] @ [n, n] on torch's threads: the FLOP rate this CPU sustains."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(6):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


class PeakRSS:
    """Peak resident memory above the starting point, from VmHWM (reset via clear_refs)."""

    def __enter__(self) -> PeakRSS:  # noqa: PYI034 (a final class in a script)
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.ok = True
        except OSError:
            self.ok = False
        self.start = self._read("VmRSS")
        return self

    def __exit__(self, *exc) -> None:
        self.mib = (self._read("VmHWM") - self.start) / 1024 if self.ok else float("nan")

    @staticmethod
    def _read(key: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])   # kB
        return 0


def last_level_cache_bytes() -> int:
    """The largest cache CPU 0 reports (Linux sysfs, e.g. "491520K"); 0 when unknown."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    best = 0
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = entry.read_text().strip()
            best = max(best, int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
        except (OSError, ValueError, IndexError):
            continue
    return best


def flush_mib(requested: int | None) -> int:
    """MiB read before every timed call: twice the last-level cache, at least 64 MiB (a 64 MiB
    flush left a 32K step's whole KV in the 480 MiB L3 of a Xeon VM: 0.85 ms per sparse step
    instead of 1.55 ms read from DRAM, and a dense 'fraction of copy bandwidth' above 100 %)."""
    if requested is not None:
        return requested
    return max(64, 2 * last_level_cache_bytes() // 2**20)


_WAKE = torch.zeros(2**18)    # 1 MiB: above torch's parallel grain


def evict_library():
    """benchmarks/evict.c built and loaded (ark_evict), or None where it cannot be built."""
    import ctypes

    from arkinfer.native_build import FLAGS, NativeBuildError, load_library
    try:
        lib = load_library("evict", [Path(__file__).with_name("evict.c")], FLAGS)
    except NativeBuildError:
        return None
    if lib is not None:
        lib.ark_evict.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        lib.ark_evict.restype = None
    return lib


class Flush:
    """What runs before every timed call (--flush): `Flush(mode, mib)(tensors)`."""

    def __init__(self, mode: str, mib: int) -> None:
        self.lib = evict_library() if mode == "kv" else None
        if mode == "kv" and self.lib is None:
            print("# benchmarks/evict.c did not build here: --flush llc instead", flush=True)
            mode = "llc"
        self.mode, self.mib = mode, mib if mode == "llc" else 0

    def __call__(self, tensors: tuple[torch.Tensor, ...]) -> None:
        if self.mode == "kv":
            for t in tensors:     # the whole allocation behind each view
                self.lib.ark_evict(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            _WAKE.add_(1.0)   # parallel on torch's threads: wakes the pool, as a model's
            # projection right before attention does (else the step pays OpenMP's wake-up)
        elif self.mode == "llc":
            read_through(self.mib)


_READ_BUFFERS: dict[int, torch.Tensor] = {}


def read_through(mib: int) -> None:
    """Read `mib` MiB (a buffer kept per size): the caches end up holding its clean lines, so the
    next timed call pays no write-back of dirty lines, unlike after a write."""
    buf = _READ_BUFFERS.get(mib)
    if buf is None:
        buf = _READ_BUFFERS[mib] = torch.ones(mib * 2**18)
    buf.sum()


def settle(flush: Flush) -> None:
    """Before a pass (not timed): read twice the last-level cache, so lines the previous pass left
    dirty (the dense bf16 SDPA writes hundreds of MiB of upcast temporaries) are written back now
    rather than during the next pass's first timed steps. Nothing with --flush none."""
    if flush.mode != "none":
        read_through(flush_mib(None))


def flush_words(flush: Flush) -> str:
    return {"kv": "KV evicted before each call (clflushopt)",
            "llc": f"flushed before each call ({flush.mib} MiB read)",
            "none": "warm"}[flush.mode]


# -- measurements -------------------------------------------------------------------------------
def kv_bytes(length: int, cfg: SparseConfig, elem: int) -> tuple[int, int]:
    """KV bytes one decode step reads (docs/infllmv2.md §8): (dense, sparse), all KV heads. The
    sparse step reads the fine compressed keys (fp32) only: the coarse normaliser is derived from
    the fine logits (arkinfer/ops/infllmv2/decode.py), so the §8 n2 term is not read."""
    dense = HKV * 2 * length * D * elem
    n1 = n_kernels(length, cfg.kernel_size, cfg.kernel_stride)
    attended = min(length, cfg.budget * cfg.block_size)
    sparse = HKV * (n1 * D * 4 + 2 * attended * D * elem)
    return dense, sparse


def step_flops(length: int, cfg: SparseConfig, group: int) -> tuple[int, int]:
    """Multiply-add FLOPs of one decode step (dense, sparse), all heads: q.k and p.v for every
    query head and attended key, plus (sparse) q.Kc1 for every fine compressed key."""
    n1 = n_kernels(length, cfg.kernel_size, cfg.kernel_stride)
    attended = min(length, cfg.budget * cfg.block_size)
    heads = HKV * group
    return heads * 4 * length * D, heads * (4 * attended + 2 * n1) * D


class Timer:
    """Wall-clock and process CPU time of a block (CPU time is robust to other jobs' load when
    torch runs one thread; with more threads it sums them)."""

    def __enter__(self) -> Timer:  # noqa: PYI034 (a final class in a script)
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def time_decode(length: int, cfg: SparseConfig, dtype: torch.dtype, args, group: int,
                machine: dict) -> dict:
    g = torch.Generator().manual_seed(length)
    k = torch.randn(1, HKV, length, D, generator=g).to(dtype)
    v = torch.randn(1, HKV, length, D, generator=g).to(dtype)
    q = torch.randn(1, HKV * group, 1, D, generator=g).to(dtype)
    scale = D ** -0.5
    first = length - args.decode_steps
    state0 = compress_keys(k[:, :, :first - 1], cfg)
    passes: dict[str, list[tuple[float, float]]] = {"dense": [], "sparse": []}
    firsts: dict[str, list[float]] = {"dense": [], "sparse": []}
    # Each pass runs the decode steps of one path after the other; passes alternate dense and
    # sparse, so drift hits both alike. Steps of the two paths interleaved one by one made each
    # sparse step pay for the write-back of the dense step's dirty temporaries (torch's bf16 SDPA
    # upcasts the 128K cache: hundreds of MiB written, still in the LLC): group 2, bf16, 128K ran
    # 1.31-1.42 ms per step that way against 1.02 ms after sparse steps. settle()
    # writes back what a pass left dirty before the next one starts.
    # Each pass starts with one untimed step (position first - 1, its time kept as
    # `*_first_step_ms`): settle() has just evicted the interpreter and the kernel code, and
    # reserve_room a fresh state whose plan is built on its first step, while the steps measured
    # are the steady state of a decode loop, where those stay warm (see --flush kv above).
    for rep in range(args.repeats + 1):           # pass 0 warms up (allocator, kernels)
        state, sums = reserve_room(state0), {"dense": [0.0, 0.0], "sparse": [0.0, 0.0]}

        def tally(name: str, p: int, t: Timer) -> None:
            if p < first:                        # the pass's untimed first step
                if rep:
                    firsts[name].append(t.wall)
            else:
                sums[name][0] += t.wall
                sums[name][1] += t.cpu

        settle(args.flush)
        for p in range(first - 1, length):
            kk, vv = k[:, :, :p + 1], v[:, :, :p + 1]
            args.flush((k, v))
            with Timer() as t:
                dense_attention(q, kk, vv, scale, p)
            tally("dense", p, t)
        settle(args.flush)
        for p in range(first - 1, length):
            kk, vv = k[:, :, :p + 1], v[:, :, :p + 1]
            args.flush((k, v, state.fine, state.coarse))
            with Timer() as t:
                _, state, _ = infllmv2_attention(q, kk, vv, config=cfg, scale=scale,
                                                 cache_len=p, state=state)
            tally("sparse", p, t)
        if rep:
            for name, (wall, cpu) in sums.items():
                passes[name].append((wall / args.decode_steps, cpu / args.decode_steps))
    with PeakRSS() as dense_mem:
        dense_attention(q, k, v, scale, length - 1)
    with PeakRSS() as sparse_mem:
        infllmv2_attention(q, k, v, config=cfg, scale=scale, cache_len=length - 1, state=state0)
    dense_b, sparse_b = kv_bytes(length, cfg, k.element_size())
    dense_f, sparse_f = step_flops(length, cfg, group)
    td, ts = (statistics.median(w for w, _ in passes[n]) for n in ("dense", "sparse"))
    cd, cs = (statistics.median(c for _, c in passes[n]) for n in ("dense", "sparse"))
    return {"group": group, "dense_ms": td * 1e3, "sparse_ms": ts * 1e3, "speedup": td / ts,
            "dense_cpu_ms": cd * 1e3, "sparse_cpu_ms": cs * 1e3, "cpu_speedup": cd / cs,
            "dense_kv_mib": dense_b / 2**20, "sparse_kv_mib": sparse_b / 2**20,
            "dense_gbs": dense_b / td / 1e9, "sparse_gbs": sparse_b / ts / 1e9,
            "dense_copy_fraction": dense_b / td / 1e9 / machine["copy_gbs"],
            "sparse_copy_fraction": sparse_b / ts / 1e9 / machine["copy_gbs"],
            "dense_gflops": dense_f / td / 1e9, "sparse_gflops": sparse_f / ts / 1e9,
            "sparse_matmul_fraction": sparse_f / ts / 1e9 / machine["matmul_gflops"],
            "dense_peak_mib": dense_mem.mib, "sparse_peak_mib": sparse_mem.mib,
            "dense_first_step_ms": statistics.median(firsts["dense"]) * 1e3,
            "sparse_first_step_ms": statistics.median(firsts["sparse"]) * 1e3}


def time_prefill(length: int, cfg: SparseConfig, dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(length + 1)
    q = torch.randn(1, HQ, length, D, generator=g).to(dtype)
    k = torch.randn(1, HKV, length, D, generator=g).to(dtype)
    v = torch.randn(1, HKV, length, D, generator=g).to(dtype)
    scale = D ** -0.5
    with PeakRSS() as dense_mem, Timer() as dense_t:
        dense_attention(q, k, v, scale, 0)
    with PeakRSS() as sparse_mem, Timer() as sparse_t:
        infllmv2_attention(q, k, v, config=cfg, scale=scale, cache_len=0)
    return {"dense_s": dense_t.wall, "sparse_s": sparse_t.wall,
            "speedup": dense_t.wall / sparse_t.wall,
            "dense_cpu_s": dense_t.cpu, "sparse_cpu_s": sparse_t.cpu,
            "cpu_speedup": dense_t.cpu / sparse_t.cpu,
            "dense_peak_mib": dense_mem.mib, "sparse_peak_mib": sparse_mem.mib,
            "l_squared_fp32_mib": length * length * 4 / 2**20}


# -- report -------------------------------------------------------------------------------------
def table(rows: list[dict]) -> str:
    head = ("| context | group | decode dense ms | decode sparse ms | decode speedup (CPU-time "
            "speedup) | dense / sparse KV GB/s | dense / sparse % of copy bandwidth | sparse "
            "GFLOP/s (% of sgemm) | prefill dense s | prefill sparse s | prefill speedup "
            "(CPU-time speedup) | prefill peak RSS MiB dense / sparse |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        d, p = r["decode"], r.get("prefill")
        pre = (f"{p['dense_s']:.1f} | {p['sparse_s']:.1f} | {p['speedup']:.2f}x "
               f"({p['cpu_speedup']:.2f}x) | {p['dense_peak_mib']:.0f} / "
               f"{p['sparse_peak_mib']:.0f}") if p else "- | - | - | -"
        lines.append(f"| {r['context'] // 1024}K | {d['group']} | {d['dense_ms']:.2f} | "
                     f"{d['sparse_ms']:.2f} | {d['speedup']:.1f}x ({d['cpu_speedup']:.1f}x) | "
                     f"{d['dense_gbs']:.1f} / {d['sparse_gbs']:.1f} | "
                     f"{100 * d['dense_copy_fraction']:.0f} % / "
                     f"{100 * d['sparse_copy_fraction']:.0f} % | {d['sparse_gflops']:.1f} "
                     f"({100 * d['sparse_matmul_fraction']:.0f} %) | {pre} |")
    return "\n".join(lines)


def targets(rows: list[dict]) -> list[str]:
    """issue #21's bars: decode >= 4x at 32K and >= 10x at 128K; the sparse path at >= 50 % of
    the measured copy bandwidth; prefill 32K >= 2x."""
    out = []
    for r in rows:
        ctx, d = r["context"], r["decode"]
        need = {32768: 4.0, 131072: 10.0}.get(ctx)
        tag = f"group {d['group']}, {ctx // 1024}K"
        if need is not None:
            verdict = "met" if d["speedup"] >= need else "NOT met"
            out.append(f"decode {tag} >= {need}x: {d['speedup']:.2f}x wall, "
                       f"{d['cpu_speedup']:.2f}x CPU time ({verdict} on wall time)")
        frac, flops = d["sparse_copy_fraction"], d["sparse_matmul_fraction"]
        out.append(f"sparse decode {tag} >= 50 % of copy bandwidth: {100 * frac:.0f} % "
                   f"({'met' if frac >= 0.5 else 'NOT met'}; {100 * flops:.0f} % of the sgemm "
                   "FLOP rate)")
        p = r.get("prefill")
        if ctx == 32768 and p is not None:
            out.append(f"prefill 32K >= 2.0x: {p['speedup']:.2f}x wall, {p['cpu_speedup']:.2f}x "
                       f"CPU time ({'met' if p['speedup'] >= 2.0 else 'NOT met'} on wall time)")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with torch_only() if args.torch_only else contextlib.nullcontext():
        return run(args, argv)


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    malloc_tuned = False if args.system_malloc else keep_freed_memory()
    cfg = replace(SparseConfig(), dense_len=-1)
    contexts = [int(c) for c in args.contexts.split(",")]
    native = kernels()
    if native is not None and args.avx2:
        native.use_avx512(False)
        native.use_amx(False)
    decode_kernels = "torch" if native is None else \
        f"C ({'AVX2 + AVX-512 tiles' if native.use_avx512() else 'AVX2'}" \
        f"{' forced (--avx2)' if args.avx2 else ''}, " \
        f"{'OpenMP' if native.threaded else 'one thread'})"
    groups = [int(g) for g in args.groups.split(",")] if args.groups else [HQ // HKV]
    args.flush = Flush("none" if args.warm else args.flush,
                       flush_mib(args.flush_mib) if args.flush == "llc" else 0)
    machine = machine_info(threads=torch.get_num_threads(), load_avg_at_start=os.getloadavg(),
                           malloc_tuned=malloc_tuned, matmul_gflops=matmul_gflops(),
                           **bandwidth_gbs())
    print(f"# {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}, "
          f"{machine['threads']} threads; copy {machine['copy_gbs']:.1f} GB/s (read+write), "
          f"read {machine['read_gbs']:.1f} GB/s, sgemm {machine['matmul_gflops']:.0f} GFLOP/s; "
          f"dtype {args.dtype}; caches "
          f"{flush_words(args.flush)}; glibc malloc "
          f"{'thresholds raised' if malloc_tuned else 'defaults'}; "
          f"load average {machine['load_avg_at_start'][0]:.1f}; sparse decode kernels "
          f"{decode_kernels}", flush=True)
    rows = []
    for group in groups:
        for length in contexts:
            row = {"context": length, "group": group, "load_avg_before": os.getloadavg(),
                   # the copy rate again right before the row: how far the VM drifted since the
                   # start (the fractions stay against machine["copy_gbs"], one figure per run)
                   "copy_gbs_before": bandwidth_gbs()["copy_gbs"],
                   "decode": time_decode(length, cfg, dtype, args, group, machine)}
            print(f"  group {group}, {length}: decode {row['decode']['dense_ms']:.2f} ms dense, "
                  f"{row['decode']['sparse_ms']:.2f} ms sparse (load "
                  f"{row['load_avg_before'][0]:.1f})", flush=True)
            if not args.groups and length <= args.max_prefill:
                row["prefill"] = time_prefill(length, cfg, dtype)
                print(f"  {length}: prefill {row['prefill']['dense_s']:.2f} s dense, "
                      f"{row['prefill']['sparse_s']:.2f} s sparse", flush=True)
            rows.append(row)
    machine["load_avg_at_end"] = os.getloadavg()
    print()
    print(table(rows))
    print()
    for line in targets(rows):
        print(line)
    result = {"benchmark": "infllmv2", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None
                                                                else sys.argv[1:])),
              "layer": {"q_heads": [HKV * g for g in groups], "kv_heads": HKV, "head_dim": D,
                        "dtype": args.dtype},
              "sparse_config": cfg.to_dict(),
              "flush": {"mode": args.flush.mode, "mib": args.flush.mib,
                        "words": flush_words(args.flush)},
              "sparse_decode_kernels": decode_kernels,
              "machine": machine, "rows": rows, "targets": targets(rows)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
