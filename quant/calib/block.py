"""One decoder block with its calibration inputs: the unit the calibrators work on.

    runner = BlockRunner(layer, "model.layers.3.", inputs, mask, rope, batch=8)
    accs = runner.hessians(["self_attn.q_proj"], keep)   # H of q_proj's input (= k, v's)
    runner.set_weight("self_attn.q_proj", w_hat)         # the block now uses the quantised q
    out = runner.run()                                   # [N, T, H] outputs of the whole block

`inputs` float32 [N, T, H] are the block's input hidden states for N calibration sequences of T
tokens, on the device the block runs on (its weights, `mask` and `rope` are there too); `mask` bool [N, T] marks real tokens (False = padding). Sequences run `batch` at a time
from an empty KV cache with positions 0..T-1. Capturing a linear's input registers a forward
pre-hook; when nothing later in the block is needed the forward stops right after it.

The first complete run while the block still holds its float weights is kept as `reference`
(the float block's outputs on these inputs, [n, T, H] for the first n <= N sequences), from which
the block's output SNR is measured; `take_reference(n)` records it for the first batches only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from .hessian import HessianAccumulator

# True-sequential order (docs/quant.md §2): linears of one group share their input.
SEQUENTIAL_GROUPS: tuple[tuple[str, ...], ...] = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("self_attn.o_proj",),
    ("mlp.gate_proj", "mlp.up_proj"),
    ("mlp.down_proj",),
)
LINEARS: tuple[str, ...] = tuple(n for g in SEQUENTIAL_GROUPS for n in g)

InputHook = Callable[[Tensor, slice], None]  # (x [b, T, in], the batch's rows of inputs)

BATCH_TOKENS = 4096  # calibration tokens per block forward unless a batch is given


def default_batch(seq_len: int) -> int:
    """Sequences per forward of `seq_len` tokens when the caller gives no batch (~BATCH_TOKENS)."""
    return max(1, BATCH_TOKENS // seq_len)


def reference_rows(n_seq: int, total: int, batch: int) -> int:
    """Sequences `take_reference(n_seq)` records out of `total` run `batch` at a time: n_seq
    (at least 1) rounded up to whole batches, at most `total`."""
    return min(total, batch * -(-max(1, n_seq) // batch))


class StopForward(Exception):
    """Raised from a pre-hook to end a forward once the wanted input has been seen; the
    caller that ran the forward catches it (here and in sequential.py)."""


class BlockRunner:
    """A decoder block (`DecoderLayer` of arkinfer.models.llama, float32) and its inputs."""

    def __init__(self, layer: nn.Module, prefix: str, inputs: Tensor, mask: Tensor,
                 rope: tuple[Tensor, float], batch: int = 8) -> None:
        self.layer, self.prefix = layer, prefix
        self.inputs, self.mask, self.rope = inputs, mask.to(torch.bool), rope
        self.batch = max(1, int(batch))
        self.device = inputs.device
        self.positions = torch.arange(inputs.shape[1], device=self.device)
        self.reference: Tensor | None = None
        self.float_inputs: Tensor | None = None  # the float model's inputs [N, T, H], when carried
        self.pristine = True
        attn = layer.self_attn
        self._kv_shape = (attn.hkv, 0, attn.d)

    # ------------------------------------------------------------------------------- access
    def linear(self, name: str) -> nn.Linear:
        return self.layer.get_submodule(name)

    def full(self, name: str) -> str:
        return self.prefix + name

    def weight(self, name: str) -> Tensor:
        return self.linear(name).weight.detach()

    def set_weight(self, name: str, w: Tensor) -> None:
        """Replace a linear's weight (float32 [out, in], moved to the block's device) — the block
        is no longer the float one."""
        lin = self.linear(name)
        lin.weight = nn.Parameter(w.detach().to(self.device, torch.float32).contiguous(),
                                  requires_grad=False)
        self.pristine = False

    def mark_modified(self) -> None:
        self.pristine = False

    def batches(self) -> list[tuple[int, int]]:
        n = self.inputs.shape[0]
        return [(b, min(b + self.batch, n)) for b in range(0, n, self.batch)]

    def cache(self, b: int) -> tuple[Tensor, Tensor]:
        z = self.inputs.new_zeros((b, *self._kv_shape))
        return z, z

    # -------------------------------------------------------------------------------- forward
    @torch.no_grad()
    def run(self, hooks: dict[str, InputHook] | None = None, stop_after: str | None = None,
            keep_output: bool = True) -> Tensor | None:
        """Run every batch through the block calling `hooks[name](x, rows)` with each hooked
        linear's input. With `stop_after`, each batch stops after that linear's input was seen
        and None is returned; otherwise the outputs [N, T, H] (or None if not `keep_output`)."""
        hooks = hooks or {}
        handles, current = [], {"rows": slice(0, 0)}
        for name, fn in hooks.items():
            def pre(_mod, args, _fn=fn, _name=name):
                _fn(args[0], current["rows"])
                if _name == stop_after:
                    raise StopForward
            handles.append(self.linear(name).register_forward_pre_hook(pre))
        if stop_after is not None and stop_after not in hooks:
            def stop(_mod, _args):
                raise StopForward
            handles.append(self.linear(stop_after).register_forward_pre_hook(stop))
        outs = []
        try:
            for b0, b1 in self.batches():
                current["rows"] = slice(b0, b1)
                try:
                    y, _ = self.layer(self.inputs[b0:b1], self.positions, self.rope,
                                      self.cache(b1 - b0))
                except StopForward:
                    continue
                if keep_output:
                    outs.append(y)
        finally:
            for h in handles:
                h.remove()
        if stop_after is not None or not keep_output:
            return None
        out = torch.cat(outs) if outs else self.inputs.clone()
        if self.pristine and self.reference is None:
            self.reference = out
        return out

    def ensure_reference(self) -> Tensor:
        """The float block's outputs; runs the block if no pristine full run happened yet."""
        if self.reference is None:
            if not self.pristine:
                raise RuntimeError("the float reference must be taken before any weight changes")
            self.run()
        assert self.reference is not None
        return self.reference

    @torch.no_grad()
    def take_reference(self, n_seq: int) -> Tensor:
        """Record the float block's outputs for the first batches covering `n_seq` sequences
        [n, T, H] (n = n_seq rounded up to whole batches, at most N) as `reference`."""
        if not self.pristine:
            raise RuntimeError("the float reference must be taken before any weight changes")
        rows = reference_rows(n_seq, self.inputs.shape[0], self.batch)
        outs = [self.layer(self.inputs[b0:b1], self.positions, self.rope, self.cache(b1 - b0))[0]
                for b0, b1 in self.batches() if b0 < rows]
        self.reference = torch.cat(outs)
        return self.reference

    def hessians(self, names: list[str], keep: Tensor | None = None,
                 stop: bool = True, prefix: Tensor | None = None,
                 prefix_cap: float = 0.0) -> dict[str, HessianAccumulator]:
        """Hessian accumulators of the inputs of `names` (float32 [in, in] via .hessian()).
        `keep` bool [N, T] overrides the token mask; `prefix` bool [N, T] marks P-GPTQ's prefix
        tokens, added with `prefix_cap` (see hessian.py; 0 = dropped). The forward runs to the
        end (recording the float reference) when the block is pristine and has none."""
        keep = self.mask if keep is None else keep.to(torch.bool)
        accs = {n: HessianAccumulator(self.linear(n).in_features, self.full(n), prefix_cap,
                                      self.device) for n in names}

        def make(name: str) -> InputHook:
            def fn(x: Tensor, rows: slice) -> None:
                accs[name].add(x, keep[rows])
                if prefix is not None:
                    accs[name].add_prefix(x, prefix[rows])
            return fn

        full = not stop or (self.pristine and self.reference is None)
        last = max(names, key=LINEARS.index) if all(n in LINEARS for n in names) else names[-1]
        self.run({n: make(n) for n in names}, stop_after=None if full else last,
                 keep_output=full)
        return accs

    def capture_inputs(self, names: list[str], n_seq: int | None = None) -> dict[str, Tensor]:
        """Inputs of `names` for the first `n_seq` sequences (all when None): [n, T, in] each."""
        n_seq = self.inputs.shape[0] if n_seq is None else min(n_seq, self.inputs.shape[0])
        got: dict[str, list[Tensor]] = {n: [] for n in names}
        seen = {n: 0 for n in names}

        def make(name: str) -> InputHook:
            def fn(x: Tensor, _rows: slice) -> None:
                take = min(x.shape[0], n_seq - seen[name])
                if take > 0:
                    got[name].append(x[:take].clone())
                    seen[name] += take
            return fn

        self.run({n: make(n) for n in names},
                 keep_output=self.pristine and self.reference is None)
        return {n: torch.cat(v) for n, v in got.items()}

    # ------------------------------------------------------------------- sub-module forwards
    @torch.no_grad()
    def attention(self, x: Tensor) -> Tensor:
        """self_attn on already-normalised inputs x [b, T, H] -> [b, T, H] (empty cache)."""
        y, _ = self.layer.self_attn(x, self.positions, self.rope, self.cache(x.shape[0]))
        return y

    @torch.no_grad()
    def mlp(self, x: Tensor) -> Tensor:
        return self.layer.mlp(x)
