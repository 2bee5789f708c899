"""Is `arkinfer bench` honest? pp512 / tg128 of a SmolLM2 Q4_0 GGUF artifact through ArkInfer's
harness (load_runner + run_bench, what `arkinfer bench` runs) vs the same GGUF timed directly with
llama-cpp-python in the same process, interleaved run by run so machine load hits both alike.

    python benchmarks/bench_vs_llamacpp.py [--artifact DIR] [-r 5] [--json results/bench_vs_llamacpp.json]

Without --artifact, builds `arkinfer build SmolLM2 --target host --backend gguf --quant q4_0`
into a temporary folder first (RTN, so calibration is quick). Direct timing: a fresh
`llama_cpp.Llama(n_ctx=1024, n_batch=512, logits_all=False)`; pp = one `eval` of 512 tokens after
`reset()`; tg = 128 single-token `eval`s after a one-token prompt — llama-bench's definitions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from machine import machine_info


def build_artifact(work: Path) -> Path:
    from arkinfer.testing.smollm2 import smollm2_hf_dir
    from arkinfer.pipeline.build import build
    from arkinfer.pipeline.plan import CalibSettings, resolve_plan

    plan = resolve_plan(str(smollm2_hf_dir()), target="host", backend="gguf", quant="q4_0",
                        out=work / "smollm2.host.q4_0", calib=CalibSettings(None, 8, 128))
    return build(plan).path


def direct_times(gguf: Path, tokens: list[int], n_prompt: int, n_gen: int, threads: int):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=1024, n_batch=512, logits_all=False,
                          verbose=False, n_threads=threads)

    def pp() -> float:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(tokens[:n_prompt])
        return time.perf_counter() - t0

    def tg() -> float:
        llm.reset()
        llm.eval(tokens[:1])
        t0 = time.perf_counter()
        for tok in tokens[1:1 + n_gen]:
            llm.eval([tok])
        return time.perf_counter() - t0

    return pp, tg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", type=Path)
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch

    from arkinfer.pipeline.artifact import load_runner
    from arkinfer.pipeline.bench import BenchSpec, bench_tokens, run_bench

    with tempfile.TemporaryDirectory() as tmp:
        artifact = args.artifact or build_artifact(Path(tmp))
        manifest, runner = load_runner(artifact, bench=True)
        threads = torch.get_num_threads()
        tokens = bench_tokens(runner, 1 + 512)
        pp, tg = direct_times(artifact / "model.gguf", tokens, 512, 128, threads)
        pp(), tg()  # warm-up
        ours = {"pp512": [], "tg128": []}
        direct = {"pp512": [], "tg128": []}
        spec = BenchSpec(prompts=(512,), gens=(128,), depths=(0,), repetitions=1, warmup=0)
        run_bench(runner, manifest, spec)  # warm-up
        for i in range(args.repetitions):
            for row in run_bench(runner, manifest, spec):
                ours[row["test"]].append(row["avg_ts"])
            direct["pp512"].append(512 / pp())
            direct["tg128"].append(128 / tg())
            print(f"rep {i + 1}: ours pp {ours['pp512'][-1]:.1f} tg {ours['tg128'][-1]:.2f} | "
                  f"direct pp {direct['pp512'][-1]:.1f} tg {direct['tg128'][-1]:.2f}", flush=True)
    rows = []
    for test in ("pp512", "tg128"):
        a, b = statistics.fmean(ours[test]), statistics.fmean(direct[test])
        rows.append({"test": test, "arkinfer_bench_ts": a, "arkinfer_bench_stddev": statistics.stdev(ours[test]),
                     "llama_cpp_direct_ts": b, "direct_stddev": statistics.stdev(direct[test]),
                     "ratio": a / b, "within_10_percent": abs(a / b - 1) <= 0.10})
    print("| test | arkinfer bench t/s | llama-cpp-python direct t/s | ratio |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['test']} | {r['arkinfer_bench_ts']:.2f} ± {r['arkinfer_bench_stddev']:.2f} | "
              f"{r['llama_cpp_direct_ts']:.2f} ± {r['direct_stddev']:.2f} | {r['ratio']:.3f} |")
    if args.json:
        import llama_cpp

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine_info(threads=threads, llama_cpp_python=llama_cpp.__version__),
            "load_average": list(__import__("os").getloadavg()),
            "artifact": manifest["name"], "repetitions": args.repetitions, "rows": rows},
            indent=2) + "\n")


if __name__ == "__main__":
    main()
