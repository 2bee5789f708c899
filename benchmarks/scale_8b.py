"""The headline builds on an 8B checkpoint on this machine: peak RSS, seconds per stage, disk.

    python benchmarks/scale_8b.py [--shape minicpm4.1-8b] [--builds rpi5,jetson,apple]
        [--fixtures DIR] [--out DIR] [--json OUT] [-- extra build options]

1. writes (once, cached; arkinfer/testing/fixture_8b.py, ~16 GB) the full-size fixture of
   `--shape` (random bf16 weights, the demo's tokenizer);
2. runs each build in a fresh process, the commands of issue #40:
   - rpi5:   `arkinfer build FIXTURE --target rpi5 --quant q4_0`
   - jetson: `arkinfer build FIXTURE --target jetson-orin --quant marlin --samples 8 --seq-len 256`
   - apple:  `arkinfer build FIXTURE --target apple-m4 --quant mlx4`
   reading that process's peak resident set (VmHWM from /proc/self/status at exit; file pages
   the process maps count too) and the manifest's seconds per stage;
3. reports, per build: exit status, peak RSS, stage seconds, bytes written, and the verify metrics
   (random weights: the gate checks the runtime against the reference on the same weights).

A build that stops (an error before a stage that would not fit, a failed gate) is reported with
its last lines; the others still run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from machine import machine_info

from arkinfer.testing.fixture_8b import ensure_fixture

BUILDS = {
    "rpi5": ["--target", "rpi5", "--quant", "q4_0"],
    "jetson": ["--target", "jetson-orin", "--quant", "marlin", "--samples", "8",
               "--seq-len", "256"],
    "apple": ["--target", "apple-m4", "--quant", "mlx4"],
}
# run the CLI in this process and print its peak resident set when it exits, however it exits
WRAPPER = ("import atexit, sys\n"
           "def peak():\n"
           "    for line in open('/proc/self/status'):\n"
           "        if line.startswith('VmHWM:'):\n"
           "            print('VMHWM_KB', line.split()[1], file=sys.stderr, flush=True)\n"
           "atexit.register(peak)\n"
           "from arkinfer.cli.main import main\n"
           "sys.argv = ['arkinfer'] + sys.argv[1:]\n"
           "main()\n")


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def run_build(fixture: Path, name: str, out: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-c", WRAPPER, "build", str(fixture), *BUILDS[name], "-o", str(out),
           "--force", "--json", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    peak = [int(line.split()[1]) * 1024 for line in proc.stderr.splitlines()
            if line.startswith("VMHWM_KB")]
    row = {"build": name, "command": "arkinfer build FIXTURE " + " ".join(BUILDS[name] + extra),
           "exit": proc.returncode, "seconds": round(seconds, 1),
           "peak_rss_bytes": peak[-1] if peak else None, "bytes_written": folder_bytes(out)}
    if proc.returncode == 0:
        manifest = json.loads(proc.stdout)
        row["stage_seconds"] = manifest["build"]["stage_seconds"]
        row["verify"] = manifest["verification"]["metrics"]
        row["fidelity"] = manifest["verification"].get("fidelity")
    else:
        row["last_lines"] = [line for line in proc.stderr.splitlines()
                             if not line.startswith("VMHWM_KB")][-8:]
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="minicpm4.1-8b")
    p.add_argument("--builds", default="rpi5,jetson,apple")
    p.add_argument("--fixtures", type=Path, default=None)
    p.add_argument("--out", type=Path, default=Path("dist/scale_8b"))
    p.add_argument("--json", type=Path, default=None)
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    t0 = time.perf_counter()
    fixture = ensure_fixture(args.shape, root=args.fixtures)
    result = {"machine": machine_info(), "shape": args.shape, "fixture": str(fixture),
              "fixture_bytes": folder_bytes(fixture),
              "fixture_seconds": round(time.perf_counter() - t0, 1), "builds": []}
    for name in args.builds.split(","):
        print(f"building {name} ...", file=sys.stderr, flush=True)
        row = run_build(fixture, name, args.out / name, extra)
        result["builds"].append(row)
        print(json.dumps(row, indent=2), file=sys.stderr, flush=True)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0 if all(r["exit"] == 0 for r in result["builds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
