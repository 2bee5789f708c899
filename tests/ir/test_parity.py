"""The interpreter on the IR equals eager PyTorch: every architecture, after every pass, after a
save/load round trip; prefill of 1, 7 and 64 tokens, then 8 decode steps (fp32).

Tolerance: max|eager - IR| <= 1e-5 * max|logits| on every call, and on the final KV cache.
"""

from __future__ import annotations

import pytest
from ir_helpers import ARCHS, PROMPTS, check_parity

from arkinfer import ir

STAGES = ("traced", *ir.DEFAULT_PIPELINE)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("stage", STAGES)
def test_interpreter_equals_eager(traced, arch, stage):
    model, stages = traced(arch)
    for n in PROMPTS:
        check_parity(model, stages[stage], n)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_round_trip_equals_eager(traced, arch, tmp_path):
    model, stages = traced(arch)
    for stage in ("traced", "dce"):
        folder = ir.save(stages[stage], tmp_path / stage)
        loaded = ir.load(folder)
        assert ir.print_ir(loaded) == ir.print_ir(stages[stage])
        for n in PROMPTS:
            check_parity(model, loaded, n)


def test_passes_change_what_they_say(traced):
    _, stages = traced("qwen2")
    ops = {name: [n.op for n in p.entry("prefill").nodes] for name, p in stages.items()}
    layers = stages["traced"].num_layers
    assert ops["traced"].count(ir.Op.LINEAR) == 7 * layers + 1
    assert ops["fuse_qkv"].count(ir.Op.LINEAR) == 5 * layers + 1
    assert ops["fuse_gate_up"].count(ir.Op.LINEAR) == 4 * layers + 1
    assert ir.Op.ROPE not in ops["fold_rope_tables"] and ir.Op.ROPE_TABLE in ops["fold_rope_tables"]
    weights = stages["dce"].weights
    assert "model.layers.0.self_attn.qkv_proj.bias" in weights  # Qwen2 biases are fused too
    assert "model.layers.0.self_attn.q_proj.weight" not in weights  # dce dropped the parts
    assert "rope.inv_freq" not in weights and "rope.cos_sin" in weights
    # the input program is untouched by the passes
    assert "model.layers.0.self_attn.q_proj.weight" in stages["traced"].weights


def test_longrope_switch_is_in_the_graph(traced):
    _, stages = traced("minicpm")
    ropes = [n for n in stages["traced"].entry("decode").nodes if n.op == ir.Op.ROPE]
    assert ropes and all(n.attrs["long_after"] == 64 and n.attrs["length"] == "S+1" for n in ropes)
    prefill = [n for n in stages["traced"].entry("prefill").nodes if n.op == ir.Op.ROPE]
    assert all(n.attrs["length"] == "P+T" for n in prefill)


def test_longrope_equal_factors_have_no_switch(tiny_checkpoint):
    from arkinfer.models.configs import tiny_config

    factors = tiny_config("minicpm")["rope_scaling"]["short_factor"]
    program = ir.trace(tiny_config("minicpm", rope_scaling={
        "rope_type": "longrope", "long_factor": factors, "short_factor": factors,
        "original_max_position_embeddings": 64}))
    ropes = [n for n in program.entry("prefill").nodes if n.op == ir.Op.ROPE]
    assert ropes and all("long_after" not in n.attrs for n in ropes)
    assert "rope.inv_freq_long" not in program.weights


def test_tied_embeddings_share_one_weight(traced):
    _, stages = traced("llama-tied")
    program = stages["traced"]
    assert "lm_head.weight" not in program.weights
    head = program.entry("prefill").nodes[-1]
    assert head.op == ir.Op.LINEAR and head.attrs["weight"] == "model.embed_tokens.weight"
