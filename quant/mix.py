"""Mixed precision: which linears get more bits, measured on the model, under a bit budget.

    factors = kronecker_factors(model, calib.ids[:16, :512])     # per linear: G [out], H [in, in]
    costs = format_costs(model, factors, CANDIDATES, gptq=True)  # per tensor, per format
    plan = allocate(costs, budget=4.9)                           # {linear: format}
    recipe = replace(base_recipe, skip=(), layers=plan.layers())  # QuantRecipe.layers

1. Sensitivity: the Fisher information of the model's own predictive distribution,
   `F = E_x E_{y ~ p(.|x)} g g^T`, `g = d log p(y|x) / d w`, from calibration windows with labels
   *sampled from the model* (so it measures how far the predictions move, not how well the
   calibration text is predicted). To second order the KL divergence a weight perturbation `d`
   causes is `1/2 d^T F d` per token. `kronecker_factors` (the default) takes each linear's block
   as `G ⊗ H`: `G` the mean squared gradient of the linear's output per row, `H` the mean input
   `x x^T` (input channels' correlations counted); `fisher_diagonal` (the ablation) keeps only
   the per-weight diagonal. Each window's gradient sums T tokens whose sampled-label gradients
   have mean zero, so per-window second moments over T are per-token ones.
2. Cost of a format for a tensor: that quadratic form with `d = W - Q_format(W)` and the format's
   stored bits per weight (`Format.nbytes`); `Q` is GPTQ under the float model's `H` (the
   default, `SENSITIVITY = "kfac-gptq"`: GPTQ lowers different tensors' errors by different
   factors) or ArkInfer's RTN (mse grid, fp16 scales). Formats a tensor's shape cannot use
   (K-quant super-blocks need rows of 256) are left out for it.
3. `allocate`: every tensor starts in its cheapest format; then, greedily, the upgrade with the
   largest predicted KL reduction per added bit is taken while the mean bits per weight of all
   linears plus the output layer stays within the budget (a convex-hull knapsack; each tensor's
   candidates that are not on its lower convex hull of (bits, KL) are never chosen).

GPTQ then quantises each linear in its format (benchmarks/quant_quality.py measures the result).
Memory: `H` per distinct linear input (float64) and, for the diagonal, one float32 gradient per
weight (the model again, 0.5 GB for a 135M model); models beyond RAM are not handled here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from .formats import FormatError, get_format
from .rtn import quantize_rtn
from .weight import QuantError

#: Formats mixed precision chooses among, cheapest first (GGUF blocks llama.cpp runs).
CANDIDATES: tuple[str, ...] = ("gguf-q4_0", "gguf-iq4_nl", "gguf-q4_k", "gguf-q5_0", "gguf-q5_k",
                               "gguf-q6_k", "gguf-q8_0")
OUTPUT = "lm_head"

ProgressFn = Callable[[int, int], None]


def _linear_weights(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """{linear name: weight parameter} of every decoder linear and the output layer (`lm_head`;
    the embedding's parameter when the two are tied)."""
    out = {}
    for name, module in model.named_modules():
        if name.startswith("model.layers.") and isinstance(module, torch.nn.Linear):
            out[name] = module.weight
    out[OUTPUT] = model.lm_head.weight
    return out


def _sampled_label_losses(model: torch.nn.Module, windows: Tensor, trainable: list[Tensor],
                          seed: int, progress: ProgressFn | None):
    """Yield, for each window of `windows` [N, T], the summed NLL of labels sampled from the
    model's own predictions (a scalar with a graph back to `trainable`, the only parameters that
    require grad meanwhile); grad mode and every parameter's requires_grad are restored after."""
    params = list(model.parameters())
    saved = [p.requires_grad for p in params]
    gen = torch.Generator().manual_seed(seed)
    n, t = windows.shape
    grad_before = torch.is_grad_enabled()
    try:
        torch.set_grad_enabled(True)  # callers such as calibrate() run under no_grad
        for p in params:
            p.requires_grad_(False)
        for p in trainable:
            p.requires_grad_(True)
        for i in range(n):
            logits, _ = model(windows[i:i + 1], torch.arange(t), model.empty_cache(1))
            logp = torch.log_softmax(logits[0].float(), dim=-1)
            with torch.no_grad():
                labels = torch.multinomial(logp.exp(), 1, generator=gen)
            yield -logp.gather(1, labels).sum()
            del logp, logits
            if progress is not None:
                progress(i + 1, n)
    finally:
        torch.set_grad_enabled(grad_before)
        for p, s in zip(params, saved):
            p.requires_grad_(s)


def fisher_diagonal(model: torch.nn.Module, windows: Tensor, *, seed: int = 0,
                    progress: ProgressFn | None = None) -> dict[str, Tensor]:
    """Per-token Fisher diagonal {linear name: F float32 [out, in]} (module docstring, step 1)
    from `windows` [N, T] token ids (one forward + backward each)."""
    weights = _linear_weights(model)
    acc = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in weights.items()}
    for loss in _sampled_label_losses(model, windows, list(weights.values()), seed, progress):
        grads = torch.autograd.grad(loss, list(weights.values()))
        for name, g in zip(weights, grads):
            acc[name] += g.float() ** 2
        del grads
    return {name: a / windows.numel() for name, a in acc.items()}


