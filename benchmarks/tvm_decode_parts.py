"""Where a TVM host decode step goes: the hand-built decode GEMVs alone (the Q8_0 lm_head with
SSE2's and AVX2's pmaddwd, the 4-bit int16-activation GEMV at SmolLM2's gate/up and down
shapes), and, given an artifact, a whole decode step (called directly, as a local session does,
and through the VM's stateful calls, as an RPC session does) and the VM's argument passing.

    .venv/bin/python benchmarks/tvm_decode_parts.py [--artifact ART] [--json OUT]

Random weights of the stated shapes (the kernels' cost does not depend on the values); each
kernel called `--calls` times after 20 warm-up calls, with TVM's thread pool at torch's thread
count (as the runner sets it). ART: an `arkinfer build SMOLLM2 --target android --quant q4_0`
artifact; its step is timed at context 8-72 as `tg` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from machine import machine_info


def _per_call_ms(fn, args, calls: int) -> float:
    for _ in range(20):
        fn(*args)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - t0) / calls * 1e3


def _compiled(func):
    import tvm

    from arkinfer.backends.tvm.default_pipeline import host_target

    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    return tvm.compile(mod, target=host_target())["main"]


def _activations(k: int):
    import tvm

    rng = np.random.default_rng(0)
    return [tvm.runtime.tensor(rng.integers(-3000, 3000, k).astype(np.int16)),
            tvm.runtime.tensor(np.full(k // 32, 1e-3, np.float32)),
            tvm.runtime.tensor(np.zeros(k // 32, np.int32))]


def q8_gemv_ms(n: int, k: int, wide: bool, calls: int) -> float:
    import tvm

    from arkinfer.backends.tvm import kernels_qact as qa
    from arkinfer.backends.tvm.weights import Q8_CODES, Q8_SCALES, pack_q8

    packed = pack_q8(np.random.default_rng(1).standard_normal((n, k)).astype(np.float32))
    args = [*_activations(k), tvm.runtime.tensor(packed[Q8_CODES]),
            tvm.runtime.tensor(packed[Q8_SCALES]), tvm.runtime.tensor(np.zeros((1, 1, n), np.float32))]
    return _per_call_ms(_compiled(qa.q8_gemv_qact(n, k, None, 16, wide)), args, calls)


def q4_gemv_ms(n: int, k: int, calls: int) -> float:
    import tvm

    from arkinfer.backends.tvm import kernels_qact as qa
    from arkinfer.backends.tvm.weights import CODES, SCALES, pack_q4
    from arkinfer.testing.synthetic import random_q4_weight

    packed = pack_q4(random_q4_weight(n, k, 32, True))
    args = [*_activations(k), tvm.runtime.tensor(packed[CODES]), tvm.runtime.tensor(packed[SCALES]),
            tvm.runtime.tensor(np.zeros((1, 1, n), np.float32))]
    func = qa.q4_gemv_qact(n, k, 32, str(packed[SCALES].dtype), False, None, 16)
    return _per_call_ms(_compiled(func), args, calls)


def artifact_step(artifact: Path, steps: int, rounds: int = 5) -> dict:
    """ms per decode step (context 8 -> 8 + steps; the median of `rounds`), called directly
    (what a local session does) and through set_input / invoke_stateful / get_outputs (what an
    RPC session does), rounds interleaved; and ms per set_input call of that step."""
    import statistics

    import tvm

    from arkinfer.backend import get_backend

    session = get_backend("tvm").load(artifact).session
    direct_entries, times = session._entries, {"direct": [], "stateful": []}
    for _ in range(rounds):
        for path in times:
            session._entries = direct_entries if path == "direct" else None
            session.reset()
            session.step(list(range(100, 108)))
            t0 = time.perf_counter()
            for _ in range(steps):
                session.step([5])
            times[path].append((time.perf_counter() - t0) / steps * 1e3)
    session._entries = direct_entries
    tokens = tvm.runtime.tensor(np.asarray([[5]], np.int64))
    positions = tvm.runtime.tensor(np.asarray([8 + steps], np.int64))
    args = (tokens, positions, *session.cache, *session.params)
    set_input = _per_call_ms(lambda *a: session.vm.set_input("decode", *a), args, 200)
    return {"decode_step_ms": statistics.median(times["direct"]),
            "decode_step_stateful_ms": statistics.median(times["stateful"]),
            "set_input_ms": set_input, "arguments": len(args)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact", type=Path)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch

    from arkinfer.backends.tvm.runner import use_torch_threads

    use_torch_threads()   # before TVM's pool starts: torch's thread count, as the runner does
    load_before = list(os.getloadavg())
    rows = {
        "q8_lm_head_49152x576_sse2_ms": q8_gemv_ms(49152, 576, False, args.calls),
        "q8_lm_head_49152x576_avx2_ms": q8_gemv_ms(49152, 576, True, args.calls),
        "q4_int16_gate_up_3072x576_ms": q4_gemv_ms(3072, 576, args.calls * 5),
        "q4_int16_down_576x1536_ms": q4_gemv_ms(576, 1536, args.calls * 5),
    }
    if args.artifact:
        rows.update(artifact_step(args.artifact, 64))
    for name, value in rows.items():
        print(f"{name}: {value:.3f}" if isinstance(value, float) else f"{name}: {value}")
    if args.json:
        out = {"machine": machine_info(), "threads": torch.get_num_threads(),
               "load_average_before": load_before, "artifact": str(args.artifact or ""),
               "results": rows}
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
