"""The parity gate's 4-bit thresholds (arkinfer/pipeline/verify.py, THRESHOLDS["4bit"]) derived
from measurements on SmolLM2-135M, the smallest (so the most quantisation-sensitive) model ArkInfer
builds: a build no better than llama.cpp's own Q4_0 must pass, a broken layout must fail.

    python benchmarks/gate_thresholds.py                  # measure, write the results, derive
    python benchmarks/gate_thresholds.py --derive-only    # derive from the recorded results

Measured on the gate's own prompts (`verification_prompts`: corpus_eval.txt paragraphs, not the
held-out texts of quant_quality.py), with the gate's own metrics (`parity_metrics`) against
ArkInfer's float reference, each row run by the runtime that runs it in a build:
- `llama.cpp-q4_0` (and Q4_K_M, IQ4_XS): llama.cpp's own quantiser, run by llama.cpp;
- `gptq-q4_0`, `rtn-q4_0`: ArkInfer's GPTQ / RTN Q4_0 lowered to GGUF, run by llama.cpp;
- `rtn-g64-gptq`: RTN g64 in the GPTQ layout (the `gptq` preset's group on SmolLM2, whose
  576-wide rows do not take 128) run dequantised by the reference model: a 4-bit layout that is
  worse than GPTQ and must pass;
- `broken-nibbles`: llama.cpp's Q4_0 file with the two nibbles of every byte swapped (element j
  read as j+16: the split-vs-interleaved nibble bug of a wrong Q4_0 layout), which must fail.
The GGUFs come from benchmarks/quant_quality.py's work folder (/tmp/arkinfer-quant-quality).

Rule (`derive`): the Q4_0 baseline B = the worse of llama.cpp-q4_0 on the verify prompts and its
held-out mean (quant_quality_heldout.json). The margin is llama.cpp Q4_0's own spread over the
held-out domains (`heldout_spread`: its worst domain against its mean, per metric; French and
Chinese are the worst): KL and ppl_delta thresholds are B x (worst / mean), the top-1 threshold
is B - (mean - worst), each rounded outwards to two decimals. So a build exactly as good as
llama.cpp's Q4_0 passes on prompts as unfavourable to it as its worst held-out domain; the 539
scored positions of the verify prompts cannot show that spread themselves.
Results: benchmarks/results/gate_thresholds.json.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = ROOT / "benchmarks" / "results" / "quant_quality_heldout.json"
RESULTS = ROOT / "benchmarks" / "results" / "gate_thresholds.json"
WORK = Path("/tmp/arkinfer-quant-quality")
GATE_WORK = Path("/tmp/arkinfer-gate")
GGUF_ROWS = {"llama.cpp-q4_0": WORK / "llama.cpp-q4_0.gguf",
             "llama.cpp-q4_k_m": WORK / "llama.cpp-q4_k_m.gguf",
             "llama.cpp-iq4_xs": WORK / "llama.cpp-iq4_xs.gguf",
             "gptq-q4_0": WORK / "gguf-gptq-q4_0-mse" / "model.gguf",
             "rtn-q4_0": WORK / "gguf-rtn-q4_0-ggml" / "model.gguf",
             "broken-nibbles": GATE_WORK / "broken-nibbles.gguf"}
FOLDER_ROWS = {"rtn-g64-gptq": GATE_WORK / "rtn-g64-gptq"}
KEYS = ("top1_agreement", "mean_kl", "ppl_delta")


def heldout_spread(row: str = "llama.cpp-q4_0") -> dict[str, dict[str, float]]:
    """{"mean": ..., "worst": ...}: the row's mean over the held-out domains and its worst domain
    per metric (lowest top-1, highest KL and perplexity increase), in the gate's metric names."""
    domains = list(json.loads(HELDOUT.read_text())["rows"][row]["domains"].values())
    names = {"top1_agreement": "top1", "mean_kl": "kl", "ppl_delta": "ppl_increase"}
    mean = {k: sum(d[v] for d in domains) / len(domains) for k, v in names.items()}
    worst = {k: (min if k == "top1_agreement" else max)(d[v] for d in domains)
             for k, v in names.items()}
    return {"mean": mean, "worst": worst}