@dataclass
class KroneckerFactors:
    """K-FAC sensitivity of the linears: the Fisher block of a weight matrix approximated as
    `G ⊗ H` — per output row `G [out]` (mean squared gradient of the layer's output, labels
    sampled from the model) and the input second moment `H [in, in]` (mean `x x^T`, the matrix
    GPTQ minimises against), so an error `d [out, in]` costs `1/2 sum_i G_i d_i H d_i^T` nats per
    token: unlike the diagonal it counts how input channels move together (outlier and
    correlated channels), which is what GPTQ's error feedback exploits.
    `embedding [V, D]`: the diagonal Fisher of the token embedding's *input* role when it is tied
    to the output layer (its output role is `G, H` of `lm_head`).
    `g_domains` {name: [C, out]}: `G` of each calibration domain alone (window i is domain
    i mod C, as quant/calib_data.py deals them), for `allocate`'s balanced objective; H and the
    embedding term are shared by the domains."""

    g: dict[str, Tensor]
    h: dict[str, Tensor]
    embedding: Tensor | None = None
    g_domains: dict[str, Tensor] | None = None


def kronecker_factors(model: torch.nn.Module, windows: Tensor, *, seed: int = 0,
                      progress: ProgressFn | None = None, domains: int = 1) -> KroneckerFactors:
    """`KroneckerFactors` of every decoder linear and the output layer from `windows` [N, T]
    (one forward + backward each, labels sampled from the model as in `fisher_diagonal`);
    `domains` > 1 also keeps each domain's G (window i from domain i mod `domains`)."""
    modules = {name: m for name, m in model.named_modules()
               if name.startswith("model.layers.") and isinstance(m, torch.nn.Linear)}
    modules[OUTPUT] = model.lm_head
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    domains = max(1, min(domains, windows.shape[0]))
    g = {n: torch.zeros(domains, m.out_features, dtype=torch.float64)
         for n, m in modules.items()}
    current = [0]  # the domain of the window being run
    h = {n: torch.zeros(m.in_features, m.in_features, dtype=torch.float64)
         for n, m in modules.items()}
    emb = torch.zeros_like(model.lm_head.weight, dtype=torch.float32) if tied else None
    # x^T x of the last input seen, reused by the linears that read the same tensor (q/k/v,
    # gate/up); the input is held so its memory cannot be reused by another tensor meanwhile.
    last: list = [None, None]

    def on_linear(name):
        def hook(module, inputs, output):
            x = inputs[0]
            if last[0] is not x:
                flat = x.detach().reshape(-1, module.in_features).float()
                last[:] = [x, (flat.T @ flat).double()]
            h[name] += last[1]

            def grad_hook(grad):  # returns None: the gradient flows on unchanged
                g[name][current[0]] += grad.detach().reshape(-1, module.out_features).double() \
                    .pow(2).sum(0)
            output.register_hook(grad_hook)
        return hook

    def on_embedding(module, inputs, output):
        ids = inputs[0].reshape(-1)

        def grad_hook(grad):
            rows = torch.zeros_like(emb).index_add_(0, ids, grad.detach().reshape(len(ids), -1)
                                                   .float())
            emb.add_(rows.pow_(2))
        output.register_hook(grad_hook)

    handles = [m.register_forward_hook(on_linear(n)) for n, m in modules.items()]
    if tied:
        handles.append(model.model.embed_tokens.register_forward_hook(on_embedding))
    embedding = model.model.embed_tokens.weight  # gradients flow from the input on
    try:
        for i, loss in enumerate(_sampled_label_losses(model, windows, [embedding], seed,
                                                        progress)):
            current[0] = i % domains  # backward runs the grad hooks of window i
            torch.autograd.grad(loss, [embedding])
            last[:] = [None, None]
    finally:
        for handle in handles:
            handle.remove()
    tokens = windows.numel()
    per_domain = (torch.bincount(torch.arange(windows.shape[0]) % domains) * windows.shape[1]) \
        .double()[:, None]  # tokens per domain
    return KroneckerFactors({k: (v.sum(0) / tokens).float() for k, v in g.items()},
                            {k: (v / tokens).float() for k, v in h.items()},
                            None if emb is None else emb / tokens,
                            {k: (v / per_domain).float() for k, v in g.items()}
                            if domains > 1 else None)


