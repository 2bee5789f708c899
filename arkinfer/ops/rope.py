"""`arkinfer::rope` — rotary position embedding, rotate-half pairing, computed in fp32.

Frequencies are passed in (`inv_freq`), so plain RoPE, Llama-3 scaling and LongRoPE (MiniCPM4.1)
share one op: LongRoPE is `inv_freq[j] = 1 / (factor[j] * theta^(2j/d))` with an attention scale
multiplying cos and sin. The tables are functions of (positions, inv_freq) only, which is what the
IR's constant-folding pass relies on.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from arkinfer.ops._autograd import register_recompute_autograd


def _rope_impl(x: Tensor, positions: Tensor, inv_freq: Tensor, attention_scale: float) -> Tensor:
    """x [B, H, T, D], positions [T] int64, inv_freq [D/2] fp32 -> [B, H, T, D].

    Dim i pairs with dim i + D/2 ("rotate half", the HF layout, not llama.cpp's interleaved one).
    """
    angles = positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]  # [T, D/2]
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos() * attention_scale, emb.sin() * attention_scale
    xf = x.to(torch.promote_types(x.dtype, torch.float32))  # at least fp32
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


@torch.library.custom_op("arkinfer::rope", mutates_args=())
def rope(x: Tensor, positions: Tensor, inv_freq: Tensor, attention_scale: float) -> Tensor:
    """See `_rope_impl`."""
    return _rope_impl(x, positions, inv_freq, attention_scale)


register_recompute_autograd(rope, _rope_impl)


@rope.register_fake
def _(x: Tensor, positions: Tensor, inv_freq: Tensor, attention_scale: float) -> Tensor:
    return torch.empty_like(x)


def default_inv_freq(head_dim: int, theta: float) -> Tensor:
    """[head_dim/2] fp32: theta^(-2j/d)."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)).float()


def longrope_inv_freq(head_dim: int, theta: float, factors: list[float]) -> Tensor:
    """[head_dim/2] fp32 LongRoPE frequencies: theta^(-2j/d) / factor[j]."""
    if len(factors) != head_dim // 2:
        from arkinfer.errors import ConfigError

        raise ConfigError(f"rope_scaling has {len(factors)} factors but head_dim/2 = {head_dim // 2}",
                          hint="long_factor and short_factor need one entry per rotary pair")
    base = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return (1.0 / (torch.tensor(factors, dtype=torch.float64) * base)).float()


def longrope_attention_scale(max_positions: int, original_max: int) -> float:
    """sqrt(1 + ln(max/orig) / ln(orig)), 1.0 when max <= orig (MiniCPM4.1's released config)."""
    ratio = max_positions / original_max
    return 1.0 if ratio <= 1.0 else math.sqrt(1 + math.log(ratio) / math.log(original_max))


def llama3_inv_freq(head_dim: int, theta: float, factor: float, low_freq_factor: float,
                    high_freq_factor: float, original_max: int) -> Tensor:
    """Llama 3.1 frequency scaling: long wavelengths divided by `factor`, smooth in between."""
    inv = default_inv_freq(head_dim, theta).double()
    low_wavelen = original_max / low_freq_factor
    high_wavelen = original_max / high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original_max / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_mid, mid, scaled).float()
