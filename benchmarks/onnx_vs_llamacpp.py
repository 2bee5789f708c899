"""Decode speed of the tensorrt backend's host runner (onnxruntime: int4 via MatMulNBits, RMSNorm /
RoPE + attention via onnxruntime's fused contrib ops, KV cache in bound buffers) vs llama.cpp's
Q4_0 on the same real model (SmolLM2-135M-Instruct), same machine, same run; optionally vs
onnxruntime-genai's model builder output too (`--genai-python`, genai_builder.py).

SmolLM2's 576-wide rows cannot take Marlin (576 % 128 != 0), so the artifact is the `--quant gptq`
layout with group size 64 (RTN codes: speed does not depend on how codes were chosen), lowered by
the tensorrt backend exactly as `arkinfer build` does; llama.cpp runs the Q4_0 requantisation of
the shipped Q4_1 GGUF (llama.cpp's own quantiser, default per-tensor rules). All get the same
threads, the same prompt ids, a warm-up, and `--tokens` timed greedy-fed decode steps; the
repetitions go round-robin over the runtimes so that a noisy neighbour hits them all alike.

Like the `arkinfer` command, the script restarts itself with glibc's huge-page malloc
(arkinfer/huge_pages.py; ARKINFER_HUGE_PAGES=0: not), and every runtime in it and in its child
processes runs with it; with --genai-python, our runner and genai's generator are also timed in
processes started without it (`*_plain_malloc`), as a genai user runs genai.

    python benchmarks/onnx_vs_llamacpp.py --accuracy-level 4 --nbits-baseline \
        --genai-python /tmp/genai-venv/bin/python --json benchmarks/results/onnx_vs_llamacpp_int8.json

On a CPU with AMX, llama-cpp-python built natively (-march=native) crashes in
ggml_backend_amx_mul_mat; `make setup` builds it without AMX (see the Makefile).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from machine import machine_info

from arkinfer.huge_pages import reexec_with_huge_page_malloc, without_huge_page_malloc
from arkinfer.huge_pages import status as huge_page_status


def _decode_rate(runner, prompt: list[int], steps: int) -> float:
    """tokens/s of `steps` decode calls after a prefill of `prompt` (greedy with numpy's argmax,
    as arkinfer.generate.sample_next does: a torch argmax would wake torch's thread pool between
    the runtime's steps)."""
    runner.reset()
    token = int(runner.prefill(prompt).numpy().argmax())
    t0 = time.perf_counter()
    for _ in range(steps):
        token = int(runner.decode(token).numpy().argmax())
    return steps / (time.perf_counter() - t0)


# Our runner alone in a fresh process, timed as genai's generator is (genai_builder._GENERATOR):
# the fair partner of that row, since sharing a process with llama.cpp and the other sessions
# measured 10-15 % slower for our runner than the same runner alone.
_OWN_PROCESS = """
import json, sys
sys.path.insert(0, sys.argv[6])   # benchmarks/: this file's _decode_rate
import onnxruntime
from arkinfer.backends.onnx.runner import OnnxRunner
from onnx_vs_llamacpp import _decode_rate
art, prompt, steps, threads, level = sys.argv[1], json.loads(sys.argv[2]), *map(int, sys.argv[3:6])
runner = OnnxRunner(art, threads=threads, accuracy_level=level)
rates = [_decode_rate(runner, prompt, steps) for _ in range(2)]   # a warm-up pass, a timed one
print(json.dumps({"rate": rates[-1], "onnxruntime": onnxruntime.__version__}))
"""


_OWN_VERSIONS: dict[str, str] = {}   # interpreter -> the onnxruntime its child reported


def _own_process_rate(art: Path, prompt: list[int], steps: int, threads: int, level: int,
                      python: str = sys.executable, env: dict[str, str] | None = None) -> float:
    """tokens/s of our runner in a process of its own (one warm-up pass, one timed), run by
    `python` (another interpreter with arkinfer installed: its onnxruntime), in `env` (default:
    this process's environment)."""
    done = subprocess.run([python, "-c", _OWN_PROCESS, str(art), json.dumps(prompt),
                           str(steps), str(threads), str(level), str(Path(__file__).parent)],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the onnxruntime child ({python}) failed:\n{done.stderr[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    _OWN_VERSIONS[python] = report["onnxruntime"]
    return report["rate"]


def _round_robin(timers: dict, reps: int) -> dict[str, list[float]]:
    """name -> `reps` rates; one warm-up round first, then the runtimes take turns, in reverse
    order every other round (no runtime always runs right after the same neighbour, whose
    threads may still be spinning or whose process just exited)."""
    rates: dict[str, list[float]] = {name: [] for name in timers}
    for rep in range(reps + 1):
        order = list(timers.items())
        for name, timer in (order if rep % 2 else order[::-1]):
            rate = timer()
            if rep:
                rates[name].append(rate)
    return rates


def _artifact(work: Path) -> Path:
    from arkinfer.quant import QuantRecipe
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.calib_data import calibration_from_ids
    from arkinfer.quant.export import export_folder

    from arkinfer.backend import LowerRequest, get_backend
    from arkinfer.testing.smollm2 import smollm2_hf_dir

    recipe = QuantRecipe("rtn", "gptq", 4, 64, sym=True, skip=())
    ids = torch.randint(0, 49152, (2, 32), generator=torch.Generator().manual_seed(0))
    run = calibrate(smollm2_hf_dir(), recipe, calibration_from_ids(ids), work / "calib")
    folder = export_folder(run, work / "smollm2-gptq-g64")
    out = work / "artifact"
    get_backend("tensorrt").lower(LowerRequest(model_dir=folder, source_dir=smollm2_hf_dir(),
                                               recipe=recipe, dtype="f16", target=None,
                                               out_dir=out))
    return out


def _q4_0(src: Path, dst: Path) -> None:
    """llama.cpp's own quantiser (what `llama-quantize --allow-requantize ... Q4_0` runs)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = 2  # LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not requantise {src} to Q4_0")


def _entry(rates: list[float], **extra) -> dict:
    """median (the headline) and best (the least disturbed round, on a shared machine)."""
    return {**extra, "tokens_per_s": round(statistics.median(rates), 2),
            "best_tokens_per_s": round(max(rates), 2), "runs": [round(r, 2) for r in rates]}


def _load_seconds(runner_cls, art: Path, threads: int, level: int) -> dict[str, float]:
    """Seconds to construct the runner: rewriting the graph in memory, writing the cached
    graph (the first load of an artifact), and reading it (every later load; host_graph.py),
    the cache in an empty folder of its own."""
    out, before = {}, os.environ.get("ARKINFER_ONNX_HOST_CACHE")
    with tempfile.TemporaryDirectory() as cache_dir:
        os.environ["ARKINFER_ONNX_HOST_CACHE"] = cache_dir
        try:
            for name, cache in (("in_memory", False), ("first_cached", True), ("cached", True)):
                t0 = time.perf_counter()
                runner_cls(art, ops="contrib", threads=threads, accuracy_level=level, cache=cache)
                out[name] = round(time.perf_counter() - t0, 2)
        finally:
            if before is None:
                os.environ.pop("ARKINFER_ONNX_HOST_CACHE")
            else:
                os.environ["ARKINFER_ONNX_HOST_CACHE"] = before
    return out


def pair_ratios(a: list[float], b: list[float]) -> dict:
    """a[i] / b[i] over the rounds (both timed in round i, minutes apart at most): the median,
    mean and standard deviation of the per-round ratio. On a VM whose speed drifts between
    minutes and differs between processes, this is the comparison with an error bar."""
    ratios = [x / y for x, y in zip(a, b)]
    return {"median": round(statistics.median(ratios), 3), "mean": round(statistics.mean(ratios), 3),
            "sd": round(statistics.stdev(ratios), 3) if len(ratios) > 1 else None,
            "n": len(ratios)}


def run(threads: int, steps: int, reps: int, prompt_len: int, accuracy_level: int = 0,
        nbits_baseline: bool = False, genai_python: str | None = None) -> dict:
    from arkinfer.backends.gguf.runner import LlamaCppRunner
    from arkinfer.backends.onnx.runner import OnnxRunner

    from arkinfer.testing.smollm2 import smollm2_gguf_path, smollm2_hf_dir

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        art = _artifact(work)
        load_s = _load_seconds(OnnxRunner, art, threads, accuracy_level)
        onnx_runner = OnnxRunner(art, ops="contrib", threads=threads,
                                 accuracy_level=accuracy_level)
        text = (Path(__file__).parents[1] / "arkinfer/data/corpus_eval.txt").read_text()[:4000]
        prompt = onnx_runner.tokenize(text)[:prompt_len]
        q4_0 = work / "smollm2-q4_0.gguf"
        _q4_0(smollm2_gguf_path(), q4_0)
        llama = LlamaCppRunner(q4_0, n_ctx=prompt_len + steps + 8, n_threads=threads)
        timers = {"onnxruntime": lambda: _decode_rate(onnx_runner, prompt, steps),
                  "llama_cpp": lambda: _decode_rate(llama, prompt, steps)}
        if nbits_baseline:
            nbits = OnnxRunner(art, ops="nbits", threads=threads, accuracy_level=accuracy_level)
            timers["onnxruntime_nbits_only"] = lambda: _decode_rate(nbits, prompt, steps)
        if genai_python:
            import genai_builder

            folder = genai_builder.build(genai_python, smollm2_hf_dir(), work / "genai", 64,
                                         accuracy_level)
            same = genai_builder.GenaiGraphRunner(folder, threads)
            timers["genai_model_same_runtime"] = lambda: _decode_rate(same, prompt, steps)
            timers["genai_generator"] = lambda: genai_builder.generator_rates(
                genai_python, folder, prompt, steps, 1, threads)["rates"][0]
            if huge_page_status()["on"]:   # both as started without the tunable
                timers["genai_generator_plain_malloc"] = lambda: genai_builder.generator_rates(
                    genai_python, folder, prompt, steps, 1, threads,
                    env=without_huge_page_malloc())["rates"][0]
                timers["onnxruntime_own_process_plain_malloc"] = lambda: _own_process_rate(
                    art, prompt, steps, threads, accuracy_level, env=without_huge_page_malloc())
            timers["onnxruntime_own_process"] = lambda: _own_process_rate(
                art, prompt, steps, threads, accuracy_level)
            if genai_has_arkinfer(genai_python):   # our runner on genai's onnxruntime too
                timers["onnxruntime_own_process_genai_ort"] = lambda: _own_process_rate(
                    art, prompt, steps, threads, accuracy_level, genai_python)
        rates = _round_robin(timers, reps)
    onnx_tps, llama_tps = (statistics.median(rates[k]) for k in ("onnxruntime", "llama_cpp"))
    result = {
        "benchmark": "decode tokens/s, SmolLM2-135M-Instruct int4, batch 1",
        "onnxruntime": _entry(rates["onnxruntime"], artifact="tensorrt backend, gptq 4-bit g64 "
                              "(lm_head too) -> com.microsoft.MatMulNBits + fused contrib ops",
                              accuracy_level=accuracy_level, fused=onnx_runner.fused,
                              packed_qkv=onnx_runner.packed_qkv,
                              packed_siblings=onnx_runner.packed_siblings,
                              shared_kv=onnx_runner.shared_kv is not None,
                              version=ort_version(), load_s=load_s),
        "llama_cpp": _entry(rates["llama_cpp"],
                            model="Q4_0 (llama_model_quantize of the shipped Q4_1 GGUF)"),
        "ratio_onnx_over_llamacpp": round(onnx_tps / llama_tps, 3),
        "ratio_onnx_over_llamacpp_best": round(max(rates["onnxruntime"]) /
                                               max(rates["llama_cpp"]), 3),
        "ratio_llamacpp_over_onnx": round(llama_tps / onnx_tps, 3),
        "pairs_onnx_over_llamacpp": pair_ratios(rates["onnxruntime"], rates["llama_cpp"]),
        "settings": {"threads": threads, "prompt_tokens": len(prompt), "decode_steps": steps,
                     "repetitions": reps, "warmup": 1, "order": "round-robin"},
        "machine": machine_info(threads=threads),
        "load_average_after": list(os.getloadavg()),
    }
    if nbits_baseline:
        result["onnxruntime_nbits_only"] = _entry(
            rates["onnxruntime_nbits_only"], note="ops='nbits': MatMulNBits only, the other ops "
            "as ONNX function bodies (the runner before the fused ops)")
    if genai_python:
        result["genai"] = {
            "builder": f"onnxruntime_genai.models.builder -p int4 -e cpu block_size=64 "
                       f"accuracy_level={accuracy_level}",
            "model_same_runtime": _entry(rates["genai_model_same_runtime"], note="its "
                                         "model.onnx in this onnxruntime, fed like our runner"),
            "generator": _entry(rates["genai_generator"], note="og.Generator in the genai "
                                "interpreter (its own onnxruntime, shared KV buffers), with this "
                                "process's malloc (huge_page_malloc in machine)"),
        }
        if "genai_generator_plain_malloc" in rates:
            result["genai"]["generator_plain_malloc"] = _entry(
                rates["genai_generator_plain_malloc"], note="the same, started without "
                "glibc.malloc.hugetlb (as a genai user runs it)")
            result["onnxruntime_own_process_plain_malloc"] = _entry(
                rates["onnxruntime_own_process_plain_malloc"], note="our runner alone in a "
                "fresh process started without glibc.malloc.hugetlb (ARKINFER_HUGE_PAGES=0)")
            result["genai"]["ratio_own_process_over_generator_plain_malloc"] = round(
                statistics.median(rates["onnxruntime_own_process"])
                / result["genai"]["generator_plain_malloc"]["tokens_per_s"], 3)
        result["onnxruntime_own_process"] = _entry(
            rates["onnxruntime_own_process"], note="our runner alone in a fresh process, "
            "timed like genai's generator", onnxruntime=_OWN_VERSIONS.get(sys.executable))
        own = statistics.median(rates["onnxruntime_own_process"])
        result["genai"]["ratio_own_process_over_generator"] = round(
            own / result["genai"]["generator"]["tokens_per_s"], 3)
        if "onnxruntime_own_process_genai_ort" in rates:
            result["onnxruntime_own_process_genai_ort"] = _entry(
                rates["onnxruntime_own_process_genai_ort"], note="our runner alone in a fresh "
                "process of the genai interpreter: the onnxruntime genai's generator runs on "
                "(the pair to compare)", onnxruntime=_OWN_VERSIONS.get(genai_python))
            same = statistics.median(rates["onnxruntime_own_process_genai_ort"])
            result["genai"]["ratio_own_process_same_ort_over_generator"] = round(
                same / result["genai"]["generator"]["tokens_per_s"], 3)
        pairs = {"onnx_over_model_same_runtime": ("onnxruntime", "genai_model_same_runtime"),
                 "own_process_over_generator": ("onnxruntime_own_process", "genai_generator"),
                 "own_process_over_generator_plain_malloc": ("onnxruntime_own_process",
                                                             "genai_generator_plain_malloc"),
                 "both_plain_malloc": ("onnxruntime_own_process_plain_malloc",
                                       "genai_generator_plain_malloc"),
                 "own_process_huge_over_plain_malloc": ("onnxruntime_own_process",
                                                        "onnxruntime_own_process_plain_malloc"),
                 "own_process_same_ort_over_generator": ("onnxruntime_own_process_genai_ort",
                                                         "genai_generator")}
        result["genai"]["pairs"] = {name: pair_ratios(rates[a], rates[b])
                                    for name, (a, b) in pairs.items() if a in rates}
        for key in ("model_same_runtime", "generator"):
            g = result["genai"][key]
            result["genai"][f"ratio_onnx_over_{key}"] = round(onnx_tps / g["tokens_per_s"], 3)
            result["genai"][f"ratio_onnx_over_{key}_best"] = round(
                max(rates["onnxruntime"]) / g["best_tokens_per_s"], 3)
    return result


def _pairs_words(stats: dict) -> str:
    return f"median {stats['median']}, mean {stats['mean']} ± {stats['sd']} (sd, {stats['n']} rounds)"


def genai_has_arkinfer(python: str) -> bool:
    """Can the genai interpreter import our runner (`pip install --no-deps -e .` there)?"""
    done = subprocess.run([python, "-c", "import arkinfer.backends.onnx.runner"],
                          capture_output=True, text=True)
    return done.returncode == 0


def ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def main() -> None:
    reexec_with_huge_page_malloc()   # the allocator `arkinfer` runs with (ARKINFER_HUGE_PAGES=0: not)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--accuracy-level", type=int, default=0, choices=(0, 1, 2, 3, 4),
                    help="MatMulNBits accuracy_level: 0 fp32 activations (the runner's "
                         "default), 4 int8 activations (as llama.cpp)")
    ap.add_argument("--nbits-baseline", action="store_true",
                    help="also time ops='nbits' (MatMulNBits only: the runner before the fused "
                         "ops) in the same rounds")
    ap.add_argument("--genai-python", help="a Python with onnxruntime-genai (+ torch, "
                    "transformers): also build and time its model builder's SmolLM2")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    load_before = list(os.getloadavg())
    result = run(args.threads, args.tokens, args.reps, args.prompt, args.accuracy_level,
                 args.nbits_baseline, args.genai_python)
    result["load_average_before"] = load_before
    print(f"onnxruntime (accuracy_level {args.accuracy_level}) "
          f"{result['onnxruntime']['tokens_per_s']} tok/s, llama.cpp Q4_0 "
          f"{result['llama_cpp']['tokens_per_s']} tok/s: onnx/llama.cpp "
          f"{result['ratio_onnx_over_llamacpp']} (best rounds: "
          f"{result['onnxruntime']['best_tokens_per_s']} / {result['llama_cpp']['best_tokens_per_s']}"
          f" = {result['ratio_onnx_over_llamacpp_best']}; per round "
          f"{_pairs_words(result['pairs_onnx_over_llamacpp'])})")
    if "onnxruntime_nbits_only" in result:
        print(f"  ops='nbits' (no fused ops) {result['onnxruntime_nbits_only']['tokens_per_s']} "
              "tok/s")
    if "genai" in result:
        g = result["genai"]
        print(f"  onnxruntime-genai builder: same runtime {g['model_same_runtime']['tokens_per_s']}"
              f" tok/s (onnx/genai {g['ratio_onnx_over_model_same_runtime']}), its generator "
              f"{g['generator']['tokens_per_s']} tok/s (onnx/genai "
              f"{g['ratio_onnx_over_generator']}; best rounds "
              f"{g['ratio_onnx_over_generator_best']})")
        print(f"  in processes of their own: onnxruntime "
              f"{result['onnxruntime_own_process']['tokens_per_s']} tok/s vs genai's generator "
              f"{g['generator']['tokens_per_s']}: {g['ratio_own_process_over_generator']}")
        if "generator_plain_malloc" in g:
            print(f"  glibc's default malloc: genai's generator "
                  f"{g['generator_plain_malloc']['tokens_per_s']} tok/s (ours with huge pages / "
                  f"it {g['ratio_own_process_over_generator_plain_malloc']}), ours "
                  f"{result['onnxruntime_own_process_plain_malloc']['tokens_per_s']} tok/s")
        if "ratio_own_process_same_ort_over_generator" in g:
            own = result["onnxruntime_own_process_genai_ort"]
            print(f"  ours on genai's onnxruntime {own['onnxruntime']}: {own['tokens_per_s']} "
                  f"tok/s: {g['ratio_own_process_same_ort_over_generator']} of its generator")
        for name, stats in g["pairs"].items():
            print(f"  per round, {name.replace('_', ' ')}: {_pairs_words(stats)}")
    print(f"  runner load seconds: {result['onnxruntime']['load_s']}")
    print(f"  load average before {load_before}, after {result['load_average_after']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