def _kfac_cost(factors: KroneckerFactors, name: str, rows: Tensor | None,
               d: Tensor) -> tuple[float, ...]:
    """1/2 sum_i G_i d_i H d_i^T (+ the tied embedding's diagonal term) over the rows `rows` of
    tensor `name` (all rows when None) with the error `d` of those rows; G floored as the
    diagonal Fisher is (FLOOR). One cost per domain of `factors.g_domains` (else one)."""
    gs = factors.g_domains[name] if factors.g_domains is not None else factors.g[name][None]
    gs = gs + FLOOR * gs.mean(1, keepdim=True)
    if rows is not None:
        gs = gs[:, rows]
    h = factors.h[name].double()
    quad = ((d.double() @ h) * d.double()).sum(1)
    if INPUT_FLOOR:  # H + INPUT_FLOOR x mean(diag H) x I: input directions calibration lacks
        quad = quad + INPUT_FLOOR * float(torch.diagonal(h).mean()) * (d.double() ** 2).sum(1)
    costs = 0.5 * (gs.double() * quad).sum(1)
    if name == OUTPUT and factors.embedding is not None:
        f = factors.embedding
        f = f + FLOOR * f.mean()
        if rows is not None:
            f = f[rows]
        costs = costs + 0.5 * float((f * d ** 2).sum(dtype=torch.float64))
    return tuple(float(c) for c in costs)


@dataclass(frozen=True)
class Option:
    """One storage choice for a tensor: format, stored bits per weight, predicted KL (nats per
    token) of that tensor alone stored that way."""

    format: str
    bits: float
    kl: float
    domains: tuple[float, ...] = ()  # the KL on each calibration domain (kl: their mean)


@dataclass
class TensorCost:
    """A tensor's weights count and its options, sorted by bits."""

    name: str
    weights: int
    options: list[Option] = field(default_factory=list)


#: Rows each tensor's cost is estimated on: RTN and every format's parameters are per row, so a
#: fixed random subset of rows, its sum scaled by rows / subset, is an unbiased estimate.
COST_ROWS = 512


def _format_shape(format_name: str) -> tuple[int, int, bool]:
    """(bits, group size, sym) a candidate format is used with: its first bits, group size and
    symmetry (as `QuantRecipe.for_layer` quantises an override: Q4_1 / Q5_1 asymmetric)."""
    c = get_format(format_name).constraints
    return c.bits[0], (c.group_sizes or (32,))[0], c.sym[0]


def _rtn_dequant(w: Tensor, format_name: str, hessian: Tensor | None = None) -> Tensor | None:
    """`w` quantised to `format_name` by RTN (mse grid, fp16 scales) — or, given the input's
    `hessian` [in, in], by GPTQ act-order over static groups as the recipe then quantises it —
    and dequantised; None when the format cannot hold this shape."""
    fmt = get_format(format_name)
    c = fmt.constraints
    if w.shape[1] % max(c.in_multiple, 1) or w.shape[0] % max(c.out_multiple, 1):
        return None
    bits, group, sym = _format_shape(format_name)
    try:
        if hessian is None:
            qw = quantize_rtn(w, bits, group, sym, scale_dtype=torch.float16, grid="mse",
                              fmt=fmt)
        else:
            from .calib.gptq import gptq_quantize

            qw = gptq_quantize(w, hessian, bits=bits, group_size=group, sym=sym,
                               act_order=True, static_groups=True, grid="mse",
                               scale_dtype=torch.float16, fmt=fmt).weight
        fmt.check(qw)
    except (FormatError, QuantError):
        return None
    return qw.dequantize()


