"""GPTQ's layer Hessian `H = (2/N) Σ x xᵀ`, accumulated over calibration tokens with a mask.

    acc = HessianAccumulator(in_features)
    acc.add(x, keep)          # x [..., in_features]; keep bool [...] (False = not counted)
    H = acc.hessian()         # float32 [in, in]; N = number of kept tokens

    acc = HessianAccumulator(in_features, prefix_cap=10.0)      # P-GPTQ
    acc.add(x, body); acc.add_prefix(x, prefix)                  # prefix_split(mask, s)

`keep` is how padding is masked. P-GPTQ (docs/quant.md §3) treats the first `s` positions of
every sequence apart (`prefix_split`): with `prefix_cap=0` they are left out of H (the literal
MiniCPM4 rule, = `prefix_mask`); with `prefix_cap=c > 0` each prefix token `p` enters H rescaled
to at most `c` times the RMS norm of the other tokens, `p · min(1, c·rms / ‖p‖)` with
`rms² = Σ‖x‖² / N = trace(Σ x xᵀ) / N` over the non-prefix tokens. The cap keeps the direction
of the attention-sink token in H (its output is what every later token attends to; dropped, GPTQ
parks error on the columns that only the sink uses) without letting its 100-1000x norm dominate
H. N counts prefix tokens too (GPTQ is invariant to the scale of H; only the damping reads it).
Each batch's `xᵀx` is computed in float32 and summed in float64, so the result does not depend
on how the tokens were split into batches beyond float32 rounding of one batch.
"""

from __future__ import annotations

import torch

from ..weight import QuantError


def prefix_mask(mask: torch.Tensor, skip: int) -> torch.Tensor:
    """bool [B, T]: `mask` with the first `skip` positions of every sequence set False
    (P-GPTQ, docs/quant.md §3). `skip=0` returns `mask` unchanged."""
    if skip < 0:
        raise QuantError(f"prefix skip={skip} is negative", "use 0 (GPTQ) or a positive count")
    if skip == 0:
        return mask
    out = mask.clone()
    out[:, :skip] = False
    return out


