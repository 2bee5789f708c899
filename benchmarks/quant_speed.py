"""How fast the calibrated quantisers run on the real SmolLM2-135M, and where their time goes.

    python benchmarks/quant_speed.py [--methods gptq,awq] [--samples 32] [--blocks 3] [--no-ppl]

Rows (issue #21; the streaming driver `quant.calib.stream.calibrate`, torch's default threads):
- gptq: GPTQ 4-bit g32 sym act-order (true-sequential) into the gptq format, 32 windows x 512;
- awq: AWQ 4-bit g64 asym into the awq format (the `awq` row of quant_quality.py).

For every row: seconds per block and in total, and the time, FLOP count and FLOP rate of each
phase, with the rate as a fraction of the sgemm rate measured at the start of the run:
- forward: calibration forwards of the block (linears counted exactly through
  `torch.nn.functional.linear`; attention as 2·2·b·Hq·T²/2·D per `attend` call);
- hessian: `HessianAccumulator.add` / `.hessian` (2·tokens·in² per add: the full product's
  flops; `hessian.gram` computes only (k+1)/2k of them in k bands of 256 inputs, so its rate is
  an effective one and its fraction of sgemm may pass 1);
- solve: `gptq_quantize` (≈ 2·out·in² column updates + 2·in³ Cholesky / inverse);
  awq_search: AWQ's scale and clip searches (their own forwards are counted under forward);
- report: the per-linear and per-block SNR; io: reading the block, writing the work files.
Phases are exclusive (a forward inside a search counts as forward). With `--blocks N` only the
first N blocks run (a quick look; no perplexity). Otherwise the whole model is quantised and its
perplexity measured with quant_quality.py's protocol, against the value recorded before the
speed-up (GPTQ g32 act-order: 25.658 in benchmarks/results/quant_quality.json, row
`gptq-g32-act`; AWQ g64: 26.298, row `awq`).
Target: SmolLM2 GPTQ with 32 windows under 3 minutes on an idle 2-core machine, same perplexity to
3 digits. Writes benchmarks/results/quant_speed.json (load average and threads recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from machine import machine_info

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "quant_speed.json"
QUALITY = ROOT / "benchmarks" / "results" / "quant_quality.json"

# row -> (calibration, format, bits, group, sym, act_order, quant_quality row to compare with)
ROWS = {
    "gptq": ("gptq", "gptq", 4, 32, True, True, "gptq-g32-act"),
    "awq": ("awq", "awq", 4, 64, False, False, "awq"),
}


EVAL_TEXT = ROOT / "arkinfer" / "data" / "corpus_eval.txt"


def eval_ids(tokenizer) -> list[int]:
    """Token ids of the evaluation text the perplexities before the speed-up were taken on."""
    return tokenizer.encode(EVAL_TEXT.read_text(encoding="utf-8"), add_special_tokens=False)


def ppl_of(model, ids: list[int], ctx: int) -> dict:
    """Perplexity of `model` on `ids` in windows of `ctx` (arkinfer.generate.perplexity)."""
    from arkinfer.generate import model_logits_fn, perplexity

    t = time.perf_counter()
    r = perplexity(model_logits_fn(model), ids, ctx)
    return {**r.as_dict(), "eval_seconds": round(time.perf_counter() - t, 1)}


class _StopAfter(Exception):
    pass


class Phases:
    """Exclusive wall time and FLOPs per phase, collected by wrapping functions in place."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.flops: dict[str, float] = defaultdict(float)
        self._stack: list[float] = []
        self._undo: list[tuple[object, str, object]] = []

    def wrap(self, owner: object, attr: str, phase: str, flops=None) -> None:
        fn = getattr(owner, attr)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            self._stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - t0
                self.seconds[phase] += elapsed - self._stack.pop()
                if self._stack:
                    self._stack[-1] += elapsed
                if flops is not None:
                    self.flops[phase] += flops(*args, **kwargs)

        self._undo.append((owner, attr, fn))
        setattr(owner, attr, timed)

    def count(self, owner: object, attr: str, phase: str, flops) -> None:
        """Add FLOPs to `phase` on every call without timing it (the caller's phase keeps it)."""
        fn = getattr(owner, attr)

        def counted(*args, **kwargs):
            self.flops[phase] += flops(*args, **kwargs)
            return fn(*args, **kwargs)

        self._undo.append((owner, attr, fn))
        setattr(owner, attr, counted)

    def restore(self) -> None:
        for owner, attr, fn in reversed(self._undo):
            setattr(owner, attr, fn)
        self._undo.clear()


