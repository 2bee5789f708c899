"""Exported gptq / marlin / awq (and generic) folders: tensors in the runtime layout, every
config field vLLM / transformers read, and a reload that gives the calibrated weights back."""

from __future__ import annotations

import json

import pytest
import torch
from arkinfer.quant import QuantRecipe, get_format
from arkinfer.quant.calib import StrictError
from arkinfer.quant.calib.stream import calibrate, load_weights
from arkinfer.quant.export import export_folder
from arkinfer.quant.load import format_of, load_quantized
from safetensors import safe_open

# What vLLM's config parsers read (gptq.py / gptq_marlin.py / marlin.py / awq.py / awq_marlin.py)
# and what transformers' GPTQConfig / AwqConfig carry.
REQUIRED = {
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": True, "desc_act": True,
             "checkpoint_format": "gptq", "lm_head": False, "dynamic": {}, "damp_percent": 0.01,
             "true_sequential": True, "static_groups": False},
    "marlin": {"quant_method": "gptq", "checkpoint_format": "marlin", "is_marlin_format": True,
               "bits": 4, "group_size": 128, "sym": True, "desc_act": False, "lm_head": False},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True,
            "version": "gemm", "modules_to_not_convert": None},
}
RECIPES = {
    "gptq": QuantRecipe("gptq", "gptq", 4, 64, sym=True, desc_act=True),
    "marlin": QuantRecipe("gptq", "marlin", 4, 128, sym=True),
    "awq": QuantRecipe("awq", "awq", 4, 64, sym=False),
}
SHAPES = {  # key -> (dtype, shape for a linear [out=256, in=128], 4-bit)
    "gptq": {"qweight": (torch.int32, (16, 256)), "qzeros": (torch.int32, (2, 32)),
             "scales": (torch.float16, (2, 256)), "g_idx": (torch.int32, (128,))},
    "marlin": {"B": (torch.int32, (8, 512)), "s": (torch.float16, (1, 256))},
    "awq": {"qweight": (torch.int32, (128, 32)), "qzeros": (torch.int32, (2, 32)),
            "scales": (torch.float16, (2, 256))},
}


@pytest.fixture(scope="module")
def exported(tiny_checkpoint, calib_ids, tmp_path_factory):
    folder = tiny_checkpoint("llama")  # hidden 128, ffn 256, 4 q / 2 kv heads of 32
    made = {}

    def make(fmt: str):
        if fmt not in made:
            tmp = tmp_path_factory.mktemp(fmt)
            run = calibrate(folder, RECIPES[fmt], calib_ids(4, 32), tmp / "work")
            out = export_folder(run, tmp / "out", keep_work=True)
            made[fmt] = (run, out)
        return made[fmt]

    return make


@pytest.mark.parametrize("fmt", ["gptq", "marlin", "awq"])
def test_config_has_every_field_runtimes_read(exported, fmt):
    _, out = exported(fmt)
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    for key, value in REQUIRED[fmt].items():
        assert key in qcfg, key
        assert qcfg[key] == value, (key, qcfg[key])
    assert format_of(qcfg)[0] == fmt
    if fmt != "awq":
        assert json.loads((out / "quantize_config.json").read_text()) == qcfg
    summary = json.loads((out / "quant_summary.json").read_text())
    assert summary["calibration_sha256"] == qcfg["meta"]["calibration_sha256"]
    assert len(summary["blocks"]) == 2 and summary["quantised_linears"] == 14


@pytest.mark.parametrize("fmt", ["gptq", "marlin", "awq"])
def test_tensors_in_runtime_layout(exported, fmt):
    _, out = exported(fmt)
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    owner = "model.layers.1.mlp.up_proj"  # [out=256, in=128]
    assert f"{owner}.weight" not in index
    assert "model.embed_tokens.weight" in index and "lm_head.weight" in index
    for key, (dtype, shape) in SHAPES[fmt].items():
        with safe_open(str(out / index[f"{owner}.{key}"]), framework="pt") as f:
            t = f.get_tensor(f"{owner}.{key}")
        assert t.dtype == dtype and tuple(t.shape) == shape, key
    assert {f"{owner}.{k}" for k in SHAPES[fmt]} == {n for n in index if n.startswith(owner)}


