"""The calibration cost model (quant/calib/cost.py) counts the work `calibrate` really does: its
forward and Hessian FLOPs equal those of the torch calls a real calibration makes (counted by
wrapping them), its solves are the shapes `gptq_quantize` is called with, and the activations
it counts alive at each solve are the [batch, T, width] tensors alive then (found by the garbage
collector)."""

from __future__ import annotations

import gc
import json
import warnings

import pytest
import torch
from arkinfer.quant.calib import gptq as gptq_module
from arkinfer.quant.calib.block import default_batch, reference_rows
from arkinfer.quant.calib.cost import (
    block_linears,
    predict_calibration,
    predict_calibration_on_gpu,
    stage_bytes,
)
from arkinfer.quant.calib.gpus import GPUS, find_gpu, gpu_of_device_name
from arkinfer.quant.calib.hessian import HessianAccumulator
from arkinfer.quant.calib.sequential import REPORT_SEQUENCES
from arkinfer.quant.calib.stream import calibrate
from arkinfer.quant.recipe import get_preset, static_passes_for
from arkinfer.quant.weight import QuantError

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


def _activation_bytes(seq_len: int) -> int:
    """Bytes of the distinct storages of live float32 [batch, seq_len, width] tensors."""
    seen: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance on a deprecated torch.distributed alias warns
        warnings.simplefilter("ignore", FutureWarning)
        tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    for t in tensors:
        if t.dim() == 3 and t.shape[1] == seq_len and t.dtype == torch.float32 and not t.is_meta:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def test_activations_alive_at_each_solve_are_the_ones_predicted(tiny_checkpoint, calib_ids,
                                                                 tmp_path, monkeypatch):
    samples, seq_len = 12, 32
    folder = tiny_checkpoint("minicpm", num_hidden_layers=2)
    cfg = json.loads((folder / "config.json").read_text())
    recipe = get_preset("marlin", group_size=32)
    passes = static_passes_for(recipe.format)
    alive: list[tuple[tuple[int, int], int]] = []
    solve = gptq_module.gptq_quantize

    def recorded_solve(w, h, **k):
        gc.collect()
        alive.append(((w.shape[0], w.shape[1]), _activation_bytes(seq_len)))
        return solve(w, h, **k)

    monkeypatch.setattr(gptq_module, "gptq_quantize", recorded_solve)
    calibrate(folder, recipe, calib_ids(samples, seq_len), tmp_path / "work",
              options={"act_order": True, "static_groups": True, "static_passes": passes})
    ref = reference_rows(REPORT_SEQUENCES, samples, default_batch(seq_len)) * seq_len
    stages = stage_bytes(cfg, samples * seq_len, passes, ref)
    names = dict(zip([(lin.out, lin.inp) for lin in block_linears(cfg)],
                     ("qkv", "o", "gate_up", "down")))
    assert len(alive) == 4 * cfg["num_hidden_layers"]
    for shape, measured in alive:
        assert measured == stages[names[shape]][0], names[shape]


def test_gpu_prediction_scales_with_the_gpu_and_leaves_out_the_process():
    cfg = {"hidden_size": 4096, "intermediate_size": 16384, "num_attention_heads": 32,
           "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 32}
    recipe = get_preset("marlin")
    h100 = predict_calibration_on_gpu(cfg, recipe, 128, 2048, find_gpu("H100"))
    a100 = predict_calibration_on_gpu(cfg, recipe, 128, 2048, find_gpu("a100"))
    assert h100.peak_parts["process"] == 0 and h100.peak_bytes == a100.peak_bytes
    # the FLOP phases scale with the fp32 rate; the column loop (in "solve") does not
    assert a100.seconds_by_phase["forward"] == pytest.approx(
        h100.seconds_by_phase["forward"] * 67 / 19.5, rel=1e-2)
    assert a100.seconds_by_phase["solve"] < h100.seconds_by_phase["solve"] * 67 / 19.5
    # at 128 x 2048 the two [tokens, 4096] activations beside down_proj's solve set the peak
    assert h100.peak_stage == "down"
    assert h100.peak_parts["activations"] == 128 * 2048 * 4 * 2 * 4096 + \
        reference_rows(REPORT_SEQUENCES, 128, default_batch(2048)) * 2048 * 4 * 4096


def test_gpu_names():
    assert gpu_of_device_name("NVIDIA H100 80GB HBM3") is GPUS["h100"]
    assert gpu_of_device_name("NVIDIA L40S") is GPUS["l40s"]
    assert gpu_of_device_name("NVIDIA L4") is GPUS["l4"]
    assert gpu_of_device_name("Tesla T4") is None
    with pytest.raises(QuantError, match="h100-pcie"):
        find_gpu("t4")


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
    assert small.peak_stage == "block" and small.peak_parts["solve"] >= 16384 ** 2 * 24
    # 128x the tokens; the FFN activations (17 GB) are then recomputed, not kept
    assert big.peak_parts["activations"] > 30 * small.peak_parts["activations"]
    assert big.peak_bytes > small.peak_bytes + 7 * 2**30
    assert small.blocks == 32 and small.tokens == 8 * 256
