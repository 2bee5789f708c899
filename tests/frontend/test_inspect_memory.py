"""`arkinfer inspect` reads headers only: a multi-GB sharded checkpoint stays under 300 MB RSS."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from arkinfer.testing.synthetic import write_checkpoint
from arkinfer.models.configs import tiny_config


def test_inspect_multi_gb_checkpoint_peak_rss(tmp_path):
    # ~2.1 GB of bf16 weights in several shards (MiniCPM4 layout, 8B-like widths, fewer layers).
    cfg = tiny_config("minicpm", vocab_size=73448, hidden_size=4096, intermediate_size=16384,
                      num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=2,
                      rope_scaling=None)
    folder = write_checkpoint(tmp_path / "big", cfg, dtype=torch.bfloat16, shard_bytes=500_000_000)
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    assert size > 2e9
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so the child would report this
    # test process's own peak (it just generated the weights).
    script = ("import re, sys; from arkinfer.cli.inspect import command; "
              f"command({str(folder)!r}, json_out=True); status = open('/proc/self/status').read(); "
              "print('RSS_KB', re.search(r'VmHWM:\\s+(\\d+)', status).group(1), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=dict(os.environ), check=True)
    info = json.loads(proc.stdout)
    assert info["weights"]["files"] >= 5 and info["weights"]["bytes"] > 2e9
    rss_mb = int(proc.stderr.split("RSS_KB")[-1]) / 1024
    print(f"inspect of {size / 1e9:.2f} GB checkpoint: peak RSS {rss_mb:.0f} MB")
    assert rss_mb < 300
