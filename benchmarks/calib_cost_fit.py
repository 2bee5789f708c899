"""Measure the constants of `quant.calib.cost` (the calibration-time model `plan` uses) on
shapes that belong to none of the models the model is checked on.

    python benchmarks/calib_cost_fit.py [--json benchmarks/results/calib_cost_fit.json]

Run alone on the machine (timings). It measures, with torch's default threads and the recipe
`build --quant marlin` runs (GPTQ 4-bit g128 sym, mse grid, act-order over static groups):

1. the fp32 matmul rate `arkinfer doctor` caches (the rate the predictions scale with);
2. `gptq_quantize` alone on [out, in] weights with random Hessians, one and two static passes,
   and `inverse_cholesky` alone: the lazy updates' efficiency, the column loop's per-column and
   per-element seconds (least squares over the shapes, from the second pass's time) and the
   inverse Cholesky's efficiency;
3. a 2-block calibration of a synthetic MiniCPM-architecture checkpoint (hidden 1536, FFN 3584,
   12 q / 4 KV heads of 128: widths of neither the 1.2B nor the 8B fixture) with quant_speed.py's
   phase instrumentation: the efficiency of the block forward, the Hessians and the per-linear
   SNR reports, and the per-block remainder (reading the block, writing codes and inputs);
4. the resident set of a process that has imported torch and ArkInfer's calibration.

It prints the `PhaseCosts(...)` and `BASE_BYTES` to write into quant/calib/cost.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from machine import machine_info

ROOT = Path(__file__).resolve().parents[1]
# (out, in): single-threaded (in < 2048) and threaded solves; no 2048 / 5632 / 4096 / 16384 input
SOLVE_SHAPES = [(768, 768), (2304, 768), (768, 3072), (1536, 1536), (4608, 1536),
                (3072, 3072), (1536, 6144), (6144, 3072), (3072, 8192)]
SYNTHETIC = {
    "architectures": ["MiniCPMForCausalLM"], "model_type": "minicpm", "vocab_size": 32000,
    "hidden_size": 1536, "num_hidden_layers": 2, "num_attention_heads": 12,
    "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 3584, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096,
    "scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def random_hessian(n: int, tokens: int = 2048, seed: int = 0) -> torch.Tensor:
    """x xᵀ / tokens of `tokens` random rows with uneven channel scales (as activations)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, n, generator=gen) * (0.2 + torch.rand(n, generator=gen) * 2)
    return x.T @ x / tokens


def solve_times(rate: float) -> dict:
    from arkinfer.quant.calib.gptq import (
        THREADED_COLUMNS,
        gptq_quantize,
        inverse_cholesky,
        single_thread,
    )
    from arkinfer.quant.recipe import get_preset

    grid = get_preset("marlin").grid
    rows = []
    for out, inp in SOLVE_SHAPES:
        w = torch.randn(out, inp) * 0.02
        h = random_hessian(inp)
        run = {}
        for passes in (1, 2):
            run[passes] = _timed(lambda p=passes, w=w, h=h: gptq_quantize(
                w, h, bits=4, group_size=128, sym=True, act_order=True, static_groups=True,
                grid=grid, scale_dtype=torch.float16, static_passes=p))
        with single_thread(below=inp):
            chol = min(_timed(lambda h=h: inverse_cholesky(h.clone(), 0.01)) for _ in range(2))
        threads = torch.get_num_threads() if inp >= THREADED_COLUMNS else 1
        rows.append({"out": out, "in": inp, "threads": threads, "one_pass_s": round(run[1], 3),
                     "two_pass_s": round(run[2], 3), "pass_s": round(run[2] - run[1], 3),
                     "cholesky_s": round(chol, 3)})
        print(rows[-1], flush=True)
    # per pass: out·in² / (update·rate_t) + in·column_s + in·out·column_elem_s
    nthreads = torch.get_num_threads()
    a = np.array([[r["out"] * r["in"] ** 2 / (rate if r["threads"] > 1 else rate / nthreads),
                   r["in"], r["in"] * r["out"]] for r in rows])
    b = np.array([r["pass_s"] for r in rows])
    weights = 1 / b  # relative error: small and large solves alike
    coef, *_ = np.linalg.lstsq(a * weights[:, None], b * weights, rcond=None)
    chol_eff = [r["in"] ** 3 / ((rate if r["threads"] > 1 else rate / nthreads) * r["cholesky_s"])
                for r in rows if r["in"] >= 1536]
    return {"shapes": rows, "update": round(1 / coef[0], 3), "column_s": float(f"{coef[1]:.3g}"),
            "column_elem_s": float(f"{coef[2]:.3g}"),
            "cholesky": round(float(np.median(chol_eff)), 3)}


