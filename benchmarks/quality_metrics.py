"""Quality of a quantised model against its float model, per text domain: perplexity, its
increase, mean KL divergence and top-1 agreement (llama-perplexity's KL statistics).

    windows = domain_windows(tokenizer.encode, {"code": Path("code.txt")}, ctx=512, per_domain=6)
    reference = Reference(float_logits_fn, windows)        # float log-probs, kept in memory
    table = reference.score(quant_logits_fn)               # {"code": {"ppl", "kl", "top1", ...}}

Protocol (the same for every row, whatever runs it): each domain's text is tokenised without
BOS and cut into consecutive non-overlapping windows of `ctx` tokens (docs/commands.md's perplexity
protocol), the first `per_domain` windows are kept, each is evaluated from an empty cache, and
every position but the first of a window is scored. `logits_fn(window) -> [T, V]` fp32 can be
ArkInfer's reference model (`arkinfer.generate.model_logits_fn`) or llama.cpp
(`LlamaCppRunner.window_logits`), so checkpoints and GGUF files are measured alike.

- ppl: exp(mean NLL of the next token); ppl_increase: ppl / float ppl - 1;
- kl: mean over positions of KL(P_float || P_quant), natural log (llama-perplexity's "Mean KLD");
- top1: fraction of positions where both models' most likely next token is the same.

The float log-probs are held as fp16 (V x positions x 2 bytes: ~1.8 GB for SmolLM2 at 36
windows of 512), computed once per run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

LogitsFn = Callable[[list[int]], torch.Tensor]


def domain_windows(encode: Callable[[str], list[int]], files: dict[str, Path], ctx: int,
                   per_domain: int) -> dict[str, list[list[int]]]:
    """{domain: its first `per_domain` windows of `ctx` tokens} (see the module docstring)."""
    from arkinfer.generate import windows_of

    out = {}
    for name, path in files.items():
        ids = encode(Path(path).read_text(encoding="utf-8"))
        out[name] = windows_of(ids, ctx)[:per_domain]
    return out


class Reference:
    """The float model's log-probs of every window (fp16), and scoring against them."""

    @torch.no_grad()
    def __init__(self, logits_fn: LogitsFn, windows: dict[str, list[list[int]]]) -> None:
        self.windows = windows
        self.logprobs: dict[str, list[torch.Tensor]] = {}
        self.ppl: dict[str, float] = {}
        for name, wins in windows.items():
            lps, nll, count = [], 0.0, 0
            for window in wins:
                lp = torch.log_softmax(logits_fn(window)[:-1].float(), dim=-1)
                nll -= float(lp.gather(1, torch.tensor(window[1:])[:, None]).sum())
                count += len(window) - 1
                lps.append(lp.to(torch.float16))
            self.logprobs[name] = lps
            self.ppl[name] = float(torch.tensor(nll / count).exp())

    @torch.no_grad()
    def score(self, logits_fn: LogitsFn) -> dict[str, dict[str, float]]:
        """{domain: {ppl, ppl_float, ppl_increase, kl, top1, positions}} of `logits_fn`."""
        table = {}
        for name, wins in self.windows.items():
            nll = kl = agree = 0.0
            count = 0
            for window, ref in zip(wins, self.logprobs[name]):
                lq = torch.log_softmax(logits_fn(window)[:-1].float(), dim=-1)
                lf = ref.float()
                nll -= float(lq.gather(1, torch.tensor(window[1:])[:, None]).sum())
                kl += float((lf.exp() * (lf - lq)).sum())
                agree += float((lf.argmax(-1) == lq.argmax(-1)).sum())
                count += len(window) - 1
            ppl = float(torch.tensor(nll / count).exp())
            table[name] = {"ppl": round(ppl, 4), "ppl_float": round(self.ppl[name], 4),
                           "ppl_increase": round(ppl / self.ppl[name] - 1, 5),
                           "kl": round(kl / count, 5), "top1": round(agree / count, 4),
                           "positions": count}
        return table
