"""True-sequential capture that runs each part of a decoder block once.

    seq = SequentialForward(runner)               # runner: a BlockRunner on a DecoderLayer
    for names in SEQUENTIAL_GROUPS:
        accs = seq.hessians(names, keep)          # inputs given the groups already quantised
        ...quantise `names`, runner.set_weight(...)
    y = seq.output()                              # [N, T, H], equal to runner.run() bit for bit

The generic way (`BlockRunner.hessians` per group) re-runs the block from its input for every
group, about 3.6 block forwards per block with the final output. Here each stage value of a
Llama / MiniCPM decoder block (`arkinfer.models.llama.DecoderLayer`, r = residual_scale) is
computed once, per batch of `runner.batch` sequences, from the stage before it:

    a  = input_layernorm(x)                         -> input of q, k, v
    c  = attention(a) before o_proj [b, T, Hq*D]    -> input of o
    h1 = x + o_proj(c) * r
    m  = post_attention_layernorm(h1)               -> input of gate, up
    d  = silu(gate(m)) * up(m)  [b, T, I]           -> input of down
    y  = h1 + down_proj(d) * r                      -> the block's output

with the same ops in the same order as `DecoderLayer.forward`, so the result does not change
One pass over the parts is about one block forward; the float reference the block SNR is
measured against (`runner.reference`) is recorded for the first `report_sequences` sequences
only (8 by default: 4096 tokens of 512), so a block costs about 1.3 forwards instead of 3.6.
Kept between stages: `c`, then `h1`, then `d` (recomputed from `h1` in `output()` when it would
take more than `keep_bytes`, 1 GiB by default: an 8B model's MLP width times many tokens).
The groups must come in SEQUENTIAL_GROUPS order.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from arkinfer.models.llama import DecoderLayer

from .block import SEQUENTIAL_GROUPS, BlockRunner, StopForward
from .hessian import CrossAccumulator, HessianAccumulator

KEEP_BYTES = 1 << 30
REPORT_SEQUENCES = 8


def mlp_input_kept(tokens: int, intermediate: int, keep_bytes: int = KEEP_BYTES) -> bool:
    """Whether down_proj's float32 input `d` [tokens, intermediate] is kept between stages
    (else `output()` recomputes it from `h1`)."""
    return tokens * intermediate * 4 <= keep_bytes


def supports(runner: BlockRunner) -> bool:
    """True when the block is a plain DecoderLayer (the stage split above is its forward)."""
    return isinstance(runner.layer, DecoderLayer) and \
        type(runner.layer).forward is DecoderLayer.forward


class SequentialForward:
    """Stage values of one block across its true-sequential groups (see the module docstring)."""

    def __init__(self, runner: BlockRunner, keep_bytes: int = KEEP_BYTES,
                 report_sequences: int = REPORT_SEQUENCES) -> None:
        if not supports(runner):
            raise TypeError(f"{type(runner.layer).__name__} is not a DecoderLayer")
        self.runner = runner
        self.keep_bytes = keep_bytes
        self.report_sequences = report_sequences
        self.next_group = 0
        self.attn_in: list[Tensor] | None = None   # c per batch
        self.h1: list[Tensor] | None = None        # h1 per batch
        self.mlp_in: list[Tensor] | None = None    # d per batch (when small enough)

    @torch.no_grad()
    def hessians(self, names: list[str], keep: Tensor, prefix: Tensor | None = None,
                 prefix_cap: float = 0.0) -> dict[str, HessianAccumulator]:
        """Accumulators of the inputs of `names` (linears of the next group in order)."""
        return self.capture(names, keep, prefix, prefix_cap)[0]

    @torch.no_grad()
    def capture(self, names: list[str], keep: Tensor, prefix: Tensor | None = None,
                prefix_cap: float = 0.0, float_twin: SequentialForward | None = None
                ) -> tuple[dict[str, HessianAccumulator], dict[str, CrossAccumulator]]:
        """`hessians`, and with `float_twin` (a SequentialForward of the block's float copy on
        the float model's inputs, stepped in lockstep) the cross moments `Σ x_f x_qᵀ` of the
        same tokens' float-path and quantised-path inputs (empty dict without a twin)."""
        r = self.runner
        group = next(i for i, g in enumerate(SEQUENTIAL_GROUPS) if names[0] in g)
        if group != self.next_group or any(n not in SEQUENTIAL_GROUPS[group] for n in names):
            raise RuntimeError(f"groups must come in order: expected "
                               f"{SEQUENTIAL_GROUPS[self.next_group]}, got {names}")
        self.next_group += 1
        if group == 0 and r.reference is None:
            r.take_reference(self.report_sequences)
        accs = {n: HessianAccumulator(r.linear(n).in_features, r.full(n), prefix_cap, r.device)
                for n in names}
        crosses = {} if float_twin is None else \
            {n: CrossAccumulator(r.linear(n).in_features, r.full(n), r.device) for n in names}
        if float_twin is not None:
            float_twin._advance(group)
        for j, rows in enumerate(self._rows()):
            x = self._stage(group, j, rows)
            for acc in accs.values():
                acc.add(x, keep[rows])
                if prefix is not None:
                    acc.add_prefix(x, prefix[rows])
            if float_twin is not None:
                x_float = float_twin._stage(group, j, rows)
                for cross in crosses.values():
                    cross.add(x_float, x, keep[rows])
        return accs, crosses

    def _advance(self, group: int) -> None:
        """Step a float twin to `group` (its stages are computed by the quantised side's
        `capture`)."""
        if group != self.next_group:
            raise RuntimeError(f"float twin expected group {self.next_group}, got {group}")
        self.next_group += 1

    def _rows(self) -> list[slice]:
        return [slice(b0, b1) for b0, b1 in self.runner.batches()]

    def _stage(self, group: int, j: int, rows: slice) -> Tensor:
        """Input of `group` for batch j, computing (and keeping) what later stages need."""
        r, layer = self.runner, self.runner.layer
        if group == 0:
            return layer.input_layernorm(r.inputs[rows])
        if group == 1:
            c = self._attention_core(layer.input_layernorm(r.inputs[rows]))
            self._keep("attn_in", j, c)
            return c
        if group == 2:
            assert self.attn_in is not None
            h1 = r.inputs[rows] + layer.self_attn.o_proj(self.attn_in[j]) * layer.residual_scale
            self.attn_in[j] = None  # type: ignore[call-overload]
            self._keep("h1", j, h1)
            return layer.post_attention_layernorm(h1)
        assert self.h1 is not None
        d = self._mlp_in(self.h1[j])
        if self._mlp_in_fits():
            self._keep("mlp_in", j, d)
        return d

    def _attention_core(self, a: Tensor) -> Tensor:
        """self_attn(a) up to o_proj's input [b, T, Hq*D] (the forward stops there)."""
        got: list[Tensor] = []

        def pre(_mod, args):
            got.append(args[0])
            raise StopForward

        attn = self.runner.layer.self_attn
        handle = attn.o_proj.register_forward_pre_hook(pre)
        try:
            attn(a, self.runner.positions, self.runner.rope, self.runner.cache(a.shape[0]))
        except StopForward:
            pass
        finally:
            handle.remove()
        return got[0]

    def _mlp_in(self, h1: Tensor) -> Tensor:
        mlp = self.runner.layer.mlp
        m = self.runner.layer.post_attention_layernorm(h1)
        return nn.functional.silu(mlp.gate_proj(m)) * mlp.up_proj(m)

    def _mlp_in_fits(self) -> bool:
        r = self.runner
        n, t, _ = r.inputs.shape
        return mlp_input_kept(n * t, r.linear("mlp.down_proj").in_features, self.keep_bytes)

    def _keep(self, attr: str, j: int, value: Tensor) -> None:
        kept = getattr(self, attr)
        if kept is None:
            kept = [None] * len(self._rows())
            setattr(self, attr, kept)
        kept[j] = value

    @torch.no_grad()
    def output(self) -> Tensor:
        """The block's outputs [N, T, H] with every group's current weights (after the last
        group was captured and quantised)."""
        if self.next_group != len(SEQUENTIAL_GROUPS) or self.h1 is None:
            raise RuntimeError("output() comes after the last group's capture")
        layer = self.runner.layer
        outs = []
        for j, h1 in enumerate(self.h1):
            d = self.mlp_in[j] if self.mlp_in is not None else self._mlp_in(h1)
            outs.append(h1 + layer.mlp.down_proj(d) * layer.residual_scale)
        self.h1 = self.mlp_in = None
        return torch.cat(outs)
