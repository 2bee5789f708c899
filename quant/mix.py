"""Mixed precision: which linears get more bits, measured on the model, under a bit budget.

    fisher = fisher_diagonal(model, calib.ids[:32, :128])          # {weight name: F [out, in]}
    costs = format_costs(model, fisher, CANDIDATES)                  # per tensor, per format
    plan = allocate(costs, budget=4.9)                               # {linear: format}
    recipe = replace(base_recipe, skip=(), layers=plan.layers())     # QuantRecipe.layers

1. Sensitivity. `fisher_diagonal` estimates the diagonal of the Fisher information of the model's
   own predictive distribution, `F_i = E_x E_{y ~ p(.|x)} (d log p(y|x) / d w_i)^2`, per weight of
   every decoder linear and of the output layer (the embedding when tied), from calibration
   windows with labels *sampled from the model* (so it measures how far the predictions move,
   not how well the calibration text is predicted). To second order the KL divergence a weight
   perturbation `d` causes is `KL(p || p_d) ~ 1/2 sum_i F_i d_i^2` per token. Each window's
   gradient sums T tokens whose sampled-label gradients have mean zero, so `E[g^2] / T` is the
   per-token diagonal.
2. Cost of a format for a tensor: that formula with `d = W - RTN_format(W)` (ArkInfer's RTN on
   the format's grid, fp16 scales), and its stored bits per weight (`Format.nbytes`). Formats a
   tensor's shape cannot use (K-quant super-blocks need rows of 256) are left out for it.
3. `allocate`: every tensor starts in its cheapest format; then, greedily, the upgrade with the
   largest predicted KL reduction per added bit is taken while the mean bits per weight of all
   linears plus the output layer stays within the budget (a convex-hull knapsack; each tensor's
   candidates that are not on its lower convex hull of (bits, KL) are never chosen).

GPTQ then quantises each linear in its format; it lowers every tensor's error below RTN's by a
broadly similar factor, so the ranking RTN predicts is the one GPTQ keeps (benchmarks/
quant_quality.py measures the result). Memory: the Fisher needs one float32 gradient per
weight (the model again, 0.5 GB for a 135M model); models beyond RAM are not handled here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

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


def fisher_diagonal(model: torch.nn.Module, windows: Tensor, *, seed: int = 0,
                    progress: ProgressFn | None = None) -> dict[str, Tensor]:
    """Per-token Fisher diagonal {linear name: F float32 [out, in]} (module docstring, step 1)
    from `windows` [N, T] token ids (one forward + backward each)."""
    weights = _linear_weights(model)
    acc = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in weights.items()}
    params = list(model.parameters())
    saved = [p.requires_grad for p in params]
    gen = torch.Generator().manual_seed(seed)
    n, t = windows.shape
    grad_before = torch.is_grad_enabled()
    try:
        torch.set_grad_enabled(True)  # callers such as calibrate() run under no_grad
        for p in params:
            p.requires_grad_(False)
        for p in weights.values():
            p.requires_grad_(True)
        for i in range(n):
            ids = windows[i:i + 1]
            logits, _ = model(ids, torch.arange(t), model.empty_cache(1))
            logp = torch.log_softmax(logits[0].float(), dim=-1)
            with torch.no_grad():
                labels = torch.multinomial(logp.exp(), 1, generator=gen)
            loss = -logp.gather(1, labels).sum()
            grads = torch.autograd.grad(loss, list(weights.values()))
            for name, g in zip(weights, grads):
                acc[name] += g.float() ** 2
            del grads, loss, logp, logits
            if progress is not None:
                progress(i + 1, n)
    finally:
        torch.set_grad_enabled(grad_before)
        for p, s in zip(params, saved):
            p.requires_grad_(s)
    return {name: a / (n * t) for name, a in acc.items()}


@dataclass(frozen=True)
class Option:
    """One storage choice for a tensor: format, stored bits per weight, predicted KL (nats per
    token) of that tensor alone stored that way."""

    format: str
    bits: float
    kl: float


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
    """(bits, group size, sym) a candidate format is used with: its first bits and group size,
    symmetric when it allows it."""
    c = get_format(format_name).constraints
    return c.bits[0], (c.group_sizes or (32,))[0], True in c.sym


def _rtn_dequant(w: Tensor, format_name: str) -> Tensor | None:
    """`w` quantised to `format_name` by RTN (mse grid, fp16 scales) and dequantised; None when
    the format cannot hold this shape."""
    fmt = get_format(format_name)
    c = fmt.constraints
    if w.shape[1] % max(c.in_multiple, 1) or w.shape[0] % max(c.out_multiple, 1):
        return None
    bits, group, sym = _format_shape(format_name)
    try:
        qw = quantize_rtn(w, bits, group, sym, scale_dtype=torch.float16, grid="mse",
                          fmt=fmt)
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


def format_costs(model: torch.nn.Module, fisher: dict[str, Tensor],
                 candidates: Iterable[str] = CANDIDATES,
                 progress: ProgressFn | None = None) -> list[TensorCost]:
    """Every tensor's options (module docstring, step 2); unregistered candidates are skipped."""
    names = [c for c in candidates if _registered(c)]
    if not names:
        raise QuantError(f"none of the candidate formats {list(candidates)} is registered",
                         "pick registered gguf-* formats")
    weights = _linear_weights(model)
    out = []
    gen = torch.Generator().manual_seed(0)
    for i, (name, p) in enumerate(weights.items()):
        w, f = p.detach().float(), fisher[name]
        f = f + FLOOR * f.mean()
        cost = TensorCost(name, w.numel())
        rows = w.shape[0]
        if rows > COST_ROWS:
            pick = torch.randperm(rows, generator=gen)[:COST_ROWS].sort().values
            w, f = w[pick], f[pick]
        for fmt in names:
            deq = _rtn_dequant(w, fmt)
            if deq is None:
                continue
            kl = 0.5 * float((f * (w - deq) ** 2).sum(dtype=torch.float64)) * rows / w.shape[0]
            cost.options.append(Option(fmt, stored_bits(fmt, tuple(p.shape)), kl))
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


