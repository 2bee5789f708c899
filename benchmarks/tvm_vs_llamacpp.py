"""Is the tvm backend's host (llvm) build as fast as llama.cpp? SmolLM2-135M 4-bit: pp and tg
through the TVM Runner (backends/tvm/runner.py, what `arkinfer bench` times) vs llama.cpp's Q4_0
of the same model, same machine, same run, interleaved rep by rep so machine load hits both.

    python benchmarks/tvm_vs_llamacpp.py [--artifact DIR] [-r 3] \
        [--json benchmarks/results/tvm_vs_llamacpp.json]
    python benchmarks/tvm_vs_llamacpp.py --prompt 16 --gen 8 -r 1     # a quick smoke run

--artifact: an `arkinfer build SMOLLM2 --target android --quant q4_0` artifact (its host library
is what is timed). Without it, one is built into a temporary folder with `--option devices=none`
(host build only; the verify gate runs as in any build). llama.cpp: the Q4_0 artifact and direct
timing of benchmarks/bench_vs_llamacpp.py (llama-cpp-python), with torch's thread count.

Definitions (llama-bench's, as `arkinfer bench`): pp = one prefill of N tokens from an empty
cache until the last position's logits are back; tg = N single-token steps after a one-token
prompt. TVM threads: TVM_NUM_THREADS if set, else torch's thread count (the Runner sets it:
backends/tvm/runner.py use_torch_threads), the same count llama.cpp gets; the host build's
schedules are recorded from tvm_module.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path

from machine import machine_info
from runner_timers import interleaved_rates, rate_rows, runner_timers


def build_tvm_artifact(work: Path) -> Path:
    from arkinfer.pipeline.build import build
    from arkinfer.pipeline.plan import CalibSettings, resolve_plan
    from arkinfer.testing.smollm2 import smollm2_hf_dir

    plan = resolve_plan(str(smollm2_hf_dir()), target="android", backend="tvm", quant="q4_0",
                        out=work / "smollm2.android.q4_0", calib=CalibSettings(None, 8, 128),
                        options={"devices": "none"})
    return build(plan).path


def tvm_times(artifact: Path, tokens: list[int], n_prompt: int, n_gen: int):
    from arkinfer.backend import get_backend

    runner = get_backend("tvm").load(artifact)

    pp, tg = runner_timers(runner, tokens)
    return lambda: pp(n_prompt), lambda: tg(n_gen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", type=Path)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch
    from bench_vs_llamacpp import build_artifact, direct_times

    from arkinfer.frontend.tokenizer import load_tokenizer
    from arkinfer.pipeline.verify import EVAL_TEXT

    threads = torch.get_num_threads()
    load_before = list(os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        artifact = args.artifact or build_tvm_artifact(Path(tmp))
        tokens = load_tokenizer(artifact).encode(EVAL_TEXT.read_text(encoding="utf-8"),
                                                 add_special_tokens=False)
        while len(tokens) < 1 + args.prompt:
            tokens = tokens + tokens
        tokens = tokens[:1 + max(args.prompt, args.gen)]
        runs = {"arkinfer_tvm": tvm_times(artifact, tokens, args.prompt, args.gen)}
        if not args.no_llamacpp:
            gguf = build_artifact(Path(tmp)) / "model.gguf"
            runs["llama_cpp_q4_0"] = direct_times(gguf, tokens, args.prompt, args.gen, threads)
        for pp, tg in runs.values():  # warm-up
            pp(), tg()
        samples = interleaved_rates(runs, args.repetitions, args.prompt, args.gen,
                                    (f"pp{args.prompt}", f"tg{args.gen}"))
        info = json.loads((artifact / "tvm_module.json").read_text())
    load_after = list(os.getloadavg())
    rows = rate_rows(samples)
    for row in rows:
        if "llama_cpp_q4_0_ts" in row:
            row["ratio_tvm_over_llama_cpp"] = row["arkinfer_tvm_ts"] / row["llama_cpp_q4_0_ts"]
            row["within_2x"] = row["ratio_tvm_over_llama_cpp"] >= 0.5
    print("| test | ArkInfer TVM (llvm) t/s | llama.cpp Q4_0 t/s | ratio |")
    print("|---|---|---|---|")
    for r in rows:
        cpp = f"{r['llama_cpp_q4_0_ts']:.2f}" if "llama_cpp_q4_0_ts" in r else "-"
        ratio = f"{r['ratio_tvm_over_llama_cpp']:.3f}" if "ratio_tvm_over_llama_cpp" in r else "-"
        print(f"| {r['test']} | {r['arkinfer_tvm_ts']:.2f} ± {r['arkinfer_tvm_stddev']:.2f} | "
              f"{cpp} | {ratio} |")
    print(f"load average before {load_before}, after {load_after}; threads: llama.cpp "
          f"{threads}, TVM {os.environ.get('TVM_NUM_THREADS')}")
    if args.json:
        versions = {"apache-tvm": metadata.version("apache-tvm")}
        if not args.no_llamacpp:
            versions["llama_cpp_python"] = metadata.version("llama_cpp_python")
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine_info(threads=threads, **versions),
            "load_average_before": load_before, "load_average_after": load_after,
            "threads": {"llama_cpp": threads,
                        "tvm": os.environ.get("TVM_NUM_THREADS"),
                        "cpu_count": os.cpu_count()},
            "host_target": info["host"]["target"], "schedules": info.get("schedules", {}),
            "artifact": str(args.artifact) if args.artifact else
            "SmolLM2-135M-Instruct, arkinfer build --target android --quant q4_0, devices=none",
            "repetitions": args.repetitions, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
