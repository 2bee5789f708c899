"""This machine's roofline numbers, measured once and cached: what turns the `host` target profile
(targets/host.toml, no fixed numbers) into one the latency model can use.

    host = host_target()            # Target 'host' with measured memory, bandwidth and compute

Measurements (`measure_host`), cached in `<cache>/host-<threads>t.json` (cache: $ARKINFER_CACHE
or ~/.cache/arkinfer; one file per torch thread count, so a run with other threads neither uses
nor replaces the default's record) with the date, CPU and thread count; a cache from another
CPU is measured again:

- copy bandwidth: `np.copyto` of a 256 MiB float32 array into another, best of 5, counting the
  bytes read plus the bytes written (STREAM "copy" convention), bytes/s;
- matmul rate: `torch.mm` of two 2048 x 2048 fp32 matrices on torch's threads, best of 3 after a
  warm-up, 2 · 2048³ FLOP each, FLOP/s;
- memory: total RAM (psutil), or the cgroup limit when one is set lower.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from pathlib import Path
from typing import Any

from arkinfer.errors import ArkError
from arkinfer.paths import read_json_object
from arkinfer.targets.machine import cpu_model

CACHE_NAME = "host"  # host-<threads>t.json, locked by .host.lock
COPY_BYTES = 256 * 2**20
COPY_REPEATS = 5
MATMUL_N = 2048
MATMUL_REPEATS = 3
VERSION = 1


def cache_path() -> Path:
    from arkinfer.frontend.cache import cache_dir_path

    return cache_dir_path() / f"{CACHE_NAME}-{_threads()}t.json"


def memory_bytes() -> int:
    """Total RAM, or the cgroup v2 / v1 memory limit when it is lower (containers)."""
    import psutil

    total = int(psutil.virtual_memory().total)
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def measure_copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = COPY_REPEATS) -> float:
    """Bytes/s of a large numpy array copy: (read + written bytes) / best time."""
    import numpy as np

    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in before timing
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def measure_matmul_rate(n: int = MATMUL_N, repeats: int = MATMUL_REPEATS) -> float:
    """FLOP/s of an fp32 n x n matmul in torch: 2 · n³ / best time."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def measure_host() -> dict[str, Any]:
    """Measure this machine now (about a second or two) and return the cache record."""
    return {
        "version": VERSION,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "cpu": cpu_model(), "threads": _threads(), "memory_bytes": memory_bytes(),
        "copy_bandwidth_bytes_s": measure_copy_bandwidth(),
        "matmul_fp32_flop_s": measure_matmul_rate(),
        "method": {
            "copy_bandwidth": f"numpy copyto of a {COPY_BYTES // 2**20} MiB float32 array, best "
                              f"of {COPY_REPEATS}, read + written bytes / time",
            "matmul": f"torch.mm fp32 {MATMUL_N}x{MATMUL_N}, best of {MATMUL_REPEATS} after a "
                      "warm-up, 2·n³ / time",
            "memory": "psutil total RAM (or the cgroup limit when lower)",
        },
    }


def load_cached() -> dict[str, Any] | None:
    """The cached record when it exists, parses, and was taken on this CPU with these threads."""
    path = cache_path()
    try:
        record = read_json_object(path)  # a regular file of bounded size, else not a record
    except ArkError:
        return None
    if record.get("version") != VERSION:
        return None
    if record.get("cpu") != cpu_model() or record.get("threads") != _threads():
        return None
    return record


def host_measurement(measure_if_missing: bool = True,
                     remeasure: bool = False) -> dict[str, Any] | None:
    """The cached record, measured (and cached) now if missing or `remeasure`.

    Measuring holds an exclusive lock on `<cache>/.host.lock`: two measurements at once
    would each time the other's load (two `doctor --remeasure` cached a halved bandwidth). A
    process that waited for the lock uses the record measured while it waited."""
    record = None if remeasure else load_cached()
    if record is not None or not (measure_if_missing or remeasure):
        return record
    from arkinfer.frontend.cache import locked

    asked = time.time()
    path = cache_path()
    with locked(path.parent, CACHE_NAME):
        record = load_cached()
        if record is not None and (not remeasure or _written_since(path, asked)):
            return record
        record = measure_host()
        # a name of this process's own: the lock is advisory (another tool may not take it), so
        # each writer still renames a complete file of its own into place
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(path)
    return record


def _written_since(path: Path, since: float) -> bool:
    """True when `path` was last written at or after `since` (time.time())."""
    try:
        return path.stat().st_mtime >= since
    except OSError:
        return False


def host_target(measure_if_missing: bool = True, remeasure: bool = False):
    """The `host` Target filled with this machine's measured numbers (`Target.with_measured`);
    the bare profile when nothing is cached and `measure_if_missing` is False."""
    from arkinfer.targets import load_target

    target = load_target("host")
    record = host_measurement(measure_if_missing, remeasure)
    if record is None:
        return target
    what = (f"{record['cpu']}, {record['threads']} torch threads, {record['date']}: "
            f"bandwidth: {record['method']['copy_bandwidth']}; compute: "
            f"{record['method']['matmul']}; memory: {record['method']['memory']} "
            "(`arkinfer doctor` measured it)")
    return target.with_measured(what, memory_bytes=record["memory_bytes"],
                                bandwidth=record["copy_bandwidth_bytes_s"],
                                compute={"fp32": record["matmul_fp32_flop_s"]}, roofline="fp32")