def allocate(costs: list[TensorCost], budget: float) -> MixPlan:
    """Greedy marginal-gain allocation under `budget` mean bits per weight (module docstring,
    step 3). QuantError when even the cheapest options exceed the budget."""
    hulls = {c.name: _hull(c.options) for c in costs}
    level = {c.name: 0 for c in costs}
    weights = {c.name: c.weights for c in costs}
    total = sum(weights.values())
    used = sum(hulls[n][0].bits * weights[n] for n in hulls)
    if used > budget * total + 1e-9:
        raise QuantError(f"a budget of {budget} bits per weight is below the cheapest storage "
                         f"({used / total:.3f} bits per weight)",
                         f"use a budget of at least {math.ceil(used / total * 100) / 100}")
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


def plan_mix(model: torch.nn.Module, windows: Tensor, budget: float, *,
             candidates: Iterable[str] = CANDIDATES, seed: int = 0,
             log: Callable[[str], None] | None = None) -> MixPlan:
    """Fisher diagonal on `windows`, format costs, allocation under `budget` (all three steps)."""
    t0 = time.perf_counter()
    fisher = fisher_diagonal(model, windows, seed=seed)
    if log:
        log(f"sensitivity (Fisher diagonal, {windows.shape[0]} windows of {windows.shape[1]} "
            f"tokens): {time.perf_counter() - t0:.1f} s")
    costs = format_costs(model, fisher, candidates)
    del fisher
    plan = allocate(costs, budget)
    if log:
        log(f"allocation: {plan.bits_per_weight:.3f} bits per weight (budget {budget}), "
            f"predicted KL {plan.predicted_kl:.4f}; " +
            ", ".join(f"{k} x{v}" for k, v in plan.counts().items()))
    return plan


#: Sensitivity windows: at most this many calibration windows, each cut to this many tokens.
FISHER_WINDOWS = 16
FISHER_TOKENS = 512


def resolve_budget(recipe, ckpt, calib_ids: Tensor,
                   log: Callable[[str], None] | None = None):
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
    plan = plan_mix(model, windows, recipe.budget, candidates=candidates, log=log)
    del model
    return replace(recipe, skip=(), layers=plan.layers(recipe.format))
