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
    to the output layer (its output role is `G, H` of `lm_head`)."""

    g: dict[str, Tensor]
    h: dict[str, Tensor]
    embedding: Tensor | None = None


def kronecker_factors(model: torch.nn.Module, windows: Tensor, *, seed: int = 0,
                      progress: ProgressFn | None = None) -> KroneckerFactors:
    """`KroneckerFactors` of every decoder linear and the output layer from `windows` [N, T]
    (one forward + backward each, labels sampled from the model as in `fisher_diagonal`)."""
    modules = {name: m for name, m in model.named_modules()
               if name.startswith("model.layers.") and isinstance(m, torch.nn.Linear)}
    modules[OUTPUT] = model.lm_head
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    g = {n: torch.zeros(m.out_features, dtype=torch.float64) for n, m in modules.items()}
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
                g[name] += grad.detach().reshape(-1, module.out_features).double().pow(2).sum(0)
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
        for loss in _sampled_label_losses(model, windows, [embedding], seed, progress):
            torch.autograd.grad(loss, [embedding])
            last[:] = [None, None]
    finally:
        for handle in handles:
            handle.remove()
    tokens = windows.numel()
    return KroneckerFactors({k: (v / tokens).float() for k, v in g.items()},
                            {k: (v / tokens).float() for k, v in h.items()},
                            None if emb is None else emb / tokens)


def _kfac_cost(factors: KroneckerFactors, name: str, rows: Tensor | None, d: Tensor) -> float:
    """1/2 sum_i G_i d_i H d_i^T (+ the tied embedding's diagonal term) over the rows `rows` of
    tensor `name` (all rows when None) with the error `d` of those rows; G floored as the
    diagonal Fisher is (FLOOR)."""
    gi = factors.g[name]
    gi = gi + FLOOR * gi.mean()
    if rows is not None:
        gi = gi[rows]
    h = factors.h[name].double()
    quad = ((d.double() @ h) * d.double()).sum(1)
    if INPUT_FLOOR:  # H + INPUT_FLOOR x mean(diag H) x I: input directions calibration lacks
        quad = quad + INPUT_FLOOR * float(torch.diagonal(h).mean()) * (d.double() ** 2).sum(1)
    cost = 0.5 * float((gi.double() * quad).sum())
    if name == OUTPUT and factors.embedding is not None:
        f = factors.embedding
        f = f + FLOOR * f.mean()
        if rows is not None:
            f = f[rows]
        cost += 0.5 * float((f * d ** 2).sum(dtype=torch.float64))
    return cost


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
                kl = _kfac_cost(fisher, name, pick, w - deq)
            else:
                kl = 0.5 * float((f * (w - deq) ** 2).sum(dtype=torch.float64))
            kl *= rows / w.shape[0]
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


#: How a tensor's sensitivity is measured: "diagonal" (`fisher_diagonal`, RTN errors), "kfac"
#: (`kronecker_factors`: input channels' correlations counted, RTN errors) or "kfac-gptq" (the
#: same factors, each format's error GPTQ's under the float model's H, as the recipe quantises).
SENSITIVITIES = ("diagonal", "kfac", "kfac-gptq")
#: Chosen on the development texts: KL -2 to -10 % against "diagonal" on every one, Portuguese
#: (the language the calibration lacks) the most (BENCHMARKS.md, quant_quality_dev.json).
SENSITIVITY = "kfac-gptq"


def plan_mix(model: torch.nn.Module, windows: Tensor, budget: float, *,
             candidates: Iterable[str] = CANDIDATES, seed: int = 0,
             log: Callable[[str], None] | None = None) -> MixPlan:
    """Fisher diagonal on `windows`, format costs, allocation under `budget` (all three steps)."""
    t0 = time.perf_counter()
    if SENSITIVITY not in SENSITIVITIES:
        raise QuantError(f"unknown sensitivity {SENSITIVITY!r}", f"use one of {SENSITIVITIES}")
    kfac = SENSITIVITY.startswith("kfac")
    kind = "Kronecker-factored Fisher" if kfac else "Fisher diagonal"
    fisher = (kronecker_factors if kfac else fisher_diagonal)(model, windows, seed=seed)
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
