"""Symbolic dims (parsing is safe, canonical, evaluable) and weight-store quant annotations."""

from __future__ import annotations

import pytest
import torch

from arkinfer import ir
from arkinfer.ir import dims
from arkinfer.ir.passes import fuse_qkv
from arkinfer.models.configs import tiny_config


def test_dims_are_canonical_and_evaluate():
    assert dims.canon("T+P") == dims.canon("P + T") == "P+T"
    assert dims.canon("S+1-1") == "S" and dims.canon("2*3") == 6
    assert dims.equal("P+T", "T+P") and not dims.equal("S", "S+1")
    assert dims.evaluate("P+T", {"P": 5, "T": 7}) == 12
    assert dims.add("P", "T", 1) == "P+T+1"


@pytest.mark.parametrize("text", ["__import__('os').system('true')", "T**2", "T/2", "T.real", "[T]"])
def test_dims_reject_anything_but_arithmetic(text):
    with pytest.raises(ir.IRVerifyError):
        dims.parse(text)


def test_quant_spec_validates():
    q = ir.QuantSpec(bits=4, group_size=128, format="marlin", sym=True)
    assert ir.QuantSpec.from_json(q.to_json()) == q
    with pytest.raises(ir.IRVerifyError, match="bits=7"):
        ir.QuantSpec(bits=7, group_size=128, format="gptq", sym=True)
    with pytest.raises(ir.IRVerifyError, match="group_size=0"):
        ir.QuantSpec(bits=4, group_size=0, format="gptq", sym=True)


def test_quant_annotation_survives_save_load_and_blocks_mixed_fusion(tmp_path):
    program = ir.trace(tiny_config("llama"))  # shape-only
    store = program.weights
    q4 = ir.QuantSpec(4, 64, "gptq", True)
    for name in ("q_proj", "k_proj", "v_proj"):
        store[f"model.layers.0.self_attn.{name}.weight"].quant = q4
    fused = fuse_qkv(program)
    assert fused.weights["model.layers.0.self_attn.qkv_proj.weight"].quant == q4
    store["model.layers.1.self_attn.v_proj.weight"].quant = ir.QuantSpec(8, 64, "gptq", True)
    fused = fuse_qkv(program)  # layer 1 mixes 4 and 8 bits: it stays unfused
    assert "model.layers.1.self_attn.qkv_proj.weight" not in fused.weights
    loaded = ir.load(ir.save(program, tmp_path / "p", weights=False))
    assert loaded.weights["model.layers.0.self_attn.q_proj.weight"].quant == q4
    assert "quant=" in ir.print_ir(loaded)


def test_weight_without_data_says_how_to_get_it():
    w = ir.Weight("w", ir.TensorType(ir.DType.F32, (2, 2)), data=torch.empty(2, 2, device="meta"))
    assert not w.has_data
    with pytest.raises(ir.IRError, match="traced shape-only"):
        w.tensor()