def stored_bits(format_name: str, shape: tuple[int, int]) -> float:
    """Bits per weight `format_name` stores for a [out, in] tensor (blocks, scales included)."""
    bits, group, sym = _format_shape(format_name)
    nbytes = get_format(format_name).nbytes(shape[0], shape[1], bits=bits, group_size=group,
                                            sym=sym)
    return 8 * nbytes / (shape[0] * shape[1])


#: Each tensor's Fisher diagonal plus FLOOR x its mean: calibration text rarely predicts some
#: tokens (a language it lacks), so their output rows look free to round; the floor keeps every
#: weight's error counted a little (chosen on the development texts, BENCHMARKS.md).
FLOOR = 1.0

#: K-FAC's input factor H plus INPUT_FLOOR x its mean diagonal: GPTQ parks its error in the input
#: directions the calibration text rarely excites, which text unlike it may excite (0: H alone).
INPUT_FLOOR = 0.0


def format_costs(model: torch.nn.Module, fisher: dict[str, Tensor] | KroneckerFactors,
                 candidates: Iterable[str] = CANDIDATES,
                 progress: ProgressFn | None = None, *, gptq: bool = False) -> list[TensorCost]:
    """Every tensor's options (module docstring, step 2) under a diagonal Fisher or
    `KroneckerFactors`; unregistered candidates are skipped. `gptq` (K-FAC only): each format's
    error is GPTQ's under the factors' H instead of RTN's."""
    names = [c for c in candidates if _registered(c)]
    if not names:
        raise QuantError(f"none of the candidate formats {list(candidates)} is registered",
                         "pick registered gguf-* formats")
    weights = _linear_weights(model)
    out = []
    gen = torch.Generator().manual_seed(0)
    for i, (name, p) in enumerate(weights.items()):
        w = p.detach().float()
        cost = TensorCost(name, w.numel())
        rows, pick = w.shape[0], None
        if rows > COST_ROWS:
            pick = torch.randperm(rows, generator=gen)[:COST_ROWS].sort().values
            w = w[pick]
        if not isinstance(fisher, KroneckerFactors):
            f = fisher[name]
            f = f + FLOOR * f.mean()
            f = f if pick is None else f[pick]
        hessian = fisher.h[name] if isinstance(fisher, KroneckerFactors) and gptq else None
        for fmt in names:
            deq = _rtn_dequant(w, fmt, hessian)
            if deq is None:
                continue
            if isinstance(fisher, KroneckerFactors):
                per_domain = _kfac_cost(fisher, name, pick, w - deq)
            else:
                per_domain = (0.5 * float((f * (w - deq) ** 2).sum(dtype=torch.float64)),)
            per_domain = tuple(c * rows / w.shape[0] for c in per_domain)
            cost.options.append(Option(fmt, stored_bits(fmt, tuple(p.shape)),
                                       sum(per_domain) / len(per_domain),
                                       per_domain if len(per_domain) > 1 else ()))
        if not cost.options:
            raise QuantError(f"{name} {tuple(w.shape)} fits none of the formats {names}",
                             "add a format with 32-wide blocks (gguf-q8_0)")
        cost.options.sort(key=lambda o: (o.bits, o.kl))
        out.append(cost)
        if progress is not None:
            progress(i + 1, len(weights))
    return out


def _registered(name: str) -> bool:
    try:
        get_format(name)
    except FormatError:
        return False
    return True


@dataclass(frozen=True)
class MixPlan:
    """The allocation: {tensor name: format}, its mean stored bits per weight and the predicted
    total KL (the sum of every tensor's, nats per token)."""

    formats: dict[str, str]
    bits_per_weight: float
    predicted_kl: float
    budget: float
    domain_kl: tuple[float, ...] = ()  # the predicted KL per calibration domain (balanced only)

    def layers(self, base_format: str) -> tuple[tuple[str, str], ...]:
        """`QuantRecipe.layers` overrides for every tensor not in `base_format` (exact names)."""
        return tuple((name, fmt) for name, fmt in self.formats.items() if fmt != base_format)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for fmt in self.formats.values():
            out[fmt] = out.get(fmt, 0) + 1
        return dict(sorted(out.items()))


