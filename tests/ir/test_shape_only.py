"""Shape-only tracing: configs trace without weights; the 8B config within 60 s and 2 GB."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from arkinfer import ir
from arkinfer.models.configs import MINICPM4_1_8B, tiny_config


def test_config_dict_traces_without_weights(tmp_path):
    program = ir.trace(tiny_config("minicpm"))
    assert program.meta["dtype"] == "f32"
    # parameters have types only; the RoPE frequencies are computed from the config, so they are real
    assert [w.name for w in program.weights if w.has_data] == ["rope.inv_freq", "rope.inv_freq_long"]
    with pytest.raises(ir.IRError, match="traced shape-only"):
        ir.step(program, "prefill", *_one_token(), ir.empty_cache(program))
    with pytest.raises(ir.SchemaError, match="weights=False"):
        ir.save(program, tmp_path / "p")
    optimised = ir.run_passes(program)  # passes work on shape-only programs (meta weights)
    loaded = ir.load(ir.save(optimised, tmp_path / "p", weights=False))
    assert ir.print_ir(loaded) == ir.print_ir(optimised)


def test_config_only_folder_traces(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_config("qwen3")))
    program = ir.trace(tmp_path, shape_only=True)
    assert program.meta["model_type"] == "qwen3" and program.num_layers == 2


def test_serialised_schema(tmp_path):
    program = ir.trace(tiny_config("llama"))
    ir.save(program, tmp_path, weights=False)
    data = json.loads((tmp_path / "graph.json").read_text())
    assert data["format"] == "arkinfer-ir" and data["schema_version"] == ir.SCHEMA_VERSION
    assert set(data["entries"]) == {"prefill", "decode"}
    node = data["entries"]["prefill"]["nodes"][0]
    assert set(node) == {"name", "op", "inputs", "attrs", "type", "source"}
    assert node["op"] == "embed" and node["type"]["shape"] == [1, "T", 128]
    assert node["source"] == "model.embed_tokens"
    data["schema_version"] = 99
    (tmp_path / "graph.json").write_text(json.dumps(data))
    with pytest.raises(ir.SchemaError, match="schema_version 99"):
        ir.load(tmp_path)


def _one_token():
    import torch

    return torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long)


CHILD = """
import re, sys, time
start = time.perf_counter()
from arkinfer.cli.main import app
imported = time.perf_counter()
try:
    app(["inspect", sys.argv[1], "--ir"], standalone_mode=False)
finally:
    done = time.perf_counter()
    peak = re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)
    print(f"PEAK_KB {peak} TRACE_S {done - imported:.1f} IMPORT_S {imported - start:.1f}",
          file=sys.stderr)
"""


@pytest.mark.heavy
def test_minicpm41_8b_config_traces_in_60s_and_2gb(tmp_path):
    """`arkinfer inspect --ir` on a config-only MiniCPM4.1-8B folder, measured in a child process
    (VmHWM of the child itself: ru_maxrss would carry this process's peak across exec)."""
    (tmp_path / "config.json").write_text(json.dumps(MINICPM4_1_8B))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], check=False,
                          capture_output=True,
                          text=True, env=dict(os.environ), timeout=300)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(r"PEAK_KB (\d+) TRACE_S ([\d.]+) IMPORT_S ([\d.]+)", proc.stderr)
    peak_mb, trace_s = int(m.group(1)) / 1024, float(m.group(2))
    print(f"8B shape-only trace + print: {trace_s:.1f} s (import {m.group(3)} s, wall {wall:.1f} s),"
          f" peak RSS {peak_mb:.0f} MB")
    out = proc.stdout
    assert "# ArkInfer IR: minicpm, bf16, batch 1, 32 layers, max_len 65536" in out
    assert "model.layers.31.mlp.down_proj.weight" in out and "bf16[73448,4096]" in out
    assert "prefill(" in out and "decode(" in out
    assert out.count("= attention(") == 64 and out.count("= rope(") == 128
    assert "long_after" not in out  # 4.1's factor lists are equal: no LongRoPE switch
    assert trace_s < 60 and peak_mb < 2048
