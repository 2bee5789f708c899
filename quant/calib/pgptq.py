"""P-GPTQ, prefix-aware GPTQ (MiniCPM4 technical report §4.1.2; specs/quant.md §3).

Identical to GPTQ except the Hessian: the first `prefix_skip` positions (default 4) of every
calibration sequence are left out, as is padding. Those positions (BOS and the first tokens, the
"attention sink") carry activations ~10x larger than the rest, worst at down_proj inputs of deeper
layers, and dominate `H = (2/N) Σ x xᵀ` although they are a vanishing share of real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from .gptq import GPTQCalibrator, GPTQConfig


@dataclass(frozen=True)
class PGPTQConfig(GPTQConfig):
    """GPTQConfig with `prefix_skip=4`."""

    prefix_skip: int = 4


class PGPTQCalibrator(GPTQCalibrator):
    name = "pgptq"
