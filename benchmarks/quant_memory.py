"""Peak memory of streaming GPTQ on a generated ~1B-parameter MiniCPM4-architecture checkpoint.

    python benchmarks/quant_memory.py [--layers 20] [--samples 8] [--seq-len 512] [--json OUT]

1. writes (once, cached under --dir) a bf16, sharded checkpoint with MiniCPM4's config keys and
   tensor names: hidden 2048, 20 layers, ffn 5632, 16 heads / 2 KV heads of 128, vocab 73448
   (~1.2 B parameters, ~2.4 GB), random weights (write_checkpoint);
2. runs `calibrate` + `export_folder` (GPTQ 4-bit g128 sym -> gptq) in a *fresh* subprocess on
   seeded random calibration ids and reads that process's VmHWM from /proc/self/status (peak
   resident set, file-backed mapped pages included; ru_maxrss is not used because Linux carries
   it across exec);
3. reports peak RSS, the checkpoint size, and seconds per decoder block.

The budget is 3 GB: the model must never be resident, only one block plus calibration activations.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from machine import machine_info

ROOT = Path(__file__).resolve().parents[1]
BUDGET_BYTES = 3 * 1024**3


def minicpm4_1b_config(layers: int) -> dict:
    return {
        "architectures": ["MiniCPMForCausalLM"], "model_type": "minicpm", "vocab_size": 73448,
        "hidden_size": 2048, "num_hidden_layers": layers, "num_attention_heads": 16,
        "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 5632,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 32768, "scale_emb": 12, "scale_depth": 1.4,
        "dim_model_base": 256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": 1, "eos_token_id": 2,
    }


def make_checkpoint(folder: Path, layers: int) -> Path:
    import torch

    from arkinfer.testing.synthetic import write_checkpoint

    done = folder / ".complete"
    if done.is_file() and json.loads(done.read_text()).get("layers") == layers:
        return folder
    write_checkpoint(folder, minicpm4_1b_config(layers), seed=0, dtype=torch.bfloat16,
                     shard_bytes=1 << 30, std=0.02)
    done.write_text(json.dumps({"layers": layers}))
    return folder


def child(model: Path, out: Path, samples: int, seq_len: int) -> None:
    """Runs in the fresh subprocess: calibrate + export, then print one JSON line."""
    import torch
    from arkinfer.quant import QuantRecipe
    from arkinfer.quant.calib.stream import calibrate
    from arkinfer.quant.calib_data import calibration_from_ids
    from arkinfer.quant.export import export_folder

    torch.set_num_threads(1)  # the machine is shared: contended OpenMP threads are slower
    gen = torch.Generator().manual_seed(0)
    calib = calibration_from_ids(torch.randint(0, 73448, (samples, seq_len), generator=gen),
                                 source="random ids (seed 0)")
    times: list[float] = []
    t0 = time.perf_counter()
    run = calibrate(model, QuantRecipe("gptq", "gptq", 4, 128), calib, out.with_name("work"),
                    progress=lambda i, n, s: (times.append(s), print(
                        f"block {i + 1}/{n}: {s:.1f} s, VmHWM {vm_hwm() / 2**20:.0f} MiB",
                        file=sys.stderr, flush=True)))
    t1 = time.perf_counter()
    export_folder(run, out, force=True)
    t2 = time.perf_counter()
    summary = json.loads((out / "quant_summary.json").read_text())
    print(json.dumps({"peak_rss_bytes": vm_hwm(), "calibration_seconds": t1 - t0,
                      "export_seconds": t2 - t1, "seconds_per_block": times,
                      "mean_linear_snr_db": summary["mean_linear_snr_db"],
                      "bits_per_weight": summary["bits_per_weight"],
                      "output_bytes": sum(p.stat().st_size for p in out.iterdir())}))


def vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM (not Linux?)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/arkinfer-quant-memory"))
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" /
                    "quant_memory.json")
    ap.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.samples, args.seq_len)
        return
    t = time.perf_counter()
    model = make_checkpoint(args.dir / "minicpm4-1b-bf16", args.layers)
    gen_s = time.perf_counter() - t
    ckpt_bytes = sum(p.stat().st_size for p in model.glob("*.safetensors"))
    cmd = [sys.executable, __file__, "--child", str(model), str(args.dir / "gptq"),
           "--samples", str(args.samples), "--seq-len", str(args.seq_len)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    per_block = result["seconds_per_block"]
    report = {
        "model": {"config": minicpm4_1b_config(args.layers), "dtype": "bfloat16",
                  "checkpoint_bytes": ckpt_bytes, "generated_seconds": round(gen_s, 1)},
        "recipe": "gptq 4-bit g128 sym -> gptq", "calibration": {
            "samples": args.samples, "seq_len": args.seq_len, "source": "random ids"},
        **result,
        "mean_seconds_per_block": sum(per_block) / len(per_block),
        "budget_bytes": BUDGET_BYTES, "within_budget": result["peak_rss_bytes"] < BUDGET_BYTES,
        "machine": machine_info(threads=1),
    }
    gib = 1024**3
    print(f"checkpoint {ckpt_bytes / gib:.2f} GiB bf16, {args.layers} blocks; peak RSS "
          f"{result['peak_rss_bytes'] / gib:.2f} GiB (budget 3 GiB: "
          f"{'ok' if report['within_budget'] else 'EXCEEDED'}); "
          f"{report['mean_seconds_per_block']:.1f} s per block, export "
          f"{result['export_seconds']:.1f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")



if __name__ == "__main__":
    main()
