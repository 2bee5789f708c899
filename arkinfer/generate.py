"""Token generation and perplexity on a reference model (or any model with the same call shape).

A "model" here is anything with `forward(ids [B, T], positions [T], cache) -> (logits [B, T, V],
cache)` and `empty_cache(batch)`: the PyTorch reference models today, backend Runners later.

Non-finite values are errors, never output: every forward call of a reference model (prefill of
any length, each decode step) checks its RoPE tables, every module's output and the logits, and
names the first module whose output holds NaN or inf (`NonFiniteError`).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from arkinfer.errors import ArkError


class NonFiniteError(ArkError):
    """A model or runtime produced NaN or infinite logits."""


def check_sampling(temperature: float, top_p: float) -> None:
    """Raise unless temperature is finite and >= 0 and top_p is in (0, 1]."""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ArkError(f"--temperature {temperature} is not a finite number >= 0",
                       hint="use 0 for greedy decoding or e.g. --temperature 0.6")
    if not (0 < top_p <= 1):  # also false for NaN
        raise ArkError(f"--top-p {top_p} is outside (0, 1] (the probability mass to sample from)",
                       hint="use e.g. --top-p 0.95, or 1 to sample from the whole vocabulary")


def _nonfinite_counts(logits: Tensor) -> str:
    nan = int(torch.isnan(logits).sum())
    inf = int(torch.isinf(logits).sum())
    return f"{nan} NaN and {inf} infinite of {logits.numel()} values"


def require_finite(logits: Tensor, where: str) -> None:
    """Raise NonFiniteError when `logits` hold NaN or inf (for runtimes that cannot be re-run
    module by module, e.g. llama.cpp or onnxruntime: the message names `where` only)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        # numpy's check, on one thread, for the same reason as sample_next's argmax: torch's
        # isfinite over a [V] row splits across its OpenMP pool every token, and those threads
        # then spin on the cores the runtime decodes the next token on (onnxruntime on SmolLM2,
        # 2 cores: 50 -> 25 tok/s)
        finite = bool(np.isfinite(logits.detach().numpy()).all())
    else:
        finite = bool(torch.isfinite(logits).all())
    if not finite:
        raise NonFiniteError(f"{where} produced non-finite logits ({_nonfinite_counts(logits)})",
                             hint="the weights are damaged or overflow this dtype; rebuild the "
                             "artifact from a checkpoint whose `arkinfer run` output is finite")


class _NonFiniteWatch:
    """Forward hooks on every submodule of `model` that record, while armed, the first one to
    finish with a NaN/inf floating output (inner modules finish before their parents, so this is
    the most specific module, e.g. "model.layers.3.mlp.down_proj"), with the counts of that
    output. Registered once per model (`watch_of`) and armed per call: a decode step pays one
    `isfinite` per module output, not a registration per module.

    The logits alone are not enough: torch's fused CPU attention returns finite outputs for
    queries/keys holding NaN on short sequences (under 16 tokens), so a NaN in q_proj's output
    can vanish before the logits."""

    def __init__(self, model: nn.Module) -> None:
        self.armed, self.module, self.counts = False, None, ""
        for name, module in model.named_modules():
            if name:
                module.register_forward_hook(self._hook_for(name))

    def __enter__(self) -> _NonFiniteWatch:
        self.armed, self.module, self.counts = True, None, ""
        return self

    def __exit__(self, *exc: object) -> None:
        self.armed = False

    def _hook_for(self, name: str):
        def hook(_module, _inputs, output) -> None:
            if not self.armed or self.module is not None:
                return
            out = output[0] if isinstance(output, tuple) else output
            if isinstance(out, Tensor) and out.is_floating_point() \
                    and not bool(torch.isfinite(out).all()):
                self.module, self.counts = name, _nonfinite_counts(out)
        return hook


_WATCHES: weakref.WeakKeyDictionary[nn.Module, _NonFiniteWatch] = weakref.WeakKeyDictionary()


def watch_of(model: nn.Module) -> _NonFiniteWatch:
    """The model's non-finite watch, its hooks registered on first use."""
    if model not in _WATCHES:
        _WATCHES[model] = _NonFiniteWatch(model)
    return _WATCHES[model]


