"""GPTQ calibration of an 8B-shaped checkpoint on a CUDA GPU (or, with --device cpu, this
machine's CPU): seconds per block, peak GPU memory.

    python benchmarks/calib_cuda.py [--shape minicpm4.1-8b] [--layers 4] [--samples 128]
        [--seq-len 2048] [--method gptq] [--device cuda|cpu] [--fixtures DIR] [--json OUT]

1. writes (once, cached; arkinfer/testing/fixture_8b.py) the real-width checkpoint of `--shape`
   with `--layers` decoder blocks (MiniCPM4.1-8B: hidden 4096, FFN 16384, 32 q / 2 KV heads of
   128, vocab 73448; bf16, random weights);
2. runs `calibrate(..., device="cuda")` with the recipe `build --quant marlin` uses (GPTQ 4-bit
   g128 sym, act-order over static groups) on seeded random token ids, timing every block
   (wall clock, work files written included) and reading each block's peak GPU memory;
3. reports the measured blocks and the output layer, and the full model's time predicted from
   them: n_layers x the median wall time of the blocks between the first (CUDA's warm-up and the
   first write of the next block's inputs) and the last (whose inputs are always written), plus
   the checkpoint writes the streaming loop allows (at most HIDDEN_SAVE_RATIO-th of the block
   work, stream.py) and the output layer. The blocks of one model have the same shapes and the same work, so the
   prediction from a reduced-depth fixture is the per-block cost times the depth; the JSON says
   which figures were measured and which were predicted.

Needs a CUDA GPU and free disk for the fixture (1.2 GB + 0.44 GB per block) and the work files
(the 4.3 GB of one block's inputs at 128 x 2048 tokens + 0.2 GB of codes per block).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from arkinfer.quant.calib.stream import HIDDEN_SAVE_RATIO, calibrate
from arkinfer.quant.calib_data import calibration_from_ids
from arkinfer.quant.recipe import get_preset
from machine import machine_info

from arkinfer.testing.fixture_8b import ensure_fixture, shape_config

METHODS = {"gptq": "marlin", "pgptq": "marlin", "awq": "awq"}  # method -> preset of its format


def peak_rss() -> int | None:
    """This process's peak resident set (VmHWM; file pages it maps count too), Linux only."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="minicpm4.1-8b")
    p.add_argument("--layers", type=int, default=4, help="decoder blocks in the fixture")
    p.add_argument("--samples", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--method", choices=sorted(METHODS), default="gptq")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--fixtures", type=Path, default=None, help="fixture cache folder")
    p.add_argument("--work", type=Path, default=Path("calib-cuda.work"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    gpu = args.device.startswith("cuda")
    if gpu and not torch.cuda.is_available():
        print("no CUDA GPU visible to torch: this benchmark measures calibration on one",
              file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    folder = ensure_fixture(args.shape, layers=args.layers, root=args.fixtures)
    fixture_seconds = time.perf_counter() - t0
    full_layers = int(shape_config(args.shape)["num_hidden_layers"])
    vocab = 32000  # ids below every shape's vocabulary (random weights: any token is as good)
    gen = torch.Generator().manual_seed(0)
    calib = calibration_from_ids(torch.randint(0, vocab, (args.samples, args.seq_len),
                                               generator=gen))
    recipe = get_preset(METHODS[args.method], calib=args.method)
    options = {"act_order": True, "static_groups": True} if args.method != "awq" else None

    stamps: list[float] = []

    def progress(i: int, n: int, seconds: float) -> None:
        stamps.append(time.perf_counter())
        print(f"block {i + 1}/{n}: {seconds:.1f} s computing, "
              f"{stamps[-1] - (stamps[-2] if len(stamps) > 1 else t_cal):.1f} s wall",
              file=sys.stderr, flush=True)

    if gpu:
        torch.cuda.reset_peak_memory_stats()
    t_cal = time.perf_counter()
    run = calibrate(folder, recipe, calib, args.work, options=options, progress=progress,
                    device=args.device)
    total = time.perf_counter() - t_cal
    walls = [b - a for a, b in zip([t_cal] + stamps[:-1], stamps)]
    steady = sorted(walls[1:-1] or walls)
    block_median = steady[len(steady) // 2]
    blocks_only = full_layers * block_median
    tail_seconds = total - (stamps[-1] - t_cal)
    peaks = [b.get("gpu_peak_bytes", 0) for b in run.blocks]
    result = {
        "machine": machine_info(),
        "device": run.device, "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "shape": args.shape, "fixture_layers": args.layers, "full_layers": full_layers,
        "method": args.method, "recipe": run.recipe.describe(),
        "samples": args.samples, "seq_len": args.seq_len,
        "fixture_seconds": round(fixture_seconds, 1),
        "measured": {
            "block_wall_seconds": [round(w, 2) for w in walls],
            "block_compute_seconds": [b["seconds"] for b in run.blocks],
            "tail_seconds": round(tail_seconds, 2),
            "calibration_seconds": round(total, 2),
            "peak_gpu_bytes_per_block": peaks,
            "peak_gpu_bytes": int(torch.cuda.max_memory_allocated()) if gpu else None,
            "peak_rss_bytes": peak_rss(),
            "block_snr_db": [b["block_snr_db"] for b in run.blocks],
        },
        "predicted_full_model": {
            "how": f"{full_layers} x the median wall time of blocks 2..{args.layers - 1}, plus "
                   f"at most 1/{HIDDEN_SAVE_RATIO:g} of that for checkpoint writes, plus the "
                   "output layer, from this reduced-depth run",
            "blocks_seconds": round(blocks_only, 1),
            "calibration_seconds_at_most": round(blocks_only * (1 + 1 / HIDDEN_SAVE_RATIO)
                                                 + tail_seconds, 1),
        },
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
