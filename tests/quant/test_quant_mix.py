"""Mixed precision (quant/mix.py): the Fisher diagonal against an independent per-token
computation, the predicted KL against the measured KL of a small perturbation, the allocation
against brute force, and the `budget` recipe end to end."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from arkinfer.quant import QuantRecipe, get_preset
from arkinfer.quant.calib.stream import calibrate
from arkinfer.quant.calib_data import calibration_from_ids
from arkinfer.quant.export import export_folder
from arkinfer.quant.mix import (
    Option,
    TensorCost,
    allocate,
    fisher_diagonal,
    format_costs,
    kronecker_factors,
)
from arkinfer.quant.weight import QuantError

from arkinfer.models import build_model, parse_config
from arkinfer.models.configs import tiny_config


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


def _measured_kl(model, ids, w, delta) -> float:
    """Mean KL(model || model with w + delta) per token over the windows `ids` [N, T]."""
    with torch.no_grad():
        ref = [_logprobs(model, ids[i:i + 1]) for i in range(len(ids))]
        w += delta
        out = [_logprobs(model, ids[i:i + 1]) for i in range(len(ids))]
        w -= delta
    return sum(float((r.exp() * (r - o)).sum()) for r, o in zip(ref, out)) / ids.numel()


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
    measured = _measured_kl(model, ids, w, delta)
    assert measured > 0
    assert 0.6 < predicted / measured < 1.6, (predicted, measured)


def test_kronecker_factors_of_one_token_equal_the_fisher_diagonal():
    """With one window of one token the weight gradient is exactly g x^T, so diag(G ⊗ H) must be
    the Fisher diagonal computed by autograd on the weights (same sampled label)."""
    model = _model(4)
    ids = torch.tensor([[17]])
    factors = kronecker_factors(model, ids, seed=9)
    fisher = fisher_diagonal(model, ids, seed=9)
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"):
        kfac = factors.g[name][:, None] * torch.diagonal(factors.h[name])[None, :]
        torch.testing.assert_close(kfac, fisher[name], rtol=1e-4, atol=1e-9)
    # tied output layer: every row but the input token's carries only the output role
    rows = torch.arange(256) != 17
    kfac = factors.g["lm_head"][:, None] * torch.diagonal(factors.h["lm_head"])[None, :]
    torch.testing.assert_close(kfac[rows], fisher["lm_head"][rows], rtol=1e-4, atol=1e-9)


def test_kronecker_input_factor_is_the_mean_input_second_moment():
    """H of every linear equals mean x x^T of its inputs, captured here by plain forward hooks
    (q/k/v and gate/up share one input: the factors compute it once)."""
    model = _model(5)
    ids = torch.randint(0, 256, (3, 8), generator=torch.Generator().manual_seed(2))
    factors = kronecker_factors(model, ids)
    seen: dict[str, torch.Tensor] = {}

    def capture(name):
        def hook(module, inputs, output):
            x = inputs[0].reshape(-1, module.in_features).double()
            seen[name] = seen.get(name, 0) + x.T @ x
        return hook
    handles = [m.register_forward_hook(capture(n)) for n, m in model.named_modules()
               if n in factors.h or (n == "lm_head")]
    with torch.no_grad():
        for i in range(3):
            _logprobs(model, ids[i:i + 1])
    for handle in handles:
        handle.remove()
    assert set(seen) == set(factors.h)
    for name, gram in seen.items():
        torch.testing.assert_close(factors.h[name].double(), gram / ids.numel(), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("rank_one", [False, True])
def test_kronecker_predicted_kl_matches_the_measured_kl(rank_one):
    """The K-FAC quadratic form predicts the KL a perturbation causes, also one whose error is
    correlated across input channels (rank one), where a diagonal is blind to the correlation."""
    model = _model(2)
    ids = torch.randint(0, 256, (64, 16), generator=torch.Generator().manual_seed(4))
    factors = kronecker_factors(model, ids, seed=5)
    name = "model.layers.0.self_attn.v_proj"
    w = dict(model.named_modules())[name].weight
    gen = torch.Generator().manual_seed(6)
    if rank_one:
        delta = 0.1 * torch.outer(torch.randn(w.shape[0], generator=gen),
                                  torch.randn(w.shape[1], generator=gen)) / w.shape[1] ** 0.5
    else:
        delta = 0.02 * torch.randn(w.shape, generator=gen)
    quad = ((delta.double() @ factors.h[name].double()) * delta.double()).sum(1)
    predicted = 0.5 * float((factors.g[name].double() * quad).sum())
    measured = _measured_kl(model, ids, w, delta)
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


@pytest.mark.parametrize("sensitivity", [fisher_diagonal, kronecker_factors])
def test_format_costs_order_formats_by_bits_and_error(sensitivity):
    model = _model(3)
    ids = torch.randint(0, 256, (8, 16), generator=torch.Generator().manual_seed(7))
    costs = {c.name: c for c in format_costs(model, sensitivity(model, ids),
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


def test_input_floor_adds_the_mean_diagonal_to_h(monkeypatch):
    """INPUT_FLOOR f: the cost is the K-FAC form under H + f x mean(diag H) x I."""
    from arkinfer.quant import mix

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 6, generator=gen)
    h = x.T @ x / 50
    factors = mix.KroneckerFactors({"a": torch.rand(4, generator=gen) + 0.5}, {"a": h})
    d = torch.randn(4, 6, generator=gen)
    monkeypatch.setattr(mix, "FLOOR", 0.0)
    (plain,) = mix._kfac_cost(factors, "a", None, d)
    monkeypatch.setattr(mix, "INPUT_FLOOR", 0.5)
    (floored,) = mix._kfac_cost(factors, "a", None, d)
    h_floored = h + 0.5 * torch.diagonal(h).mean() * torch.eye(6)
    g = factors.g["a"].double()
    expected = 0.5 * float((g * ((d.double() @ h_floored.double()) * d.double()).sum(1)).sum())
    assert floored == pytest.approx(expected, rel=1e-6) and floored > plain


def test_kronecker_factors_per_domain_average_to_the_overall_output_factor():
    """Window i belongs to domain i mod C: each domain's G is its windows' mean per token, and
    the token-weighted mean of the domains' G is the overall G."""
    model = _model(5)
    ids = torch.randint(0, 256, (5, 6), generator=torch.Generator().manual_seed(3))
    factors = kronecker_factors(model, ids, seed=2, domains=2)
    assert kronecker_factors(model, ids, seed=2).g_domains is None
    counts = torch.tensor([3.0, 2.0])[:, None]  # windows 0, 2, 4 and 1, 3
    for name in ("model.layers.0.mlp.up_proj", "lm_head"):
        per_domain = factors.g_domains[name]
        assert per_domain.shape == (2, factors.g[name].shape[0])
        torch.testing.assert_close((per_domain * counts).sum(0) / 5, factors.g[name],
                                   rtol=1e-5, atol=1e-12)
        assert not torch.allclose(per_domain[0], per_domain[1])