def _hull(options: list[Option]) -> list[Option]:
    """The options on the lower convex hull of (bits, KL), bits ascending: the only ones a
    greedy marginal-gain allocation should step through."""
    pts: list[Option] = []
    for o in options:  # sorted by bits; keep strictly decreasing KL
        if pts and o.kl >= pts[-1].kl:
            continue
        while len(pts) >= 2:
            a, b = pts[-2], pts[-1]
            # b is above the segment a -> o: drop it
            if (b.kl - a.kl) * (o.bits - a.bits) >= (o.kl - a.kl) * (b.bits - a.bits):
                pts.pop()
            else:
                break
        pts.append(o)
    return pts


#: The allocation's objective over the calibration domains: minimise sum_c KL_c ** DOMAIN_POWER
#: (KL_c: the predicted KL on domain c). 1: their total, every token alike (one domain's worth of
#: G is enough); above 1 the domains the mix serves worst weigh more.
DOMAIN_POWER = 1.0


def _check_budget(costs: list[TensorCost], cheapest: dict[str, Option], budget: float):
    """(bits used by the cheapest options, total weights); QuantError when over `budget`."""
    total = sum(c.weights for c in costs)
    used = sum(cheapest[c.name].bits * c.weights for c in costs)
    if used > budget * total + 1e-9:
        raise QuantError(f"a budget of {budget} bits per weight is below the cheapest storage "
                         f"({used / total:.3f} bits per weight)",
                         f"use a budget of at least {math.ceil(used / total * 100) / 100}")
    return used, total


def allocate(costs: list[TensorCost], budget: float, power: float | None = None) -> MixPlan:
    """Greedy marginal-gain allocation under `budget` mean bits per weight (module docstring,
    step 3). QuantError when even the cheapest options exceed the budget. `power` (default
    DOMAIN_POWER) above 1 with per-domain costs: `_allocate_balanced`."""
    power = DOMAIN_POWER if power is None else power
    if power != 1 and all(o.domains for c in costs for o in c.options):
        return _allocate_balanced(costs, budget, power)
    hulls = {c.name: _hull(c.options) for c in costs}
    level = {c.name: 0 for c in costs}
    weights = {c.name: c.weights for c in costs}
    used, total = _check_budget(costs, {n: h[0] for n, h in hulls.items()}, budget)
    while True:
        best, best_gain = None, 0.0
        for name, hull in hulls.items():
            i = level[name]
            if i + 1 >= len(hull):
                continue
            extra = (hull[i + 1].bits - hull[i].bits) * weights[name]
            if used + extra > budget * total + 1e-9:
                continue
            gain = (hull[i].kl - hull[i + 1].kl) / extra
            if gain > best_gain:
                best, best_gain = name, gain
        if best is None:
            break
        i = level[best]
        used += (hulls[best][i + 1].bits - hulls[best][i].bits) * weights[best]
        level[best] = i + 1
    formats = {n: hulls[n][level[n]].format for n in hulls}
    kl = sum(hulls[n][level[n]].kl for n in hulls)
    return MixPlan(formats, round(used / total, 4), kl, budget)


def _allocate_balanced(costs: list[TensorCost], budget: float, power: float) -> MixPlan:
    """Greedy allocation minimising sum_c KL_c ** power over the domains: each step takes the
    upgrade (any option with more bits, not only the next) with the largest gradient-weighted
    KL reduction per added bit, the weights power x KL_c ** (power - 1) recomputed after every
    step, so the worst-served domains pull the bits. Options of equal bits: the lowest mean KL."""
    choices = {}
    for c in costs:
        kept: list[Option] = []
        for o in c.options:  # sorted by (bits, kl): the first of equal bits has the lowest KL
            if not kept or o.bits > kept[-1].bits:
                kept.append(o)
        choices[c.name] = (c.weights, kept, np.array([o.domains for o in kept]))
    level = {name: 0 for name in choices}
    used, total = _check_budget(costs, {n: ch[1][0] for n, ch in choices.items()}, budget)
    totals = sum(ch[2][0] for ch in choices.values())
    while True:
        grad = power * totals ** (power - 1)
        best, best_gain = None, 0.0
        for name, (count, opts, dom) in choices.items():
            i = level[name]
            extra = np.array([o.bits - opts[i].bits for o in opts[i + 1:]]) * count
            if not len(extra):
                continue
            gains = ((dom[i] - dom[i + 1:]) @ grad) / extra
            gains[used + extra > budget * total + 1e-9] = 0.0
            j = int(np.argmax(gains))
            if gains[j] > best_gain:
                best, best_gain = (name, i + 1 + j), float(gains[j])
        if best is None:
            break
        name, j = best
        count, opts, dom = choices[name]
        used += (opts[j].bits - opts[level[name]].bits) * count
        totals = totals + dom[j] - dom[level[name]]
        level[name] = j
    formats = {n: ch[1][level[n]].format for n, ch in choices.items()}
    return MixPlan(formats, round(used / total, 4), float(totals.mean()), budget,
                   tuple(round(float(t), 5) for t in totals))