@pytest.mark.parametrize("fmt", ["gptq", "marlin", "awq"])
def test_reload_gives_the_calibrated_weights(exported, fmt):
    run, out = exported(fmt)
    model = load_quantized(out)
    sd = model.state_dict()
    for i in range(2):
        quantized, floats, _ = load_weights(run.work_dir / f"block_{i:04d}.safetensors")
        assert len(quantized) == 7
        for name, qw in quantized.items():
            assert torch.equal(sd[f"{name}.weight"], qw.dequantize()), name
            packed = get_format(fmt).pack(qw)  # the packed tensors are the format's own
            assert get_format(fmt).unpack(packed, qw.out_features, qw.in_features,
                                          bits=4, group_size=qw.group_size,
                                          sym=qw.sym).equals(qw)
        for name, t in floats.items():
            assert torch.equal(sd[name], t)
    logits, _ = model(torch.tensor([[1, 2, 3]]), torch.arange(3), model.empty_cache(1))
    assert torch.isfinite(logits).all()


def test_refused_layers_listed_and_strict_fails(tiny_checkpoint, calib_ids, tmp_path):
    # hidden 192: marlin needs in_features % 128 == 0, so q/k/v/o/gate/up stay float
    folder = tiny_checkpoint("llama", hidden_size=192, num_attention_heads=6,
                             num_key_value_heads=2, intermediate_size=256)
    recipe = QuantRecipe("gptq", "marlin", 4, 64)
    run = calibrate(folder, recipe, calib_ids(2, 16), tmp_path / "w")
    refused = [r for b in run.blocks for r in b["linears"] if r["status"] == "refused"]
    assert {r["name"].rsplit(".", 1)[1] for r in refused} == {"q_proj", "k_proj", "v_proj",
                                                              "o_proj", "gate_proj", "up_proj"}
    assert all("in_features=192" in r["reason"] for r in refused)
    out = export_folder(run, tmp_path / "out")
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.0.self_attn.q_proj.weight" in index
    assert "model.layers.0.mlp.down_proj.B" in index
    summary = json.loads((out / "quant_summary.json").read_text())
    assert len(summary["float_linears"]) == 12
    load_quantized(out)
    with pytest.raises(StrictError, match="in_features=192"):
        calibrate(folder, recipe, calib_ids(2, 16), tmp_path / "w2", strict=True)


def test_gptq_dynamic_lists_float_layers(tiny_checkpoint, calib_ids, tmp_path):
    recipe = QuantRecipe("gptq", "gptq", 4, 64, skip=("lm_head", "down_proj"))
    run = calibrate(tiny_checkpoint("llama"), recipe, calib_ids(2, 16), tmp_path / "w")
    out = export_folder(run, tmp_path / "out")
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert sorted(qcfg["dynamic"]) == [r"-:model\.layers\.0\.mlp\.down_proj$",
                                       r"-:model\.layers\.1\.mlp\.down_proj$"]
    load_quantized(out)


def test_quantised_tied_lm_head_and_ternary_layout(tiny_checkpoint, calib_ids, tmp_path):
    folder = tiny_checkpoint("llama", hidden_size=256, intermediate_size=512,
                             tie_word_embeddings=True)
    recipe = QuantRecipe("ternary", "gguf-tq2_0", 2, -1, skip=())
    run = calibrate(folder, recipe, calib_ids(2, 16), tmp_path / "w")
    assert run.tail["status"] == "quantised"
    out = export_folder(run, tmp_path / "out")
    raw = json.loads((out / "config.json").read_text())
    assert raw["tie_word_embeddings"] is False
    assert raw["quantization_config"]["quant_method"] == "arkinfer"
    assert raw["quantization_config"]["format"] == "gguf-tq2_0"
    model = load_quantized(out)
    w = model.lm_head.weight
    assert not torch.equal(w, model.model.embed_tokens.weight)
    # every row is one absmean scale times trits
    row = w[0]
    assert len(torch.unique(row.abs())) <= 2
