"""The calibration cost model (quant/calib/cost.py) counts the work `calibrate` really does: its
forward and Hessian FLOPs equal those of the torch calls a real calibration makes (counted by
wrapping them), and its solves are the shapes `gptq_quantize` is called with."""

from __future__ import annotations

import json

import pytest
import torch
from arkinfer.quant.calib import gptq as gptq_module
from arkinfer.quant.calib.cost import block_linears, predict_calibration
from arkinfer.quant.calib.hessian import HessianAccumulator
from arkinfer.quant.calib.stream import calibrate
from arkinfer.quant.recipe import get_preset, static_passes_for

from arkinfer.models import llama


class Counter:
    """Wraps torch's linear, attention and Hessian accumulation and counts their FLOPs; records
    the [out, in] of every gptq_quantize call."""

    def __init__(self, monkeypatch):
        self.forward = 0.0
        self.hessian = 0.0
        self.solves: list[tuple[int, int, int]] = []
        linear, attend = torch.nn.functional.linear, llama.Attention.attend
        add, solve = HessianAccumulator.add, gptq_module.gptq_quantize

        def counted_linear(x, w, *a, **k):
            self.forward += 2.0 * x.numel() / x.shape[-1] * w.shape[0] * w.shape[1]
            return linear(x, w, *a, **k)

        def counted_attend(att, q, k, v):
            b, hq, t, d = q.shape
            self.forward += 2.0 * b * hq * t * k.shape[2] * d  # causal: half of 2·2·t·tk·d
            return attend(att, q, k, v)

        def counted_add(acc, x, *a, **k):
            self.hessian += 2.0 * x.numel() / x.shape[-1] * acc.in_features ** 2
            return add(acc, x, *a, **k)

        def recorded_solve(w, h, **k):
            self.solves.append((w.shape[0], w.shape[1], k.get("static_passes", 1)))
            return solve(w, h, **k)

        monkeypatch.setattr(torch.nn.functional, "linear", counted_linear)
        monkeypatch.setattr(llama.Attention, "attend", counted_attend)
        monkeypatch.setattr(HessianAccumulator, "add", counted_add)
        monkeypatch.setattr(gptq_module, "gptq_quantize", recorded_solve)


@pytest.mark.parametrize("model_type,samples,seq_len", [("minicpm", 12, 32), ("llama", 3, 64)])
def test_predicted_flops_are_the_flops_calibrate_runs(tiny_checkpoint, calib_ids, tmp_path,
                                                      monkeypatch, model_type, samples,
                                                      seq_len):
    folder = tiny_checkpoint(model_type, num_hidden_layers=2)
    cfg = json.loads((folder / "config.json").read_text())
    recipe = get_preset("marlin", group_size=32)
    passes = static_passes_for(recipe.format)
    counter = Counter(monkeypatch)
    calibrate(folder, recipe, calib_ids(samples, seq_len), tmp_path / "work",
              options={"act_order": True, "static_groups": True, "static_passes": passes})
    cost = predict_calibration(cfg, recipe, samples, seq_len, 1e11, static_passes=passes)
    assert cost.flops["forward"] == pytest.approx(counter.forward, rel=1e-12)
    assert cost.flops["hessian"] == pytest.approx(counter.hessian, rel=1e-12)
    per_block = [(lin.out, lin.inp, passes) for lin in block_linears(cfg)]
    assert sorted(counter.solves) == sorted(per_block * cfg["num_hidden_layers"])


def test_two_static_passes_cost_more_than_one_and_threads_matter_below_2048():
    cfg = {"hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 8,
           "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 4}
    recipe = get_preset("marlin")
    one = predict_calibration(cfg, recipe, 8, 256, 1e11, static_passes=1)
    two = predict_calibration(cfg, recipe, 8, 256, 1e11, static_passes=2)
    assert two.seconds_by_phase["solve"] > one.seconds_by_phase["solve"]
    assert two.seconds_by_phase["forward"] == one.seconds_by_phase["forward"]
    # every input here is under 2048 columns except down's 2816: one thread for the rest
    t1 = predict_calibration(cfg, recipe, 8, 256, 1e11, threads=1)
    t2 = predict_calibration(cfg, recipe, 8, 256, 1e11, threads=2)
    assert t2.seconds_by_phase["solve"] > t1.seconds_by_phase["solve"]
    assert t2.seconds_by_phase["forward"] == t1.seconds_by_phase["forward"]


def test_peak_memory_grows_with_the_widest_input_and_the_tokens():
    cfg = {"hidden_size": 4096, "intermediate_size": 16384, "num_attention_heads": 32,
           "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 32}
    recipe = get_preset("marlin")
    small = predict_calibration(cfg, recipe, 8, 256, 1e11)
    big = predict_calibration(cfg, recipe, 128, 2048, 1e11)
    # down_proj's 16384-wide Hessian: a float64 sum plus four float32 n x n matrices
    assert small.peak_parts["largest_solve"] >= 16384 ** 2 * 24
    # 128x the tokens; the FFN activations (17 GB) are then recomputed, not kept
    assert big.peak_parts["activations"] > 50 * small.peak_parts["activations"]
    assert small.blocks == 32 and small.tokens == 8 * 256
