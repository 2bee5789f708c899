"""How long ArkInfer's RTN scale search (the `mse` grid, quant/rtn.py) takes on an 8B-sized
linear, searched SEARCH_ROWS groups at a time (the default) and in one piece.

    .venv/bin/python benchmarks/rtn_speed.py [--rows 4096 --cols 16384] [--json OUT]

Random weights (std 0.02) of MiniCPM4.1-8B's down_proj shape by default; mlx4's recipe (4-bit
g64 asym) and Q4_0's (4-bit g32 sym). Both ways give the same codes, scales and zeros (checked
here and in tests/quant/test_quant_grids.py); seconds of one call each, torch's threads.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from machine import machine_info

from arkinfer.quant import rtn

RECIPES = {"4-bit g64 asym (mlx4)": (64, False), "4-bit g32 sym (q4_0)": (32, True)}


def timed(w: torch.Tensor, group: int, sym: bool, search_rows: int):
    rtn.SEARCH_ROWS = search_rows
    t0 = time.perf_counter()
    q = rtn.quantize_rtn(w, 4, group, sym, grid="mse")
    return time.perf_counter() - t0, q


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=16384)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    load_before = list(os.getloadavg())
    w = torch.randn(args.rows, args.cols, generator=torch.Generator().manual_seed(0)) * 0.02
    default, rows = rtn.SEARCH_ROWS, []
    for name, (group, sym) in RECIPES.items():
        chunked, a = timed(w, group, sym, default)
        whole, b = timed(w, group, sym, 10**12)
        same = all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("codes", "scales", "zeros"))
        rows.append({"recipe": name, "seconds_in_chunks": round(chunked, 2),
                     "seconds_in_one_piece": round(whole, 2), "same_result": same})
        print(f"{name}: {chunked:.1f} s in chunks of {default} groups, {whole:.1f} s in one "
              f"piece, same result: {same}", flush=True)
    rtn.SEARCH_ROWS = default
    if args.json:
        out = {"machine": machine_info(), "threads": torch.get_num_threads(),
               "load_average_before": load_before, "shape": [args.rows, args.cols],
               "search_rows": default, "rows": rows}
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