def _rope_problem(model, positions: Tensor) -> str | None:
    """Why the model's RoPE tables for `positions` are not finite (its first attention module
    and the positions), or None; None for a model without `rope_is_finite`. The tables come from
    config values only (rope_theta, rope_scaling), never from the weights."""
    check = getattr(model, "rope_is_finite", None)
    if check is None or positions.numel() == 0 or check(positions):
        return None
    first = next((name for name, m in model.named_modules() if name.endswith("self_attn")),
                 "the first attention layer")
    return (f"the first non-finite values appear in {first}: its RoPE tables (cos/sin of position "
            f"x frequency) for positions {int(positions.min())}..{int(positions.max())} are not "
            "finite")


_HINT = ("the checkpoint's weights (or config values such as rms_norm_eps, rope_theta, "
         "rope_scaling or the scales) hold NaN/inf or overflow; re-download or re-convert the "
         "checkpoint")


def forward_checked(model, ids: Tensor, positions: Tensor, cache, where: str = "the model"):
    """`model(ids, positions, cache)`, raising NonFiniteError when any value of the call is NaN or
    inf: on every call, prefill of any length and each decode step, the RoPE tables, every
    submodule's output and the logits are checked, and the error names the first module whose
    output holds NaN/inf (a non-module model: the logits only)."""
    if not isinstance(model, nn.Module):
        logits, new_cache = model(ids, positions, cache)
        require_finite(logits, where)
        return logits, new_cache
    if (rope := _rope_problem(model, positions)) is not None:
        raise NonFiniteError(f"{where} would produce non-finite values; {rope}", hint=_HINT)
    with watch_of(model) as watch:
        logits, new_cache = model(ids, positions, cache)
    if bool(torch.isfinite(logits).all()) and watch.module is None:
        return logits, new_cache
    if bool(torch.isfinite(logits).all()):  # hidden on the way (see _NonFiniteWatch)
        raise NonFiniteError(f"{where} produced non-finite values inside the model "
                             f"({watch.counts}); the first non-finite values come out of "
                             f"{watch.module}", hint=_HINT)
    origin = (f"the first non-finite values come out of {watch.module}" if watch.module else
              "the last module's outputs are finite: the final logit scaling overflows")
    raise NonFiniteError(f"{where} produced non-finite logits ({_nonfinite_counts(logits)}); "
                         f"{origin}", hint=_HINT)


def sample_next(logits: Tensor, temperature: float, top_p: float, gen: torch.Generator) -> int:
    """One token id from logits [V]: greedy when temperature <= 0, else nucleus sampling
    (top_p in (0, 1], see `check_sampling`)."""
    if temperature <= 0:
        if logits.device.type == "cpu" and logits.dtype == torch.float32:
            # numpy's argmax: the same index (the first maximum; a NaN counts as the maximum in
            # both), on one thread. torch's would wake its OpenMP pool every token, and those
            # threads then spin on the cores onnxruntime or llama.cpp decode the next token on.
            return int(logits.detach().numpy().argmax())
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p  # always keeps the top one
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs / probs.sum(), 1, generator=gen))


@torch.no_grad()
def generate(model, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
             top_p: float = 1.0, seed: int = 0, stop_ids: set[int] | frozenset = frozenset(),
             where: str = "the model") -> Iterator[int]:
    """Yield generated token ids one at a time (prefill once, then one decode step per token).
    NaN/inf logits raise NonFiniteError naming `where` and the first module producing them."""
    check_sampling(temperature, top_p)
    if not prompt_ids:
        raise ArkError("the prompt is empty after tokenisation", hint="give a non-empty prompt")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    logits, cache = forward_checked(model, ids, torch.arange(len(prompt_ids)), model.empty_cache(1),
                                    where)
    pos = len(prompt_ids)
    for _ in range(max_new_tokens):
        token = sample_next(logits[0, -1], temperature, top_p, gen)
        yield token
        if token in stop_ids:
            return
        logits, cache = forward_checked(model, torch.tensor([[token]]), torch.tensor([pos]), cache,
                                        where)
        pos += 1


@dataclass(frozen=True)
class Perplexity:
    ppl: float
    tokens: int  # number of scored tokens
    windows: int
    ctx: int

    def as_dict(self) -> dict[str, float | int]:
        return {"ppl": self.ppl, "tokens": self.tokens, "windows": self.windows, "ctx": self.ctx}


def exp_nll(mean_nll: float) -> float:
    """Perplexity exp(mean NLL); inf (not OverflowError) for a model that is hopelessly wrong."""
    return math.exp(mean_nll) if mean_nll < 700 else math.inf


def window_nll(logits: Tensor, window: Tensor) -> tuple[float, int]:
    """Sum of NLL of window[1:] given logits [T, V] of window[:-1] positions, and the count."""
    logp = torch.log_softmax(logits[:-1].double(), dim=-1)
    nll = -logp.gather(1, window[1:, None]).sum()
    return float(nll), int(window.shape[0] - 1)


