"""Mixed precision (quant/mix.py): the Fisher diagonal against an independent per-token
computation, the predicted KL against the measured KL of a small perturbation, the allocation
against brute force, and the `budget` recipe end to end."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from arkinfer.models import build_model, parse_config
from arkinfer.models.configs import tiny_config
from arkinfer.quant import QuantRecipe, get_preset
from arkinfer.quant.calib.stream import calibrate
from arkinfer.quant.calib_data import calibration_from_ids
from arkinfer.quant.export import export_folder
from arkinfer.quant.mix import Option, TensorCost, allocate, fisher_diagonal, format_costs
from arkinfer.quant.weight import QuantError


def _model(seed: int = 0) -> torch.nn.Module:
    """A tiny llama (2 blocks, hidden 64, vocab 256) with weights large enough to matter."""
    torch.manual_seed(seed)
    cfg = tiny_config("llama", vocab_size=256, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2)
    model = build_model(parse_config(cfg))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return model.eval()


def _logprobs(model, ids):
    logits, _ = model(ids, torch.arange(ids.shape[1]), model.empty_cache(1))
    return torch.log_softmax(logits[0].double(), dim=-1)


def test_fisher_diagonal_equals_the_expected_squared_score_per_token():
    """With many sampled labels, F = E_y[(d log p(y) / dw)^2] per token; computed here exactly
    (sum over every label y weighted by p(y)) for one window of 2 tokens."""
    model = _model()
    ids = torch.randint(0, 256, (1, 2), generator=torch.Generator().manual_seed(1))
    name = "model.layers.1.mlp.down_proj"
    w = dict(model.named_modules())[name].weight
    exact = torch.zeros_like(w, dtype=torch.float64)
    lp = _logprobs(model, ids)
    for t in range(2):
        p = lp[t].exp().detach()
        for y in range(256):
            (g,) = torch.autograd.grad(lp[t, y], [w], retain_graph=True)
            exact += p[y] * g.double() ** 2
    exact /= 2
    windows = ids.repeat(3000, 1)
    est = fisher_diagonal(model, windows, seed=3)[name].double()
    rel = (est - exact).abs().sum() / exact.abs().sum()
    assert rel < 0.1, float(rel)


def test_predicted_kl_matches_the_measured_kl_of_a_small_perturbation():
    model = _model(2)
    ids = torch.randint(0, 256, (64, 16), generator=torch.Generator().manual_seed(4))
    fisher = fisher_diagonal(model, ids, seed=5)
    name = "model.layers.0.self_attn.v_proj"
    w = dict(model.named_modules())[name].weight
    delta = 0.02 * torch.randn(w.shape, generator=torch.Generator().manual_seed(6))
    predicted = 0.5 * float((fisher[name] * delta ** 2).sum())
    with torch.no_grad():
        ref = [_logprobs(model, ids[i:i + 1]) for i in range(64)]
        w += delta
        out = [_logprobs(model, ids[i:i + 1]) for i in range(64)]
        w -= delta
    measured = sum(float((r.exp() * (r - o)).sum()) for r, o in zip(ref, out)) / (64 * 16)
    assert measured > 0
    assert 0.6 < predicted / measured < 1.6, (predicted, measured)


def _brute_force(costs, budget):
    total = sum(c.weights for c in costs)
    best = None
    for choice in itertools.product(*[c.options for c in costs]):
        bits = sum(o.bits * c.weights for o, c in zip(choice, costs)) / total
        if bits <= budget + 1e-9:
            kl = sum(o.kl for o in choice)
            best = kl if best is None or kl < best else best
    return best


def test_allocation_meets_the_budget_and_is_near_the_brute_force_optimum():
    gen = torch.Generator().manual_seed(0)
    costs = []
    for i in range(6):
        base = float(torch.rand((), generator=gen)) + 0.05
        costs.append(TensorCost(f"t{i}", int(torch.randint(1, 5, (), generator=gen)) * 1000, [
            Option("gguf-q4_0", 4.5, base), Option("gguf-q5_0", 5.5, base / 3.6),
            Option("gguf-q8_0", 8.5, base / 200)]))
    for budget in (4.5, 4.9, 5.5, 6.5, 8.5):
        plan = allocate(costs, budget)
        assert plan.bits_per_weight <= budget + 1e-9
        optimum = _brute_force(costs, budget)
        # greedy on the convex hull: optimal up to the last, partly affordable step
        assert plan.predicted_kl <= optimum * 1.35 + 1e-12, (budget, plan.predicted_kl, optimum)
    with pytest.raises(QuantError, match="below the cheapest"):
        allocate(costs, 4.4)


def test_format_costs_order_formats_by_bits_and_error():
    model = _model(3)
    ids = torch.randint(0, 256, (8, 16), generator=torch.Generator().manual_seed(7))
    costs = {c.name: c for c in format_costs(model, fisher_diagonal(model, ids),
                                             ("gguf-q4_0", "gguf-q5_0", "gguf-q8_0"))}
    assert "lm_head" in costs and len(costs) == 2 * 7 + 1
    for c in costs.values():
        assert [o.format for o in c.options] == ["gguf-q4_0", "gguf-q5_0", "gguf-q8_0"]
        kls = [o.kl for o in c.options]
        assert kls[0] > kls[1] > kls[2] >= 0


def test_budget_recipe_end_to_end(tiny_checkpoint, tmp_path):
    """The gptq-mix preset chooses formats under its budget and records them in the folder."""
    folder = tiny_checkpoint("llama", tie_word_embeddings=True)
    recipe = get_preset("gptq-mix", budget=5.0)
    ids = torch.randint(0, 500, (4, 32), generator=torch.Generator().manual_seed(0))
    run = calibrate(folder, recipe, calibration_from_ids(ids), tmp_path / "w",
                    options={"act_order": True, "static_groups": True})
    assert run.recipe.layers and run.recipe.budget == 5.0
    out = export_folder(run, tmp_path / "q")
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    summary = json.loads((out / "quant_summary.json").read_text())
    assert set(qcfg["layers"]) <= {*(r["name"] for b in summary["blocks"] for r in b["linears"]),
                                   "model.embed_tokens"}
    with pytest.raises(QuantError, match="bits budget"):
        QuantRecipe("gptq", "gptq", 4, 128, budget=4.9)
    with pytest.raises(QuantError, match="outside"):
        QuantRecipe("gptq", "gguf-q4_0", 4, 32, budget=3.0)


@pytest.mark.llamacpp
def test_build_gptq_mix_gguf_passes_the_gate_within_its_budget(tmp_path):
    """`arkinfer build demo --quant gptq-mix`: a GGUF with per-tensor types that llama.cpp runs,
    inside the 4-bit gate, its stored bits per weight within the preset's budget."""
    import gguf
    from typer.testing import CliRunner

    from arkinfer.cli.main import app

    out = tmp_path / "art"
    result = CliRunner().invoke(app, ["build", "demo", "--target", "host", "--backend", "gguf",
                                      "--quant", "gptq-mix", "--samples", "16", "--seq-len",
                                      "128", "-o", str(out)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "arkinfer.json").read_text())
    assert manifest["verification"]["passed"] is True
    tensors = [t for t in gguf.GGUFReader(next(out.glob("*.gguf"))).tensors
               if len(t.shape) == 2 and "norm" not in t.name]
    if any(t.name == "output.weight" for t in tensors):  # untied: the input embedding is no
        tensors = [t for t in tensors if t.name != "token_embd.weight"]  # linear, not budgeted
    types = {t.tensor_type.name for t in tensors}
    assert len(types) >= 2, types  # mixed
    bits = 8 * sum(int(t.n_bytes) for t in tensors) / sum(int(t.n_elements) for t in tensors)
    assert bits <= 4.9 + 1e-6, bits