def prefix_split(mask: torch.Tensor, skip: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(body, prefix) bool [B, T]: real tokens at positions >= `skip` and < `skip` of every
    sequence (padding is in neither). `skip=0`: (mask, all False)."""
    body = prefix_mask(mask, skip)
    return body, mask.to(torch.bool) & ~body


GRAM_BAND = 256  # rows of xᵀx computed per matmul (a band and everything right of it)


def gram(x: torch.Tensor) -> torch.Tensor:
    """xᵀx float32 [in, in] for x [N, in] from its upper triangle only: for each band of
    GRAM_BAND rows, one matmul `x[:, band]ᵀ x[:, band_start:]`, mirrored below the diagonal.
    (k+1)/2k of the full product's flops for k bands (58 % for 1536 inputs, 75 % for 576);
    the result is exactly symmetric."""
    n = x.shape[1]
    bands = max(1, n // GRAM_BAND)
    if bands == 1:
        return x.T @ x
    out = torch.empty(n, n, dtype=x.dtype, device=x.device)
    edges = [n * i // bands for i in range(bands + 1)]
    for a0, a1 in zip(edges[:-1], edges[1:]):
        band = x[:, a0:a1].T @ x[:, a0:]          # [a1 - a0, n - a0]
        out[a0:a1, a0:] = band
        out[a1:, a0:a1] = band[:, a1 - a0:].T
    return out


class HessianAccumulator:
    """Running `Σ x xᵀ` (float64) and token count for one linear layer's input; with
    `prefix_cap` (P-GPTQ) also the prefix tokens, kept aside [n, in] float32 until `hessian()`.
    Everything lives on `device` (the device of the inputs it is given)."""

    def __init__(self, in_features: int, name: str = "", prefix_cap: float = 0.0,
                 device: torch.device | str = "cpu") -> None:
        if prefix_cap < 0:
            raise QuantError(f"prefix cap={prefix_cap} for {name or 'a linear'!r} is negative",
                             "use 0 (drop the prefix) or a positive norm ratio such as 10")
        self.in_features = in_features
        self.name = name
        self.prefix_cap = float(prefix_cap)
        self.sum = torch.zeros(in_features, in_features, dtype=torch.float64, device=device)
        self.count = 0
        self.prefix: list[torch.Tensor] = []

    def add(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """Add tokens `x` [..., in] (rows where `keep` [...] is False are ignored)."""
        if x.shape[-1] != self.in_features:
            raise QuantError(f"input of {self.name or 'a linear'!r} has {x.shape[-1]} features; "
                             f"the Hessian was made for {self.in_features}",
                             "capture the input of the layer the accumulator belongs to")
        flat = x.detach().reshape(-1, self.in_features).float()
        if keep is not None:
            flat = flat[keep.reshape(-1).to(torch.bool)]
        if flat.shape[0] == 0:
            return
        self.sum.add_(gram(flat))  # float32 product, accumulated in float64 without a copy
        self.count += int(flat.shape[0])

    def add_prefix(self, x: torch.Tensor, prefix: torch.Tensor) -> None:
        """Keep the prefix tokens of `x` [..., in] (where `prefix` [...] is True) for the capped
        contribution; nothing is kept when `prefix_cap` is 0 (the prefix is dropped)."""
        if self.prefix_cap == 0:
            return
        if x.shape[-1] != self.in_features:
            raise QuantError(f"input of {self.name or 'a linear'!r} has {x.shape[-1]} features; "
                             f"the Hessian was made for {self.in_features}",
                             "capture the input of the layer the accumulator belongs to")
        flat = x.detach().reshape(-1, self.in_features).float()
        rows = flat[prefix.reshape(-1).to(torch.bool)]
        if rows.shape[0]:
            self.prefix.append(rows.clone())

    def _fold_prefix(self) -> None:
        """Add the capped prefix tokens to the sum (rms from the body tokens' trace)."""
        if not self.prefix:
            return
        p = torch.cat(self.prefix).double()
        self.prefix = []
        norms = p.norm(dim=1)
        if self.count:
            rms = (torch.diagonal(self.sum).sum() / self.count).sqrt()
            factor = torch.clamp(self.prefix_cap * rms / norms.clamp_min(1e-30), max=1.0)
            p = p * factor[:, None]
        self.sum.add_(p.T @ p)
        self.count += int(p.shape[0])

    def hessian(self, release: bool = False) -> torch.Tensor:
        """float32 [in, in]: (2/N) Σ x xᵀ; all zeros when no token was kept (every column dead).
        `release` frees the float64 sum (the accumulator cannot be used afterwards)."""
        self._fold_prefix()
        if self.count == 0:
            h = torch.zeros(self.in_features, self.in_features, device=self.sum.device)
        elif release:  # scale in place: no second float64 n x n tensor
            h = self.sum.mul_(2.0 / self.count).float()
        else:
            h = (self.sum * (2.0 / self.count)).float()
        if release:
            self.sum = torch.empty(0, dtype=torch.float64, device=self.sum.device)
        return h


class CrossAccumulator:
    """Running `Σ x_f x_qᵀ` (float64) of one linear's float-path inputs `x_f` against its
    quantised-path inputs `x_q` (the same tokens), for GPTQ's asymmetric target (gptq.py,
    `asymmetric_target`). `matrix()` is `(2/N) Σ x_f x_qᵀ` [in, in], scaled like
    `HessianAccumulator.hessian()` so the two combine directly."""

    def __init__(self, in_features: int, name: str = "", device: torch.device | str = "cpu") -> None:
        self.in_features = in_features
        self.name = name
        self.sum = torch.zeros(in_features, in_features, dtype=torch.float64, device=device)
        self.count = 0

    def add(self, x_float: torch.Tensor, x_quant: torch.Tensor,
            keep: torch.Tensor | None = None) -> None:
        """Add token pairs: `x_float`, `x_quant` [..., in] of the same shape (rows where `keep`
        [...] is False are ignored)."""
        if x_float.shape != x_quant.shape or x_quant.shape[-1] != self.in_features:
            raise QuantError(f"float and quantised inputs of {self.name or 'a linear'!r} do not "
                             f"pair up: {list(x_float.shape)} and {list(x_quant.shape)}, "
                             f"{self.in_features} features expected",
                             "pass the same tokens' inputs along both paths")
        f = x_float.detach().reshape(-1, self.in_features).float()
        q = x_quant.detach().reshape(-1, self.in_features).float()
        if keep is not None:
            rows = keep.reshape(-1).to(torch.bool)
            f, q = f[rows], q[rows]
        if f.shape[0] == 0:
            return
        self.sum.add_(f.T @ q)
        self.count += int(f.shape[0])

    def matrix(self) -> torch.Tensor:
        """float32 [in, in]: (2/N) Σ x_f x_qᵀ (zeros when no token was kept)."""
        if self.count == 0:
            return torch.zeros(self.in_features, self.in_features, device=self.sum.device)
        return (self.sum * (2.0 / self.count)).float()