def instrument(phases: Phases) -> None:
    from arkinfer.quant.calib import awq, base, gptq, stream
    from arkinfer.quant.calib.block import BlockRunner
    from arkinfer.quant.calib.hessian import HessianAccumulator
    from arkinfer.quant.calib.sequential import SequentialForward

    from arkinfer.models.llama import Attention

    def linear_flops(x, w, *_a, **_k):
        return 2.0 * x.numel() / x.shape[-1] * w.shape[0] * w.shape[1]

    def attend_flops(_self, q, k, _v):
        b, hq, t, d = q.shape
        return 2.0 * 2 * b * hq * t * k.shape[2] / 2 * d

    def hessian_flops(self, x, *_a, **_k):
        return 2.0 * x.numel() / x.shape[-1] * self.in_features ** 2

    def solve_flops(w, _h, **_k):
        out, cols = w.shape
        return 2.0 * out * cols ** 2 + 2.0 * cols ** 3

    phases.count(torch.nn.functional, "linear", "forward", linear_flops)
    phases.count(Attention, "attend", "forward", attend_flops)
    for name in ("run", "attention", "mlp", "take_reference"):
        phases.wrap(BlockRunner, name, "forward")
    phases.wrap(SequentialForward, "_stage", "forward")
    phases.wrap(SequentialForward, "output", "forward")
    phases.wrap(HessianAccumulator, "add", "hessian", hessian_flops)
    phases.wrap(HessianAccumulator, "hessian", "hessian")
    phases.wrap(gptq, "gptq_quantize", "solve", solve_flops)
    phases.wrap(awq, "search_scale", "awq_search")
    phases.wrap(awq, "search_clip", "awq_search")
    phases.wrap(base, "hessian_snr_db", "report")
    phases.wrap(stream, "block_snr_db", "report")
    phases.wrap(stream, "load_block", "io")
    phases.wrap(stream, "save_weights", "io")
    phases.wrap(stream, "_atomic_save", "io")


def sgemm_rate(n: int = 1024, repeats: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2.0 * n ** 3 / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_row(name: str, ckpt, calib, blocks: int | None, ids: list[int] | None,
            sgemm: float, work: Path) -> dict:
    from arkinfer.quant import QuantRecipe
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.export import export_folder
    from arkinfer.quant.load import load_quantized

    method, fmt, bits, group, sym, act, quality_row = ROWS[name]
    recipe = QuantRecipe(method, fmt, bits, group, sym=sym, desc_act=act)
    per_block: list[float] = []

    def progress(i: int, n: int, seconds: float) -> None:
        per_block.append(round(seconds, 2))
        print(f"  {name}: block {i + 1}/{n} {seconds:.2f} s", flush=True)
        if blocks is not None and i + 1 >= blocks:
            raise _StopAfter

    phases = Phases()
    instrument(phases)
    t0 = time.perf_counter()
    run = None
    try:
        run = calibrate(ckpt, recipe, calib, work / f"{name}.work", progress=progress)
    except _StopAfter:
        pass
    finally:
        phases.restore()
    total = time.perf_counter() - t0
    row = {"recipe": recipe.describe(), "blocks_run": len(per_block),
           "seconds_total": round(total, 1), "seconds_per_block": per_block,
           "mean_block_s": round(sum(per_block) / max(len(per_block), 1), 2),
           "phases": {p: {"seconds": round(s, 2),
                          "gflop": round(phases.flops.get(p, 0.0) / 1e9, 1),
                          "gflop_per_s": round(phases.flops.get(p, 0.0) / 1e9 / s, 1) if s else None,
                          "fraction_of_sgemm": (round(phases.flops[p] / s / sgemm, 3)
                                                if s and phases.flops.get(p) else None)}
                      for p, s in sorted(phases.seconds.items())}}
    if run is not None and ids is not None:
        out = export_folder(run, work / name, force=True)
        summary = json.loads((out / "quant_summary.json").read_text())
        row["mean_block_snr_db"] = summary["mean_block_snr_db"]
        row["mean_linear_snr_db"] = summary["mean_linear_snr_db"]
        row.update(ppl_of(load_quantized(out), ids, 512))
        before = json.loads(QUALITY.read_text())["rows"].get(quality_row, {})
        row["ppl_before_speedup"] = before.get("ppl")
        if before.get("ppl"):
            row["same_ppl_3_digits"] = f"{row['ppl']:.3g}" == f"{before['ppl']:.3g}"
    if name == "gptq" and run is not None:
        row["target_under_180_s"] = total < 180
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="gptq,awq", help="rows: " + ",".join(ROWS))
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--blocks", type=int, default=None, help="stop after N blocks (no ppl)")
    ap.add_argument("--no-ppl", action="store_true", help="skip the perplexity evaluation")
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args()

    from arkinfer.quant.calib_data import load_calibration

    from arkinfer.frontend.checkpoint import open_checkpoint
    from arkinfer.testing.smollm2 import smollm2_hf_dir

    ckpt = open_checkpoint(smollm2_hf_dir())
    calib = load_calibration(ckpt.tokenizer, samples=args.samples, seq_len=args.seq_len, seed=0)
    ids = None if (args.no_ppl or args.blocks) else eval_ids(ckpt.tokenizer)
    load_before = os.getloadavg()
    sgemm = sgemm_rate()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.methods.split(","):
            rows[name] = run_row(name, ckpt, calib, args.blocks, ids, sgemm, Path(tmp))
            r = rows[name]
            print(f"{name}: {r['seconds_total']} s total, {r['mean_block_s']} s/block; "
                  + ", ".join(f"{p} {v['seconds']} s" for p, v in r["phases"].items())
                  + (f"; ppl {r['ppl']:.4f} (before {r.get('ppl_before_speedup')})"
                     if "ppl" in r else ""), flush=True)
    result = {"machine": machine_info(), "torch_threads": torch.get_num_threads(),
              "load_average_before": [round(x, 2) for x in load_before],
              "load_average_after": [round(x, 2) for x in os.getloadavg()],
              "sgemm_gflop_per_s": round(sgemm / 1e9, 1),
              "calibration": calib.describe(), "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"sgemm {result['sgemm_gflop_per_s']} GFLOP/s, {result['torch_threads']} threads, load "
          f"{result['load_average_before']} -> {result['load_average_after']}; written to {args.json}")


if __name__ == "__main__":
    main()
