"""Decode speed of the tensorrt backend's host runner (onnxruntime, int4 via MatMulNBits) vs
llama.cpp's Q4_0 on the same real model (SmolLM2-135M-Instruct), same machine, same run.

SmolLM2's 576-wide rows cannot take Marlin (576 % 128 != 0), so the artifact is the `--quant gptq`
layout with group size 64 (RTN codes: speed does not depend on how codes were chosen), lowered by
the tensorrt backend exactly as `arkinfer build` does; llama.cpp runs the Q4_0 requantisation of
the shipped Q4_1 GGUF (llama.cpp's own quantiser, default per-tensor rules). Both get the same
threads, the same prompt ids, a warm-up, and `--tokens` timed greedy-fed decode steps.

    python benchmarks/onnx_vs_llamacpp.py --json benchmarks/results/onnx_vs_llamacpp.json
    python benchmarks/onnx_vs_llamacpp.py --accuracy-level 4 \
        --json benchmarks/results/onnx_vs_llamacpp_int8.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from machine import machine_info


def _decode_rate(runner, prompt: list[int], steps: int, reps: int) -> list[float]:
    """tokens/s of `steps` decode calls after a prefill of `prompt`, `reps` times (one warm-up)."""
    rates = []
    for rep in range(reps + 1):
        runner.reset()
        token = int(runner.prefill(prompt).argmax())
        t0 = time.perf_counter()
        for _ in range(steps):
            token = int(runner.decode(token).argmax())
        if rep:
            rates.append(steps / (time.perf_counter() - t0))
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


def run(threads: int, steps: int, reps: int, prompt_len: int, accuracy_level: int = 0) -> dict:
    from arkinfer.backends.gguf.runner import LlamaCppRunner
    from arkinfer.backends.onnx.runner import OnnxRunner

    from arkinfer.testing.smollm2 import smollm2_gguf_path

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        art = _artifact(work)
        onnx_runner = OnnxRunner(art, ops="contrib", threads=threads,
                                 accuracy_level=accuracy_level)
        text = (Path(__file__).parents[1] / "arkinfer/data/corpus_eval.txt").read_text()[:4000]
        prompt = onnx_runner.tokenize(text)[:prompt_len]
        onnx_rates = _decode_rate(onnx_runner, prompt, steps, reps)
        del onnx_runner
        q4_0 = work / "smollm2-q4_0.gguf"
        _q4_0(smollm2_gguf_path(), q4_0)
        llama = LlamaCppRunner(q4_0, n_ctx=prompt_len + steps + 8, n_threads=threads)
        llama_rates = _decode_rate(llama, prompt, steps, reps)
    onnx_tps, llama_tps = statistics.median(onnx_rates), statistics.median(llama_rates)
    return {
        "benchmark": "decode tokens/s, SmolLM2-135M-Instruct int4, batch 1",
        "onnxruntime": {"artifact": "tensorrt backend, gptq 4-bit g64 (lm_head too) -> "
                                    "com.microsoft.MatMulNBits",
                        "accuracy_level": accuracy_level, "tokens_per_s": round(onnx_tps, 2),
                        "runs": [round(r, 2) for r in onnx_rates]},
        "llama_cpp": {"model": "Q4_0 (llama_model_quantize of the shipped Q4_1 GGUF)",
                      "tokens_per_s": round(llama_tps, 2), "runs": [round(r, 2) for r in llama_rates]},
        "ratio_llamacpp_over_onnx": round(llama_tps / onnx_tps, 3),
        "within_2x": llama_tps / onnx_tps <= 2.0,
        "settings": {"threads": threads, "prompt_tokens": len(prompt), "decode_steps": steps,
                     "repetitions": reps, "warmup": 1},
        "machine": machine_info(threads=threads),
        "load_average_after": list(os.getloadavg()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--accuracy-level", type=int, default=0, choices=(0, 1, 2, 3, 4),
                    help="MatMulNBits accuracy_level: 0 fp32 activations (the runner's "
                         "default), 4 int8 activations (as llama.cpp)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    load_before = list(os.getloadavg())
    result = run(args.threads, args.tokens, args.reps, args.prompt, args.accuracy_level)
    result["load_average_before"] = load_before
    print(f"onnxruntime (accuracy_level {args.accuracy_level}) "
          f"{result['onnxruntime']['tokens_per_s']} tok/s, llama.cpp Q4_0 "
          f"{result['llama_cpp']['tokens_per_s']} tok/s, ratio "
          f"{result['ratio_llamacpp_over_onnx']} (within 2x: {result['within_2x']})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