#: How a tensor's sensitivity is measured: "diagonal" (`fisher_diagonal`, RTN errors), "kfac"
#: (`kronecker_factors`: input channels' correlations counted, RTN errors) or "kfac-gptq" (the
#: same factors, each format's error GPTQ's under the float model's H, as the recipe quantises).
SENSITIVITIES = ("diagonal", "kfac", "kfac-gptq")
#: Chosen on the development texts: KL -2 to -10 % against "diagonal" on every one, Portuguese
#: (the language the calibration lacks) the most (BENCHMARKS.md, quant_quality_dev.json).
SENSITIVITY = "kfac-gptq"


def plan_mix(model: torch.nn.Module, windows: Tensor, budget: float, *,
             candidates: Iterable[str] = CANDIDATES, seed: int = 0,
             log: Callable[[str], None] | None = None, domains: int = 1) -> MixPlan:
    """Fisher diagonal on `windows`, format costs, allocation under `budget` (all three steps);
    `domains`: how many calibration domains the windows deal in turn (DOMAIN_POWER's objective
    needs them; the Kronecker-factored sensitivity only)."""
    t0 = time.perf_counter()
    if SENSITIVITY not in SENSITIVITIES:
        raise QuantError(f"unknown sensitivity {SENSITIVITY!r}", f"use one of {SENSITIVITIES}")
    kfac = SENSITIVITY.startswith("kfac")
    kind = "Kronecker-factored Fisher" if kfac else "Fisher diagonal"
    if kfac:
        fisher = kronecker_factors(model, windows, seed=seed,
                                   domains=domains if DOMAIN_POWER != 1 else 1)
    else:
        fisher = fisher_diagonal(model, windows, seed=seed)
    if log:
        log(f"sensitivity ({kind}, {windows.shape[0]} windows of {windows.shape[1]} "
            f"tokens): {time.perf_counter() - t0:.1f} s")
    costs = format_costs(model, fisher, candidates, gptq=SENSITIVITY == "kfac-gptq")
    del fisher
    plan = allocate(costs, budget)
    if log:
        log(f"allocation: {plan.bits_per_weight:.3f} bits per weight (budget {budget}), "
            f"predicted KL {plan.predicted_kl:.4f}; " +
            ", ".join(f"{k} x{v}" for k, v in plan.counts().items()))
        if plan.domain_kl:
            log(f"predicted KL per calibration domain: {list(plan.domain_kl)}")
    return plan


#: Sensitivity windows: at most this many calibration windows, each cut to this many tokens.
FISHER_WINDOWS = 16
FISHER_TOKENS = 512


def resolve_budget(recipe, ckpt, calib_ids: Tensor,
                   log: Callable[[str], None] | None = None, domains: int = 1):
    """`recipe` with `layers` chosen under `recipe.budget` (unchanged without a budget or when it
    already has layers): the float model of `ckpt` is loaded, its sensitivity measured on the
    first FISHER_WINDOWS calibration windows (FISHER_TOKENS tokens each; they span every domain,
    quant/calib_data.py interleaves them), the allocation made
    among the GGUF formats, and the recipe's own format is the default for every tensor."""
    from dataclasses import replace

    from arkinfer.frontend.checkpoint import load_model

    if recipe.budget is None or recipe.layers:
        return recipe
    if recipe.format not in CANDIDATES:
        raise QuantError(f"mixed precision starts from a candidate format ({', '.join(CANDIDATES)})"
                         f"; {recipe.format} is not one", "use --format gguf-q4_0")
    windows = calib_ids[:FISHER_WINDOWS, :FISHER_TOKENS]
    model = load_model(ckpt)
    candidates = CANDIDATES[CANDIDATES.index(recipe.format):]
    plan = plan_mix(model, windows, recipe.budget, candidates=candidates, log=log,
                    domains=domains)
    del model
    return replace(recipe, skip=(), layers=plan.layers(recipe.format))
