"""GPTQ's layer Hessian `H = (2/N) Σ x xᵀ`, accumulated over calibration tokens with a mask.

    acc = HessianAccumulator(in_features)
    acc.add(x, keep)          # x [..., in_features]; keep bool [...] (False = not counted)
    H = acc.hessian()         # float32 [in, in]; N = number of kept tokens

`keep` is how padding is masked and how P-GPTQ drops the first `s` positions of every sequence
(`prefix_mask`). Each batch's `xᵀx` is computed in float32 and summed in float64, so the result
does not depend on how the tokens were split into batches beyond float32 rounding of one batch.
"""

from __future__ import annotations

import torch

from ..weight import QuantError


def prefix_mask(mask: torch.Tensor, skip: int) -> torch.Tensor:
    """bool [B, T]: `mask` with the first `skip` positions of every sequence set False
    (P-GPTQ, specs/quant.md §3). `skip=0` returns `mask` unchanged."""
    if skip < 0:
        raise QuantError(f"prefix skip={skip} is negative", "use 0 (GPTQ) or a positive count")
    if skip == 0:
        return mask
    out = mask.clone()
    out[:, :skip] = False
    return out


class HessianAccumulator:
    """Running `Σ x xᵀ` (float64) and token count for one linear layer's input."""

    def __init__(self, in_features: int, name: str = "") -> None:
        self.in_features = in_features
        self.name = name
        self.sum = torch.zeros(in_features, in_features, dtype=torch.float64)
        self.count = 0

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
        self.sum.add_(flat.T @ flat)  # float32 product, accumulated in float64 without a copy
        self.count += int(flat.shape[0])

    def hessian(self, release: bool = False) -> torch.Tensor:
        """float32 [in, in]: (2/N) Σ x xᵀ; all zeros when no token was kept (every column dead).
        `release` frees the float64 sum (the accumulator cannot be used afterwards)."""
        if self.count == 0:
            h = torch.zeros(self.in_features, self.in_features)
        elif release:  # scale in place: no second float64 n x n tensor
            h = self.sum.mul_(2.0 / self.count).float()
        else:
            h = (self.sum * (2.0 / self.count)).float()
        if release:
            self.sum = torch.empty(0, dtype=torch.float64)
        return h