def derive(verify_q4_0: dict[str, float], heldout: dict[str, dict[str, float]]
           ) -> dict[str, float]:
    """{"top1", "kl", "ppl_delta"} of the 4-bit class from llama.cpp Q4_0's metrics on the verify
    prompts and its held-out spread (see the module docstring)."""
    mean, worst = heldout["mean"], heldout["worst"]
    top1 = min(verify_q4_0["top1_agreement"], mean["top1_agreement"])
    kl = max(verify_q4_0["mean_kl"], mean["mean_kl"])
    ppl = max(verify_q4_0["ppl_delta"], mean["ppl_delta"])
    # round(.., 6) first: 0.34 * 1.5 * 100 is 51.00000000000001 in floating point, not 51
    return {"top1": math.floor(round((top1 - (mean["top1_agreement"] - worst["top1_agreement"]))
                                     * 100, 6)) / 100,
            "kl": math.ceil(round(kl * worst["mean_kl"] / mean["mean_kl"] * 100, 6)) / 100,
            "ppl_delta": math.ceil(round(ppl * worst["ppl_delta"] / mean["ppl_delta"] * 100, 6))
            / 100}


def swap_nibbles(src: Path, dst: Path) -> Path:
    """A copy of the GGUF `src` whose Q4_0 tensors have each byte's two nibbles swapped."""
    from gguf import GGMLQuantizationType, GGUFReader

    shutil.copyfile(src, dst)
    data = np.memmap(dst, dtype=np.uint8, mode="r+")
    for t in GGUFReader(str(src)).tensors:
        if t.tensor_type != GGMLQuantizationType.Q4_0:
            continue
        blocks = data[t.data_offset:t.data_offset + int(t.n_bytes)].reshape(-1, 18)
        qs = blocks[:, 2:]  # 2 bytes of fp16 scale, then 16 bytes: elements j (low) and j+16
        blocks[:, 2:] = (qs << 4) | (qs >> 4)
    data.flush()
    return dst


def measure(threads: int) -> dict:
    import torch
    from arkinfer.backends.gguf.runner import LlamaCppRunner

    from arkinfer.pipeline.reference_runner import ReferenceRunner
    from arkinfer.pipeline.verify import float_reference, parity_metrics
    from arkinfer.testing.smollm2 import smollm2_hf_dir

    torch.set_num_threads(threads)
    GATE_WORK.mkdir(parents=True, exist_ok=True)
    if not GGUF_ROWS["broken-nibbles"].is_file():
        swap_nibbles(GGUF_ROWS["llama.cpp-q4_0"], GGUF_ROWS["broken-nibbles"])
    hf = smollm2_hf_dir()
    t0 = time.perf_counter()
    reference = float_reference(hf)  # SmolLM2 is dense: no attention mode
    rows = {}
    print(f"float reference: {time.perf_counter() - t0:.0f} s", flush=True)
    for name, path in [*GGUF_ROWS.items(), *FOLDER_ROWS.items()]:
        if not path.exists():
            print(f"skip {name}: {path} is missing", flush=True)
            continue
        t0 = time.perf_counter()
        runner = (LlamaCppRunner(path, n_ctx=512, n_threads=threads) if path.suffix == ".gguf"
                  else ReferenceRunner(path))
        m = parity_metrics(reference, runner, reference.prompts)
        rows[name] = {k: round(m[k], 4) for k in (*KEYS, "ppl_reference", "ppl_artifact")}
        rows[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(name, rows[name], flush=True)
    return {"prompts": len(reference.prompts), "positions": sum(map(len, reference.prompts)),
            "model": "SmolLM2-135M-Instruct (imported float)", "threads": threads, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--derive-only", action="store_true", help="use the recorded measurements")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    results = json.loads(RESULTS.read_text()) if args.derive_only else measure(args.threads)
    heldout = heldout_spread()
    results["heldout_llama.cpp-q4_0"] = {part: {k: round(v, 4) for k, v in values.items()}
                                         for part, values in heldout.items()}
    results.pop("margin", None)
    thresholds = derive(results["rows"]["llama.cpp-q4_0"], heldout)
    results["thresholds_4bit"] = thresholds
    for name, m in results["rows"].items():
        passed = (m["top1_agreement"] >= thresholds["top1"] and m["mean_kl"] <= thresholds["kl"]
                  and m["ppl_delta"] <= thresholds["ppl_delta"])
        m["passes"] = passed
        print(f"{name:18} top1 {m['top1_agreement']:.3f}  KL {m['mean_kl']:.3f}  "
              f"ppl {m['ppl_delta']:+.1%}  -> {'pass' if passed else 'FAIL'}")
    print("4-bit thresholds:", thresholds)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
