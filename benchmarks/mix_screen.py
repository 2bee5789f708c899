"""Screen a new GGUF type for the mixed-precision allocation before implementing it: the
allocation's predicted KL with the type added as a stand-in option.

    python benchmarks/mix_screen.py [--json benchmarks/results/mix_screen.json]

On SmolLM2-135M with the `gptq-mix` recipe's sensitivity (Kronecker-factored Fisher on 16
windows of 512 tokens of the built-in corpus, 64 calibration windows loaded as
quant_quality.py loads them, each type's error GPTQ's under H: `quant.mix.plan_mix`'s first two
steps), the script allocates at 4.9 bits per weight:
- as the preset does (the baseline);
- with IQ4_XS (ggml's 4.25-bit super-block form of IQ4_NL: 6-bit sub-scales of 32 weights under
  one fp16 scale per 256) added for the tensors whose rows are whole super-blocks (the 1536-wide
  down projections), its error taken as IQ4_NL's times 1.0 / 1.05 / 1.15 (IQ4_XS rounds each
  sub-scale to 6 bits, so its error is at least IQ4_NL's);
- at budgets of 5.0 / 5.1 / 5.5 bits (what more bits buy, for scale).
It also lists the down projections' options, which show why: their Q4_K error is a fraction of
IQ4_NL's (the float model comes from an asymmetric Q4_1 file), so a symmetric 4.25-bit type
gains the allocation almost nothing.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from machine import machine_info

ROOT = Path(__file__).resolve().parents[1]


def costs_of_the_preset() -> list:
    from arkinfer.frontend.checkpoint import load_model, open_checkpoint
    from arkinfer.quant import mix
    from arkinfer.quant.calib_data import load_calibration
    from arkinfer.testing.smollm2 import smollm2_hf_dir

    ckpt = open_checkpoint(smollm2_hf_dir())
    eos = ckpt.config.eos_token_id
    data = load_calibration(ckpt.tokenizer, None, 64, 512, 0, eos if isinstance(eos, int) else None)
    windows = data.ids[:mix.FISHER_WINDOWS, :mix.FISHER_TOKENS]
    model = load_model(ckpt)
    factors = mix.kronecker_factors(model, windows, seed=0)
    return mix.format_costs(model, factors, mix.CANDIDATES, gptq=True)


def with_stand_in(costs: list, factor: float) -> list:
    """`costs` with an IQ4_XS stand-in (IQ4_NL's error x factor, 4.25 bits) wherever Q4_K fits."""
    from arkinfer.quant.mix import Option

    out = copy.deepcopy(costs)
    for c in out:
        by_fmt = {o.format: o for o in c.options}
        if "gguf-q4_k" in by_fmt and "gguf-iq4_nl" in by_fmt:
            c.options.append(Option("iq4_xs (stand-in)", 4.25,
                                    by_fmt["gguf-iq4_nl"].kl * factor))
            c.options.sort(key=lambda o: (o.bits, o.kl))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path,
                    default=ROOT / "benchmarks" / "results" / "mix_screen.json")
    args = ap.parse_args()
    from arkinfer.quant.mix import allocate

    t0 = time.perf_counter()
    costs = costs_of_the_preset()
    rows = {}

    def row(name: str, plan) -> None:
        rows[name] = {"bits_per_weight": plan.bits_per_weight,
                      "predicted_kl": round(plan.predicted_kl, 5), "types": plan.counts()}
        print(f"{name}: predicted KL {plan.predicted_kl:.5f} at {plan.bits_per_weight} bits, "
              f"{plan.counts()}", flush=True)

    row("preset (4.9 bits)", allocate(costs, 4.9))
    for factor in (1.0, 1.05, 1.15):
        row(f"with IQ4_XS at IQ4_NL's error x {factor}", allocate(with_stand_in(costs, factor), 4.9))
    for budget in (5.0, 5.1, 5.5):
        row(f"preset at {budget} bits", allocate(costs, budget))
    downs = {c.name: {o.format: f"{o.kl:.3g}" for o in c.options}
             for c in costs if c.name.endswith("down_proj")}
    result = {"model": "SmolLM2-135M-Instruct", "rows": rows, "down_proj_options": downs,
              "seconds": round(time.perf_counter() - t0, 1), "threads": torch.get_num_threads(),
              "machine": machine_info()}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
