"""Where an InfLLM v2 decode step's time goes: the C call alone (decode_kernel.c), stage 1 only
(block selection) and the whole step (selection + attention), with the AVX or the AMX tiles.

One MiniCPM4.1-8B attention layer as in benchmarks/infllmv2.py (2 KV heads, head_dim 128, its
sparse_config), one call per step on a fixed cache (no Python step around it: no state update,
no plan), so the figures are the kernel's. Before each call: the KV and the compressed keys evicted
from every cache level (`--flush kv`, as infllmv2.py) or nothing (`--flush none`: everything the
call reads stays in L2 / L3). The variants (`--amx on,off`) alternate call by call, so drift hits
them alike; the median of `--calls` calls after a warm-up is reported, and stage 2 as whole
minus stage 1.

    .venv/bin/python benchmarks/infllmv2_kernel.py --dtype bfloat16 --groups 2,16
    .venv/bin/python benchmarks/infllmv2_kernel.py --dtype bfloat16 --groups 16 --flush none
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from infllmv2 import DTYPES, HKV, D, Flush
from machine import machine_info

from arkinfer.ops.infllmv2 import SparseConfig, compress_keys
from arkinfer.ops.infllmv2.native import kernels


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", default="32768,131072", help="comma-separated (default: %(default)s)")
    p.add_argument("--groups", default="2,16", help="GQA groups, 2 KV heads (default: %(default)s)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16",
                   help="KV cache and query dtype (default: %(default)s)")
    p.add_argument("--amx", default="on,off",
                   help="AMX tiles for bf16 stage 2: on, off or both (default: %(default)s; "
                        "'on' where the CPU has no AMX runs the AVX tiles)")
    p.add_argument("--flush", choices=("kv", "none"), default="kv",
                   help="before every call: evict the KV and compressed keys, or nothing")
    p.add_argument("--calls", type=int, default=30, help="timed calls per variant (default: %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    native = kernels()
    if native is None:
        print("the C decode kernel is not available here (no compiler or no AVX2/FMA)", file=sys.stderr)
        return 1
    variants = [v.strip() for v in args.amx.split(",")]
    if any(v not in ("on", "off") for v in variants):
        print(f"--amx takes on, off or on,off; got {args.amx!r}", file=sys.stderr)
        return 2
    flush = Flush(args.flush, 0) if args.flush == "kv" else (lambda tensors: None)
    cfg = replace(SparseConfig(), dense_len=-1)
    dtype = DTYPES[args.dtype]
    amx_before = native.use_amx()
    rows = []
    print(f"# threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}, flush {args.flush}, "
          f"AMX available: {amx_before}")
    print("| context | group | tiles | stage 1 ms | whole step ms | stage 2 ms |")
    print("|---|---|---|---|---|---|")
    try:
        for length in (int(c) for c in args.contexts.split(",")):
            g = torch.Generator().manual_seed(length)
            k = torch.randn(1, HKV, length, D, generator=g).to(dtype)
            v = torch.randn(1, HKV, length, D, generator=g).to(dtype)
            keys = compress_keys(k, cfg)
            for group in (int(x) for x in args.groups.split(",")):
                q = torch.randn(1, HKV * group, 1, D, generator=g).to(dtype)
                idx = torch.empty(1, HKV, 1, cfg.budget, dtype=torch.int64)
                out = torch.empty(q.shape, dtype=dtype)
                times: dict[tuple[str, bool], list[float]] = {}
                for call in range(args.calls + 3):
                    for variant in variants:
                        native.use_amx(variant == "on")
                        for whole in (False, True):
                            flush((k, v, keys.fine, keys.coarse))
                            t = time.perf_counter()
                            native.decode(q, q if whole else None, keys, k if whole else None,
                                          v if whole else None, config=cfg, scale=D ** -0.5,
                                          cache_len=length - 1, idx=idx,
                                          out=out if whole else None)
                            if call >= 3:
                                times.setdefault((variant, whole), []).append(time.perf_counter() - t)
                for variant in variants:
                    native.use_amx(variant == "on")
                    tiles = "AMX" if native.use_amx() and dtype == torch.bfloat16 else "AVX"
                    s1, full = (statistics.median(times[(variant, w)]) * 1e3 for w in (False, True))
                    rows.append({"context": length, "group": group, "amx": variant, "tiles": tiles,
                                 "stage1_ms": s1, "whole_ms": full, "stage2_ms": full - s1,
                                 "load": os.getloadavg()[0]})
                    print(f"| {length // 1024}K | {group} | {tiles} | {s1:.3f} | {full:.3f} | "
                          f"{full - s1:.3f} |", flush=True)
    finally:
        native.use_amx(amx_before)
    if args.out:
        args.out.write_text(json.dumps({"benchmark": "infllmv2_kernel", "command": " ".join(sys.argv),
                                        "dtype": args.dtype, "flush": args.flush,
                                        "threads": torch.get_num_threads(),
                                        "machine": machine_info(), "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
