"""FR-Spec: how much a reduced draft vocabulary shortens an EAGLE-3 head's draft step.

    python benchmarks/frspec.py                       # SmolLM2-135M-shaped head, K = 100/45/35/25 %
    python benchmarks/frspec.py --shape demo --threads 1

A draft step is one head forward for one token (the chain's steps 2..k) and the argmax of its
logits: `Eagle3Head.forward` + argmax, as `Eagle3Draft.propose` runs it. The head's LM head
[K, H] is the part FR-Spec shrinks; the decoder layer stays. Weights are random with a realistic
scale (timing does not depend on trained values), the KV cache holds `--context` positions.
The tokens themselves cannot change: the target verifies every draft token on its full
vocabulary (tests/speculative/test_spec_build_draft.py builds the demo with --draft-vocab and
checks greedy output against plain decoding). Shapes:

- smollm2: hidden 576, 9 query / 3 KV heads of 64, FFN 1536, vocabulary 49,152 (SmolLM2-135M);
- minicpm4.1: hidden 4096, 32 / 2 heads of 128, FFN 16384, vocabulary 73,448 (MiniCPM4.1-8B's
  EAGLE-3 head shape);
- demo: the demo model's trained head (arkinfer/demo/eagle3), vocabulary 2,048.

Results: benchmarks/results/frspec_<shape>.json (machine, threads, load, per K the median step
time and its speed-up over the full vocabulary).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from machine import machine_info

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "smollm2": {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
                "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152, "layers": 30},
    "minicpm4.1": {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 2,
                   "head_dim": 128, "intermediate_size": 16384, "vocab_size": 73448,
                   "layers": 32},
}


def random_head(shape: dict):
    """An EAGLE-3 head of `shape` with random weights (normal, std 0.02; norms 1)."""
    from arkinfer.speculative.eagle3_head import (
        Eagle3Config,
        build_head,
        expected_tensors,
    )

    layers = shape["layers"]
    cfg = Eagle3Config(shape["hidden_size"], shape["num_attention_heads"],
                       shape["num_key_value_heads"], shape["head_dim"],
                       shape["intermediate_size"], 1e-6, 10000.0, shape["vocab_size"],
                       shape["vocab_size"], (2, layers // 2, layers - 3))
    gen = torch.Generator().manual_seed(0)
    state = {}
    for name, (dims, kind) in expected_tensors(cfg).items():
        if kind == "int64":
            state[name] = torch.zeros(dims, dtype=torch.int64)
        elif kind == "bool":
            state[name] = torch.ones(dims, dtype=torch.bool)
        elif name.endswith("norm.weight"):
            state[name] = torch.ones(dims)
        else:
            state[name] = torch.randn(dims, generator=gen) * 0.02
    return build_head(cfg, state)


@torch.no_grad()
def step_seconds(head, context: int, steps: int) -> float:
    """Median seconds of one draft step (forward of one token + argmax) after `context`."""
    cfg = head.config
    cache = head.new_cache()
    hidden, _ = head(head.embed(torch.zeros(context, dtype=torch.long)),
                     torch.randn(context, cfg.hidden_size), torch.arange(context), cache)
    hidden = hidden[-1:]
    times = []
    for i in range(steps):
        cache.truncate(context)
        start = time.perf_counter()
        _, logits = head(head.embed(torch.tensor([i % cfg.vocab_size])), hidden,
                           torch.tensor([context]), cache)
        int(torch.argmax(logits[-1]))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=[*SHAPES, "demo"], default="smollm2")
    ap.add_argument("--fractions", default="1.0,0.45,0.35,0.25")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from arkinfer.speculative.frspec import restrict_head

    if args.shape == "demo":
        from arkinfer.frontend.demo import demo_eagle3_path
        from arkinfer.speculative.eagle3_head import load_eagle3

        head = load_eagle3(demo_eagle3_path())
    else:
        head = random_head(SHAPES[args.shape])
    vocab = head.config.vocab_size
    rows = []
    for fraction in (float(f) for f in args.fractions.split(",")):
        k = max(1, round(vocab * fraction))
        # the K lowest ids stand in for the K most frequent: timing depends on K alone
        draft = head if k == vocab else restrict_head(head, torch.arange(k))
        step_seconds(draft, args.context, 20)  # warm-up
        seconds = step_seconds(draft, args.context, args.steps)
        rows.append({"draft_vocab": k, "fraction": round(k / vocab, 4),
                     "step_ms": round(seconds * 1e3, 4)})
        print(f"K = {k:6d} ({k / vocab:5.1%} of {vocab}): {seconds * 1e3:7.3f} ms a draft step",
              flush=True)
    full = rows[0]["step_ms"]
    for row in rows:
        row["speedup"] = round(full / row["step_ms"], 3)
    out = args.json or ROOT / "benchmarks" / "results" / f"frspec_{args.shape}.json"
    out.write_text(json.dumps({
        "shape": args.shape, "hidden_size": head.config.hidden_size, "vocab_size": vocab,
        "context": args.context, "steps": args.steps, "load_average": os.getloadavg(),
        "machine": machine_info(threads=args.threads), "rows": rows}, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
