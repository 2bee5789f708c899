"""The parity gate's 4-bit class: its thresholds are the derivation of benchmarks/gate_thresholds.py
from the recorded measurements, a good 4-bit model passes them and a broken layout fails them.

A broken layout: every Q4_0 block with the two nibbles of each byte swapped (element j read as
j + 16, the split-vs-interleaved nibble bug), on the demo model (seconds) and, heavy, on
SmolLM2-135M's llama.cpp Q4_0 GGUF run by llama.cpp (the measurement the thresholds rest on).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from arkinfer.cli.main import app
from arkinfer.frontend.demo import demo_model_path
from arkinfer.pipeline.verify import THRESHOLDS, judge, quantisation_quality, thresholds_for

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "gate_thresholds.json"
runner = CliRunner()


def _gate_script():
    spec = importlib.util.spec_from_file_location("gate_thresholds",
                                                  ROOT / "benchmarks" / "gate_thresholds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _swap_nibbles(blocks: np.ndarray) -> None:
    """In place: Q4_0 blocks (18 bytes: fp16 scale, 16 bytes of codes j | j+16 << 4)."""
    qs = blocks.reshape(-1, 18)[:, 2:]
    qs[:] = (qs << 4) | (qs >> 4)


def test_4bit_thresholds_are_derived_from_the_recorded_measurements():
    gate = _gate_script()
    recorded = json.loads(RESULTS.read_text())
    derived = gate.derive(recorded["rows"]["llama.cpp-q4_0"], gate.heldout_spread())
    assert THRESHOLDS["4bit"].as_dict() == derived == recorded["thresholds_4bit"]
    for name, metrics in recorded["rows"].items():
        fails = judge(metrics, THRESHOLDS["4bit"])
        if name.startswith("broken"):
            assert len(fails) >= 2, (name, metrics)  # top-1 and KL both far off
        else:
            assert not fails, (name, fails)


def test_derivation_takes_the_worse_baseline_and_rounds_outwards():
    gate = _gate_script()
    q4_0 = {"top1_agreement": 0.664, "mean_kl": 0.30, "ppl_delta": 0.30}
    heldout = {"mean": {"top1_agreement": 0.70, "mean_kl": 0.34, "ppl_delta": 0.20},
               "worst": {"top1_agreement": 0.60, "mean_kl": 0.51, "ppl_delta": 0.30}}
    # top-1 0.664 - 0.10; KL 0.34 x 1.5 = 0.51 exactly (not 0.52); ppl 0.30 x 1.5
    assert gate.derive(q4_0, heldout) == {"top1": 0.56, "kl": 0.51, "ppl_delta": 0.45}


@pytest.fixture(scope="module")
def demo_q4_0(tmp_path_factory) -> tuple[Path, Path]:
    """(good, broken): the demo model as RTN Q4_0 blocks, and a copy with swapped nibbles."""
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("gate4")
    res = runner.invoke(app, ["quantize", str(demo_model_path()), "--preset", "q4_0",
                              "-o", str(root / "good"), "--no-kl"])
    assert res.exit_code == 0, res.output
    shutil.copytree(root / "good", root / "broken")
    swapped = 0
    for shard in (root / "broken").glob("*.safetensors"):
        tensors = load_file(shard)
        for tensor in tensors.values():
            if tensor.dtype == torch.uint8:
                _swap_nibbles(tensor.numpy())
                swapped += 1
        save_file(tensors, shard, metadata={"format": "pt"})
    assert swapped == 4 * 7  # every linear of the 4 blocks
    return root / "good", root / "broken"


def test_demo_q4_0_passes_and_a_broken_layout_fails(demo_q4_0):
    from arkinfer.quant import get_preset

    good, broken = demo_q4_0
    thresholds = thresholds_for(get_preset("q4_0"), "f32")
    assert thresholds == THRESHOLDS["4bit"]
    assert judge(quantisation_quality(demo_model_path(), good), thresholds) == []
    fails = judge(quantisation_quality(demo_model_path(), broken), thresholds)
    assert any(f.startswith("top1_agreement") for f in fails), fails
    assert any(f.startswith("mean_kl") for f in fails), fails


def test_demo_build_records_the_4bit_thresholds(demo_artifact):
    m = json.loads((demo_artifact / "arkinfer.json").read_text())
    assert m["verification"]["thresholds"] == THRESHOLDS["4bit"].as_dict()
    assert m["verification"]["passed"]


@pytest.mark.heavy
@pytest.mark.llamacpp
def test_smollm2_llamacpp_q4_0_passes_and_its_broken_layout_fails(tmp_path):
    """The row the thresholds rest on, re-measured live, and its nibble-swapped copy."""
    pytest.importorskip("llama_cpp")
    gate = _gate_script()
    q4_0 = gate.GGUF_ROWS["llama.cpp-q4_0"]
    if not q4_0.is_file():
        pytest.skip(f"{q4_0} is missing: run benchmarks/quant_quality.py --only llama.cpp-q4_0")
    from arkinfer.backends.gguf.runner import LlamaCppRunner
    from arkinfer.pipeline.verify import float_reference, parity_metrics
    from arkinfer.testing.smollm2 import smollm2_hf_dir

    reference = float_reference(smollm2_hf_dir())
    broken = gate.swap_nibbles(q4_0, tmp_path / "broken.gguf")
    good = parity_metrics(reference, LlamaCppRunner(q4_0), reference.prompts)
    assert judge(good, THRESHOLDS["4bit"]) == []
    bad = parity_metrics(reference, LlamaCppRunner(broken), reference.prompts)
    assert bad["top1_agreement"] < 0.5 * THRESHOLDS["4bit"].top1, bad
    assert len(judge(bad, THRESHOLDS["4bit"])) >= 2