def window_bytes(vocab_size: int, kv_bytes_per_token: int) -> int:
    """Bytes per token of one scored window, a lower bound: the fp32 logits and their float64
    log-softmax (20 bytes per vocabulary entry) plus the fp32 KV cache of every layer."""
    return 20 * vocab_size + kv_bytes_per_token


def check_windows(ctx: int, max_windows: int | None = None) -> None:
    """Raise unless `ctx` is at least 2 tokens and `max_windows` (None: all) at least 1."""
    if ctx < 2:
        raise ArkError(f"--ctx {ctx} is too small", hint="use a context of at least 2 tokens")
    if max_windows is not None and max_windows < 1:
        raise ArkError(f"--max-windows {max_windows} is not a number of windows (>= 1)",
                       hint="pass --max-windows 1 or more, or leave it out to score every window")


def _too_short(count: int) -> ArkError:
    return ArkError(f"the text has only {count} token(s)", hint="give a longer text")


def windows_of(ids: list[int], ctx: int) -> list[list[int]]:
    """Consecutive non-overlapping windows of `ctx` tokens; a trailing partial window is dropped
    (one shorter window when the whole text is under ctx), the same chunking as llama-perplexity."""
    check_windows(ctx)
    if len(ids) < 2:
        raise _too_short(len(ids))
    if len(ids) < ctx:
        return [ids]
    return [ids[i:i + ctx] for i in range(0, len(ids) - ctx + 1, ctx)]


def stream_windows(pieces: Iterable[list[int]], ctx: int,
                   max_windows: int | None = None) -> Iterator[list[int]]:
    """`windows_of` over ids that arrive in pieces (`arkinfer.text_pieces`), at most
    `max_windows` of them: each window is yielded once full, so only about one window and one
    piece are held at a time, and no piece is read after the last window needed."""
    check_windows(ctx, max_windows)

    def windows() -> Iterator[list[int]]:
        buf: list[int] = []
        count = 0
        for piece in pieces:
            buf.extend(piece)
            full = len(buf) // ctx
            for i in range(full):
                yield buf[i * ctx:(i + 1) * ctx]
                count += 1
                if count == max_windows:
                    return
            del buf[:full * ctx]
        if count == 0:  # a text shorter than one window is one shorter window
            if len(buf) < 2:
                raise _too_short(len(buf))
            yield buf

    return windows()


@torch.no_grad()
def perplexity(logits_fn: Callable[[list[int]], Tensor], ids: list[int], ctx: int,
               progress: Callable[[int, int], None] | None = None,
               where: str = "the model") -> Perplexity:
    """exp(mean NLL) with the ArkInfer protocol: each window evaluated from an empty cache, every
    token of a window scored except its first. `logits_fn(window) -> [T, V]`; NaN/inf logits
    raise NonFiniteError naming `where` and the window."""
    windows = windows_of(ids, ctx)
    return windows_perplexity(logits_fn, windows, ctx, progress, where, total=len(windows))


@torch.no_grad()
def windows_perplexity(logits_fn: Callable[[list[int]], Tensor], windows: Iterable[list[int]],
                       ctx: int, progress: Callable[[int, int | None], None] | None = None,
                       where: str = "the model", total: int | None = None) -> Perplexity:
    """`perplexity` over windows already cut (`windows_of`, or `stream_windows` for a text read
    piece by piece); `total`: how many there are when known (for `progress` and messages)."""
    total_nll, scored, count = 0.0, 0, 0
    of = f" of {total}" if total is not None else ""
    for window in windows:
        count += 1
        logits = logits_fn(window)
        require_finite(logits, f"{where} (window {count}{of})")
        nll, n = window_nll(logits, torch.tensor(window))
        total_nll, scored = total_nll + nll, scored + n
        if progress:
            progress(count, total)
    if not count:
        raise ArkError("there is no window to score", hint="give a longer text")
    return Perplexity(exp_nll(total_nll / scored), scored, count, ctx)


def model_logits_fn(model, where: str = "the model") -> Callable[[list[int]], Tensor]:
    """Adapter: a reference model as `window -> logits [T, V]` (prefill from an empty cache);
    NaN/inf logits raise NonFiniteError naming the first module producing them."""

    def run(window: list[int]) -> Tensor:
        logits, _ = forward_checked(model, torch.tensor([window]), torch.arange(len(window)),
                                    model.empty_cache(1), where)
        return logits[0]

    return run
