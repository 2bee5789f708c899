"""`plan`'s calibration prediction against a measured calibration: time and peak memory.

    python benchmarks/calib_predict.py --measure [--cases 1.2b,8b-l2]   # runs the calibrations
    python benchmarks/calib_predict.py                                   # prediction vs measured

Cases (random weights, seeded random calibration ids; the recipe and options `arkinfer build
--quant marlin` runs: GPTQ 4-bit g128 sym, act-order over static groups, two static passes):
- `1.2b`: the 1.2B-parameter MiniCPM4-architecture checkpoint of benchmarks/quant_memory.py
  (hidden 2048, 20 layers, FFN 5632, 16 q / 2 KV heads of 128, vocab 73448), 8 x 512 tokens;
- `8b-l2`: the MiniCPM4.1-8B fixture (arkinfer/testing/fixture_8b.py; hidden 4096, FFN 16384,
  32 q / 2 KV heads of 128, vocab 73448) cut to 2 of its 32 decoder blocks, 8 x 256 tokens
  (the issue's `--samples 8 --seq-len 256`). Every block of the 8B model has the same shapes and
  work, so the full model's calibration is 32 x the per-block figure (the JSON says which
  figures were measured and which are scaled).

`--measure` runs each calibration in a fresh subprocess with torch's default threads and
nothing else running, timing every block and every phase (quant_speed.py's instrumentation)
and reading the process's peak resident set (VmHWM); results go to
benchmarks/results/calib_predict_<machine>.json (`--json`). Without `--measure` the script reads
that file, computes `arkinfer.quant.calib.cost.predict_calibration` for each case with the
matmul rate `arkinfer doctor` had cached when the calibrations ran (recorded in the file) and
writes both side by side with their ratio (target: within +-30 %).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from machine import machine_info

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "calib_predict.json"
CASES = {
    "1.2b": {"samples": 8, "seq_len": 512},
    "8b-l2": {"samples": 8, "seq_len": 256},
}


def case_model(case: str) -> Path:
    """The checkpoint folder of `case` (written once, cached)."""
    if case == "1.2b":
        from quant_memory import make_checkpoint

        return make_checkpoint(Path("/tmp/arkinfer-quant-memory") / "minicpm4-1b-bf16", 20)
    from arkinfer.testing.fixture_8b import ensure_fixture

    return ensure_fixture("minicpm4.1-8b", layers=2)


def child(case: str, model: Path, work: Path) -> None:
    """In a fresh subprocess: the calibration `build --quant marlin` runs; one JSON line."""
    import torch
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.calib_data import calibration_from_ids
    from arkinfer.quant.recipe import get_preset, static_passes_for
    from quant_memory import vm_hwm
    from quant_speed import Phases, instrument

    shape = CASES[case]
    gen = torch.Generator().manual_seed(0)
    calib = calibration_from_ids(torch.randint(0, 32000, (shape["samples"], shape["seq_len"]),
                                               generator=gen), source="random ids (seed 0)")
    recipe = get_preset("marlin")
    options = {"act_order": True, "static_groups": True,
               "static_passes": static_passes_for(recipe.format)}
    times: list[float] = []
    load_before = os.getloadavg()
    phases = Phases()
    instrument(phases)
    t0 = time.perf_counter()
    try:
        calibrate(model, recipe, calib, work, options=options,
                  progress=lambda i, n, s: (times.append(round(s, 2)), print(
                      f"{case} block {i + 1}/{n}: {s:.1f} s, VmHWM {vm_hwm() / 2**20:.0f} MiB",
                      file=sys.stderr, flush=True)))
    finally:
        phases.restore()
    total = time.perf_counter() - t0
    print(json.dumps({
        "recipe": recipe.describe(), "options": options, "threads": torch.get_num_threads(),
        "calibration_seconds": round(total, 1), "seconds_per_block": times,
        "peak_rss_bytes": vm_hwm(),
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "phases": {p: {"seconds": round(s, 2), "gflop": round(phases.flops.get(p, 0.0) / 1e9, 1)}
                   for p, s in sorted(phases.seconds.items())}}))


def measure(cases: list[str], out: Path) -> None:
    from arkinfer.targets.host import host_measurement

    results = json.loads(out.read_text()) if out.is_file() else {"cases": {}}
    for case in cases:
        t = time.perf_counter()
        model = case_model(case)
        print(f"{case}: checkpoint ready in {time.perf_counter() - t:.0f} s", flush=True)
        work = Path("/tmp/arkinfer-calib-predict") / case
        shutil.rmtree(work, ignore_errors=True)
        cmd = [sys.executable, __file__, "--child", case, str(model), str(work)]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
        measured = json.loads(proc.stdout.strip().splitlines()[-1])
        config = json.loads((model / "config.json").read_text())
        results["cases"][case] = {"model": str(model), "config": config, **CASES[case],
                                  "measured": measured}
        results["machine"] = machine_info()
        results["host_matmul_fp32_flop_s"] = host_measurement(
            measure_if_missing=True)["matmul_fp32_flop_s"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(json.dumps(measured), flush=True)


def compare(out: Path) -> None:
    from arkinfer.quant.calib.cost import predict_calibration
    from arkinfer.quant.recipe import get_preset

    from arkinfer.targets.host import host_measurement

    results = json.loads(out.read_text())
    # the rate cached when the calibrations ran (a later `doctor --remeasure` moves the cache)
    rate = results.get("host_matmul_fp32_flop_s") or \
        host_measurement(measure_if_missing=True)["matmul_fp32_flop_s"]
    for case, r in results["cases"].items():
        p = predict_calibration(r["config"], get_preset("marlin"), r["samples"], r["seq_len"],
                                rate, threads=r["measured"]["threads"])
        m = r["measured"]
        r["predicted"] = p.as_dict()
        r["ratio"] = {"seconds": round(p.seconds / m["calibration_seconds"], 3),
                      "peak_rss": round(p.peak_bytes / m["peak_rss_bytes"], 3)}
        print(f"{case}: calibration predicted {p.seconds:.0f} s, measured "
              f"{m['calibration_seconds']:.0f} s ({r['ratio']['seconds']:.2f}x); peak memory "
              f"predicted {p.peak_bytes / 2**30:.2f} GiB, measured "
              f"{m['peak_rss_bytes'] / 2**30:.2f} GiB ({r['ratio']['peak_rss']:.2f}x)")
    results["host_matmul_fp32_flop_s"] = rate
    out.write_text(json.dumps(results, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", action="store_true", help="run the calibrations first")
    ap.add_argument("--cases", default=",".join(CASES), help="comma list of " + ",".join(CASES))
    ap.add_argument("--json", type=Path, default=RESULTS)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]))
        return
    if args.measure:
        measure(args.cases.split(","), args.json)
    compare(args.json)


if __name__ == "__main__":
    main()
