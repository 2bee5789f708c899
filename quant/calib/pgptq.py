"""P-GPTQ, prefix-aware GPTQ (MiniCPM4 technical report §4.1.2; docs/quant.md §3).

Identical to GPTQ except the Hessian: the first `prefix_skip` positions (default 4) of every
calibration sequence are treated apart, padding is masked. Those positions (the BOS / first token,
the "attention sink") carry activations far larger than the rest, worst at down_proj inputs of
deeper layers, and dominate `H = (2/N) Σ x xᵀ` although they are a vanishing share of real tokens.

`prefix_cap` says how they enter H:
- `prefix_cap=0`: left out entirely (the report's literal rule). On SmolLM2-135M this is
  harmful: the sink token's down_proj input in block 11 is ~500x the RMS of ordinary tokens, in
  two channels that only the sink uses; without it in H, GPTQ's error feedback parks error on
  those weight columns, the sink's output (which every later token attends to) is off by ~20 %
  instead of ~3 %, and perplexity goes from 30.8 (GPTQ) to 69.5;
- `prefix_cap=c` (default 10): each prefix token enters rescaled to at most `c` x the RMS norm
  of the other tokens. Its direction stays in H (the sink's output error stays at GPTQ's level)
  but it no longer outweighs the ordinary tokens (their error falls to the prefix-free level).
"""

from __future__ import annotations

from dataclasses import dataclass

from .gptq import GPTQCalibrator, GPTQConfig


@dataclass(frozen=True)
class PGPTQConfig(GPTQConfig):
    """GPTQConfig with `prefix_skip=4`, `prefix_cap=10`."""

    prefix_skip: int = 4
    prefix_cap: float = 10.0


class PGPTQCalibrator(GPTQCalibrator):
    name = "pgptq"
