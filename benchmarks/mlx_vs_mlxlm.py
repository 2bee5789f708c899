"""Is ArkInfer's MLX runtime as fast as mlx-lm? SmolLM2-135M 4-bit (group 64): pp512 and tg128
through ArkInfer's MLX Runner (backends/mlx/runner.py, what `arkinfer bench` times) vs mlx-lm's
own `generate_step` on the same folder, with llama.cpp Q4_0 of the same model alongside; runs
interleaved rep by rep so machine load hits all three alike.

    python benchmarks/mlx_vs_mlxlm.py [--folder DIR] [-r 3] [--json results/mlx_vs_mlxlm.json]

--folder: any folder in mlx-lm's layout (an `arkinfer build --target apple-m4 --quant mlx4`
artifact, or mlx_lm.convert output). Without it, `mlx_lm.convert -q --q-bits 4 --q-group-size 64`
of the imported SmolLM2 is written to a temporary folder, so both runtimes read mlx-lm's own bytes.

Definitions (llama-bench's, as `arkinfer bench`): pp = one prefill of 512 tokens from an empty
cache until the last position's logits are evaluated; tg = 128 single-token steps after a
one-token prompt. mlx-lm: pp = `generate_step(prompt_512)` until its first token (its prefill of
511 tokens + the last-token step); tg = the 128 tokens after its first one (greedy; mlx-lm
pipelines steps with mx.async_eval). llama.cpp: benchmarks/bench_vs_llamacpp.py's direct timing.
On Linux MLX runs on its CPU backend (mlx[cpu]: reference BLAS, unvectorised quantized_matmul), so
absolute numbers are far below Apple silicon's; the ratio is what this measures.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from importlib import metadata
from pathlib import Path

from machine import machine_info
from runner_timers import interleaved_rates, rate_rows, runner_timers

N_PROMPT, N_GEN = 512, 128


def convert_smollm2(work: Path) -> Path:
    from mlx_lm import convert

    from arkinfer.testing.smollm2 import smollm2_hf_dir

    out = work / "smollm2-135m-mlx-q4-g64"
    convert(str(smollm2_hf_dir()), mlx_path=str(out), quantize=True, q_group_size=64, q_bits=4)
    return out


def ours(folder: Path, tokens: list[int]):
    from arkinfer.backends.mlx.runner import load_runner

    runner = load_runner(folder, {}, bench=True)

    pp, tg = runner_timers(runner, tokens)
    return (lambda n=N_PROMPT: pp(n)), (lambda n=N_GEN: tg(n))


def mlx_lm(folder: Path, tokens: list[int]):
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, _ = load(str(folder))

    def pp(n: int = N_PROMPT) -> float:
        t0 = time.perf_counter()
        token, _ = next(generate_step(mx.array(tokens[:n]), model, max_tokens=1))
        mx.eval(token)
        return time.perf_counter() - t0

    def tg(n: int = N_GEN) -> float:
        steps = generate_step(mx.array(tokens[:1]), model, max_tokens=n + 1)
        next(steps)
        t0 = time.perf_counter()
        for _ in range(n):
            token, _ = next(steps)
        mx.eval(token)
        return time.perf_counter() - t0

    return pp, tg


def llama_cpp_q4_0(work: Path, tokens: list[int], threads: int):
    from bench_vs_llamacpp import build_artifact, direct_times

    artifact = build_artifact(work)
    return direct_times(artifact / "model.gguf", tokens, N_PROMPT, N_GEN, threads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", type=Path)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch

    from arkinfer.frontend.tokenizer import load_tokenizer
    from arkinfer.pipeline.verify import EVAL_TEXT

    threads = torch.get_num_threads()
    load_before = list(os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or convert_smollm2(Path(tmp))
        tokens = load_tokenizer(folder).encode(EVAL_TEXT.read_text(encoding="utf-8"),
                                               add_special_tokens=False)[:1 + N_PROMPT]
        runs = {"arkinfer_mlx": ours(folder, tokens), "mlx_lm": mlx_lm(folder, tokens)}
        if not args.no_llamacpp:
            runs["llama_cpp_q4_0"] = llama_cpp_q4_0(Path(tmp), tokens, threads)
        for name, (pp, tg) in runs.items():  # warm-up (MLX: short, so graphs and caches exist)
            if name == "llama_cpp_q4_0":
                pp(), tg()
            else:
                pp(16), tg(4)
        samples = interleaved_rates(runs, args.repetitions, N_PROMPT, N_GEN)
    load_after = list(os.getloadavg())
    rows = rate_rows(samples)
    for row in rows:
        row["ratio_arkinfer_over_mlx_lm"] = row["arkinfer_mlx_ts"] / row["mlx_lm_ts"]
        row["meets_0_9x"] = row["ratio_arkinfer_over_mlx_lm"] >= 0.9
    print("| test | ArkInfer MLX t/s | mlx-lm t/s | ratio | llama.cpp Q4_0 t/s |")
    print("|---|---|---|---|---|")
    for r in rows:
        cpp = f"{r['llama_cpp_q4_0_ts']:.2f}" if "llama_cpp_q4_0_ts" in r else "-"
        print(f"| {r['test']} | {r['arkinfer_mlx_ts']:.2f} ± {r['arkinfer_mlx_stddev']:.2f} | "
              f"{r['mlx_lm_ts']:.2f} ± {r['mlx_lm_stddev']:.2f} | "
              f"{r['ratio_arkinfer_over_mlx_lm']:.3f} | {cpp} |")
    if args.json:
        versions = {p: metadata.version(p) for p in ("mlx", "mlx-lm")}
        if not args.no_llamacpp:
            versions["llama_cpp_python"] = metadata.version("llama_cpp_python")
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine_info(threads=threads, **versions),
            "load_average_before": load_before, "load_average_after": load_after,
            "threads": {"llama_cpp": threads, "mlx": "MLX CPU backend default",
                        "cpu_count": os.cpu_count()},
            "folder": "mlx_lm.convert SmolLM2-135M-Instruct q4 g64" if not args.folder
            else str(args.folder),
            "repetitions": args.repetitions, "rows": rows,
            "note": "taken on a shared, loaded 2-core machine; re-take on a quiet machine"},
            indent=2) + "\n")


if __name__ == "__main__":
    main()