def _domain_costs() -> list[TensorCost]:
    """Tensors whose errors cost two domains differently: the first half matter to domain 0
    only, the rest to both (twice as much to domain 1); domain 0's total is the larger, while
    the mean KL gains most from the second half."""
    costs = []
    for i in range(8):
        dom = (2.0, 0.0) if i < 4 else (1.0, 2.0)
        opts = [Option(f, b, sum(d) / 2, d) for f, b, d in (
            ("gguf-q4_0", 4.5, dom), ("gguf-q5_0", 5.5, tuple(x / 3.6 for x in dom)),
            ("gguf-q8_0", 8.5, tuple(x / 200 for x in dom)))]
        costs.append(TensorCost(f"t{i}", 1000, opts))
    return costs


def test_balanced_allocation_lowers_the_worst_domain_within_the_budget():
    costs = _domain_costs()
    plain, balanced = allocate(costs, 5.0, power=1), allocate(costs, 5.0, power=4)
    assert plain.bits_per_weight <= 5.0 and balanced.bits_per_weight <= 5.0
    assert not plain.domain_kl and len(balanced.domain_kl) == 2

    def domain_kl(plan):
        by_name = {c.name: {o.format: o for o in c.options} for c in costs}
        return [sum(by_name[n][f].domains[d] for n, f in plan.formats.items()) for d in (0, 1)]

    assert balanced.domain_kl == pytest.approx(domain_kl(balanced), rel=1e-4)
    assert max(domain_kl(balanced)) < max(domain_kl(plain))
    # the mean may only rise by what the worst domain gained
    assert balanced.predicted_kl >= plain.predicted_kl / 2 * 0.999
    with pytest.raises(QuantError, match="below the cheapest"):
        allocate(costs, 4.4, power=4)
