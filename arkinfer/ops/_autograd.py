"""Autograd for ArkInfer's custom ops by recomputation through their plain-torch implementation.

The ops exist for tracing (one node each); gradients are only needed to train the demo model and
for quantisation-aware experiments, so backward simply re-runs the reference implementation under
autograd. One helper for every op keeps the math in one place.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def register_recompute_autograd(op, impl: Callable[..., torch.Tensor]) -> None:
    """Make `op` differentiable w.r.t. its floating-point tensor arguments via `impl`."""

    def setup_context(ctx, inputs, output) -> None:
        ctx.inputs = inputs

    def backward(ctx, grad):
        args = [a.detach().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor)
                else a for a in ctx.inputs]
        wanted = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        with torch.enable_grad():
            out = impl(*args)
            grads = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True))
        return tuple(next(grads) if isinstance(a, torch.Tensor) and a.requires_grad else None
                     for a in args)

    op.register_autograd(backward, setup_context=setup_context)
