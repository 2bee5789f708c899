"""Plain against speculative greedy decoding of one artifact through its own runner: tokens/s of
each, the speed-up, the mean accepted length per verify step and where the time went, with the
machine recorded. Greedy outputs must be identical (the script fails otherwise).

    python benchmarks/speculative.py dist/demo.host.q4_0 --draft lookup --new 64 --reps 2
    python benchmarks/speculative.py dist/smollm2.host.q4_0 --draft dist/smollm2.host.q4_0

The default prompt asks to repeat a given text (a repetitive task, where prompt lookup drafts
well); --prompt-file gives another. Writes benchmarks/results/speculative.json (--json).
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

from arkinfer.pipeline.artifact import load_runner
from arkinfer.pipeline.draft import parse_draft
from arkinfer.speculative import (
    SpecStats,
    plain_generate,
    speculative_generate,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "speculative.json"
TEXT = ("The committee met on Tuesday to review the budget for the new library. After a long "
        "discussion, the members agreed to fund the children's reading room, to repair the roof "
        "before winter, and to extend the opening hours on weekends. ")
PROMPT = f"Text: {TEXT}\nRepeat the text exactly.\nText: {TEXT}\nText: "


def timed(tokens_of) -> tuple[list[int], float]:
    start = time.perf_counter()
    out = list(tokens_of())
    return out, time.perf_counter() - start


def same_batch_threads(runner, threads: int) -> None:
    """llama-cpp-python runs multi-token batches on every core whatever n_threads says
    (n_threads_batch defaults to cpu_count): a verify step is such a batch, so on a busy machine
    it would wait on threads a single-token decode never uses. Give both the same count."""
    llm = getattr(runner, "llm", None)
    if llm is not None:
        import llama_cpp

        llama_cpp.llama_set_n_threads(llm.ctx, threads, threads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--draft", default="lookup", help="lookup | an artifact folder (draft model)")
    ap.add_argument("--k", type=int, default=4, help="draft tokens per verify step")
    ap.add_argument("--new", type=int, default=128, help="tokens to generate")
    ap.add_argument("--reps", type=int, default=3, help="repetitions, plain and speculative "
                    "interleaved")
    ap.add_argument("--threads", type=int, default=1, help="runtime threads (torch's count)")
    ap.add_argument("--prompt-file", type=Path, help="the prompt text (default: a repeat task)")
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    manifest, target = load_runner(args.artifact, bench=True)
    draft = parse_draft(args.draft, target)
    for runner in (target, getattr(draft, "runner", None)):
        same_batch_threads(runner, args.threads)
    prompt_text = args.prompt_file.read_text(encoding="utf-8") if args.prompt_file else PROMPT
    prompt = target.tokenize(prompt_text)
    # one untimed run of each first: llama.cpp's first batches allocate and page in the weights
    list(plain_generate(target, prompt, 4))
    list(speculative_generate(target, draft, prompt, 4, k=args.k))
    load_before = os.getloadavg()
    plain_rates, spec_rates, runs = [], [], []
    for rep in range(args.reps):
        plain, plain_s = timed(lambda: plain_generate(target, prompt, args.new))
        stats = SpecStats()
        spec, spec_s = timed(lambda stats=stats: speculative_generate(
            target, draft, prompt, args.new, k=args.k, stats=stats))
        if spec != plain:
            raise SystemExit(f"greedy outputs differ at token "
                             f"{next(i for i, (a, b) in enumerate(zip(spec, plain)) if a != b)}")
        plain_rates.append(len(plain) / plain_s)
        spec_rates.append(len(spec) / spec_s)
        runs.append({"plain_s": plain_s, "speculative_s": spec_s, **stats.as_dict()})
        print(f"rep {rep + 1}: plain {plain_rates[-1]:.1f} tok/s | speculative "
              f"{spec_rates[-1]:.1f} tok/s | accepted length {stats.mean_accepted_length:.2f} "
              f"| draft {stats.draft_s:.3f} s verify {stats.verify_s:.3f} s", flush=True)
    result = {
        "machine": machine_info(), "threads": args.threads,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "artifact": str(args.artifact), "backend": manifest["backend"]["name"],
        "draft": args.draft, "k": args.k, "prompt_tokens": len(prompt), "new_tokens": args.new,
        "plain_tokens_per_s": statistics.fmean(plain_rates),
        "speculative_tokens_per_s": statistics.fmean(spec_rates),
        "speedup": statistics.fmean(spec_rates) / statistics.fmean(plain_rates),
        "mean_accepted_length": statistics.fmean(r["mean_accepted_length"] for r in runs),
        "greedy_identical": True, "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"speed-up {result['speedup']:.2f}x, mean accepted length "
          f"{result['mean_accepted_length']:.2f}; written to {args.json}")


if __name__ == "__main__":
    main()
