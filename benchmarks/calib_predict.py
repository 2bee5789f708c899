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
  figures were measured and which are scaled);
- `tokens`: a synthetic 2-block MiniCPM (hidden 1024, FFN 2816, 8 q / 2 KV heads of 128) on
  128 x 1024 tokens, where the activations kept between a block's stages, not the solves, set
  the peak (as on a GPU at 128 x 2048).

`--measure` runs each calibration in a fresh subprocess with torch's default threads and
nothing else running, timing every block and every phase (quant_speed.py's instrumentation)
and reading the process's peak resident set (VmHWM); results go to
benchmarks/results/calib_predict_<machine>.json (`--json`). Without `--measure` the script reads
that file, computes `arkinfer.quant.calib.cost.predict_calibration` for each case with the
matmul rate `arkinfer doctor` had cached when that calibration ran (recorded in the file) and
writes both side by side with their ratio (target: within +-30 %).

    python benchmarks/calib_predict.py --fit-gpu    # cost.GPU_EFFICIENCY from the H200 run

`--fit-gpu` reads benchmarks/results/calib_cuda_h200.json (benchmarks/calib_cuda_check.sh: 6
blocks of the MiniCPM4.1-8B shape, 128 x 2048 tokens, one static pass, `--device cuda`) and
solves for the one FLOP-phase efficiency that makes `predict_calibration_on_gpu` give the
median computing seconds of blocks 2-5 (block 1 carries CUDA's warm-up), the column loop and
per-block overhead taken as the CPU's. It prints the efficiency to write into
quant/calib/cost.py, and the predicted against the measured peak GPU memory (not fitted), into
the results JSON's `gpu_fit`. One run, one GPU, one shape: a fit, not a check.
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

from calib_cost_fit import SYNTHETIC
from machine import machine_info

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "calib_predict.json"
GPU_RUN = ROOT / "benchmarks" / "results" / "calib_cuda_h200.json"
CASES = {
    "1.2b": {"samples": 8, "seq_len": 512},
    "8b-l2": {"samples": 8, "seq_len": 256},
    "tokens": {"samples": 128, "seq_len": 1024},
}
TOKENS_MODEL = {**SYNTHETIC, "hidden_size": 1024, "num_attention_heads": 8,
                "num_key_value_heads": 2, "intermediate_size": 2816}


def case_model(case: str) -> Path:
    """The checkpoint folder of `case` (written once, cached)."""
    if case == "1.2b":
        from quant_memory import make_checkpoint

        return make_checkpoint(Path("/tmp/arkinfer-quant-memory") / "minicpm4-1b-bf16", 20)
    if case == "tokens":
        import torch

        from arkinfer.testing.synthetic import write_checkpoint

        folder = Path("/tmp/arkinfer-calib-predict-models") / "tokens"
        if not (folder / ".complete").is_file():
            write_checkpoint(folder, TOKENS_MODEL, seed=0, dtype=torch.bfloat16, std=0.02)
            (folder / ".complete").touch()
        return folder
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
        rate = host_measurement(measure_if_missing=True)["matmul_fp32_flop_s"]
        results["cases"][case] = {"model": str(model), "config": config, **CASES[case],
                                  "measured": measured, "host_matmul_fp32_flop_s": rate}
        results["machine"] = machine_info()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(json.dumps(measured), flush=True)


def compare(out: Path) -> None:
    from arkinfer.quant.calib.cost import predict_calibration
    from arkinfer.quant.recipe import get_preset

    from arkinfer.targets.host import host_measurement

    results = json.loads(out.read_text())
    for case, r in results["cases"].items():
        # the rate cached when this calibration ran (a later `doctor --remeasure` moves the cache)
        rate = r.get("host_matmul_fp32_flop_s") or results.get("host_matmul_fp32_flop_s") or \
            host_measurement(measure_if_missing=True)["matmul_fp32_flop_s"]
        r["host_matmul_fp32_flop_s"] = rate
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
    results.pop("host_matmul_fp32_flop_s", None)  # recorded per case
    out.write_text(json.dumps(results, indent=2) + "\n")


def fit_gpu(out: Path, run_path: Path = GPU_RUN) -> None:
    import statistics
    from dataclasses import replace

    from arkinfer.quant.calib import cost
    from arkinfer.quant.calib.gpus import gpu_of_device_name
    from arkinfer.quant.recipe import get_preset

    from arkinfer.testing.fixture_8b import shape_config

    run = json.loads(run_path.read_text())
    gpu = gpu_of_device_name(run["gpu"])
    cfg = {**shape_config(run["shape"]), "num_hidden_layers": 1}  # per block
    recipe = get_preset("marlin")
    measured = statistics.median(run["measured"]["block_compute_seconds"][1:5])

    def block_seconds(efficiency: float) -> cost.CalibrationCost:
        costs = replace(cost.GPU_COSTS, **{k: efficiency for k in
                                            ("forward", "hessian", "update", "cholesky", "report")})
        return cost.predict_calibration(cfg, recipe, run["samples"], run["seq_len"],
                                        gpu.fp32_flop_s, threads=1, static_passes=1,
                                        costs=costs, gpu=True)

    at_one = block_seconds(1.0)
    fixed = at_one.seconds_by_phase["overhead"] + sum(
        lin.inp * cost.GPU_COSTS.column_s for lin in cost.block_linears(cfg))
    efficiency = round((at_one.seconds - fixed) / (measured - fixed), 3)
    check = block_seconds(efficiency)
    peak = run["measured"]["peak_gpu_bytes"]
    fit = {"run": str(run_path.relative_to(ROOT)), "gpu": run["gpu"],
           "fp32_flop_s": gpu.fp32_flop_s, "block_compute_seconds_median_2_5": measured,
           "efficiency": efficiency, "predicted_block_seconds": check.seconds,
           "fixed_seconds_per_block": round(fixed, 2),
           "peak_gpu_bytes": {"predicted": check.peak_bytes, "measured": peak,
                              "ratio": round(check.peak_bytes / peak, 3),
                              "stage": check.peak_stage}}
    results = json.loads(out.read_text()) if out.is_file() else {"cases": {}}
    results["gpu_fit"] = fit
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"GPU_EFFICIENCY = {efficiency}  (block: {measured:.2f} s measured, of which "
          f"{fixed:.2f} s column loop and overhead); peak GPU memory predicted "
          f"{check.peak_bytes / 2**30:.2f} GiB ({check.peak_stage}), measured "
          f"{peak / 2**30:.2f} GiB ({fit['peak_gpu_bytes']['ratio']:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", action="store_true", help="run the calibrations first")
    ap.add_argument("--cases", default=",".join(CASES), help="comma list of " + ",".join(CASES))
    ap.add_argument("--json", type=Path, default=RESULTS)
    ap.add_argument("--fit-gpu", action="store_true",
                    help="fit cost.GPU_EFFICIENCY to the H200 run (calib_cuda_h200.json)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.fit_gpu:
        fit_gpu(args.json)
        return
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]))
        return
    if args.measure:
        measure(args.cases.split(","), args.json)
    compare(args.json)


if __name__ == "__main__":
    main()