def block_phases(rate: float) -> dict:
    from arkinfer.quant.calib.cost import block_linears
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.calib_data import calibration_from_ids
    from arkinfer.quant.recipe import get_preset, static_passes_for
    from quant_speed import Phases, instrument

    from arkinfer.testing.synthetic import write_checkpoint

    cfg = SYNTHETIC
    n, t = 8, 512
    with tempfile.TemporaryDirectory() as tmp:
        model = write_checkpoint(Path(tmp) / "model", cfg, seed=0, dtype=torch.bfloat16, std=0.02)
        gen = torch.Generator().manual_seed(0)
        calib = calibration_from_ids(torch.randint(0, cfg["vocab_size"], (n, t), generator=gen))
        recipe = get_preset("marlin")
        options = {"act_order": True, "static_groups": True,
                   "static_passes": static_passes_for(recipe.format)}
        per_block: list[float] = []
        phases = Phases()
        instrument(phases)
        try:
            calibrate(model, recipe, calib, Path(tmp) / "work", options=options,
                      progress=lambda i, _n, s: per_block.append(s))
        finally:
            phases.restore()
    blocks = cfg["num_hidden_layers"]
    sec, flops = phases.seconds, phases.flops
    other = sum(per_block) - sec["forward"] - sec["hessian"] - sec["solve"] - sec["report"]
    linears = block_linears(cfg)
    params = sum(lin.out * lin.inp for lin in linears)
    report_flops = 4.0 * sum(lin.out * lin.inp ** 2 for lin in linears) * blocks
    return {"config": {k: cfg[k] for k in ("hidden_size", "intermediate_size",
                                           "num_attention_heads", "num_key_value_heads")},
            "samples": n, "seq_len": t, "block_seconds": [round(s, 2) for s in per_block],
            "block_params": params,
            "phases": {p: {"seconds": round(s, 2), "gflop": round(flops.get(p, 0) / 1e9, 1)}
                       for p, s in sorted(sec.items())},
            "forward": round(flops["forward"] / sec["forward"] / rate, 3),
            "hessian": round(flops["hessian"] / sec["hessian"] / rate, 3),
            "report": round(report_flops / sec["report"] / rate, 3),
            "block_overhead_s": round(other / blocks, 2)}


def base_bytes() -> int:
    code = ("import torch, arkinfer.quant.calib.stream, arkinfer.quant.calib.gptq\n"
            "for l in open('/proc/self/status'):\n"
            "    l.startswith('VmHWM:') and print(int(l.split()[1]) * 1024)")
    return int(subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              check=True).stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path,
                    default=ROOT / "benchmarks" / "results" / "calib_cost_fit.json")
    args = ap.parse_args()
    from arkinfer.targets.host import host_measurement

    load_before = os.getloadavg()[0]
    rate = host_measurement(measure_if_missing=True)["matmul_fp32_flop_s"]
    print(f"fp32 matmul rate {rate / 1e9:.1f} GFLOP/s (doctor's, cached)", flush=True)
    solve = solve_times(rate)
    block = block_phases(rate)
    base = base_bytes()
    result = {"machine": machine_info(), "threads": torch.get_num_threads(),
              "matmul_fp32_flop_s": rate, "solve": solve, "block": block, "base_bytes": base,
              "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"CPU_COSTS = PhaseCosts(forward={block['forward']}, hessian={block['hessian']}, "
          f"update={solve['update']}, cholesky={solve['cholesky']}, report={block['report']}, "
          f"column_s={solve['column_s']:.3g}, column_elem_s={solve['column_elem_s']:.3g}, "
          f"block_overhead_s={block['block_overhead_s']})")
    print(f"BASE_BYTES = {base / 2**20:.0f} * 2**20")


if __name__ == "__main__":
    main()
