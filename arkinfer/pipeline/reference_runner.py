"""ArkInfer's PyTorch reference model as a Runner: the artifact's HF folder (float or quantised,
dequantised by the format's numpy unpack) run eagerly on this CPU with a functional KV cache.

    runner = ReferenceRunner(artifact / "model")
    logits = runner.window_logits(ids)       # [T, V] float32 from an empty cache
    runner.reset(); last = runner.prefill(ids[:-1]); nxt = runner.decode(ids[-1])
    rows = runner.extend(draft); runner.truncate(n)   # speculative decoding's verify / rollback
    draft = runner.first_layers(2)           # the first 2 layers + norm + LM head, weights shared
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import torch
from torch import nn

from arkinfer.backend import RunnerBase
from arkinfer.errors import ArkError
from arkinfer.frontend.checkpoint import load_model, open_checkpoint
from arkinfer.generate import forward_checked
from arkinfer.models.minicpm import SparseLayerCache, carried_state
from arkinfer.speculative.taps import HiddenTaps, RecordsTaps, check_tap_layers


class ReferenceRunner(RecordsTaps, RunnerBase):
    """The reference model over `model_dir`; `dense=True` forces dense attention on sparse-config
    (InfLLM v2) models, which otherwise run InfLLM v2 above `dense_len`. It is the ground truth
    verify compares every backend's runner with, and the `reference` backend's runner."""

    attention_modes = ("dense", "sparse")
    speculates = True
    computes_in_torch = True

    def __init__(self, model_dir: str | Path, dense: bool = False) -> None:
        self.ckpt = open_checkpoint(model_dir)
        self.model = load_model(self.ckpt)
        self.tokenizer = self.ckpt.tokenizer
        self.vocab_size = int(self.ckpt.config.vocab_size)
        self.set_attention("dense" if dense else "sparse")
        self._taps: HiddenTaps | None = None
        self._tapped: list[torch.Tensor] | None = None  # filled by the layer hooks in _step
        self._tap_hooks: list = []
        self.reset()

    @property
    def layer_count(self) -> int:
        """Decoder layers of the model this runner runs."""
        return len(self.model.model.layers)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def input_embeddings(self) -> torch.Tensor:
        """The token embedding table [V, H] (before any embedding scale)."""
        return self.model.model.embed_tokens.weight.detach()

    def first_layers(self, n: int) -> ReferenceRunner:
        """A runner over this model's first `n` decoder layers, its final norm and its LM head
        (LayerSkip-style early exit: speculative decoding's `self:N` draft), with its own KV
        cache. Every weight and layer module is shared with this runner, not copied, so
        `set_attention` on either applies to the layers both run."""
        if not 1 <= n < self.layer_count:
            raise ArkError(f"first_layers({n}): the model of {self.ckpt.path} has "
                           f"{self.layer_count} layers; take 1..{self.layer_count - 1}",
                           hint=f"e.g. first_layers({max(1, self.layer_count // 2)})")
        draft = copy.copy(self)
        draft.model = early_exit_model(self.model, n)
        draft._taps, draft._tap_hooks = None, []  # the hooks on shared layers record for self only
        draft.reset()
        return draft

    def set_attention(self, mode: str) -> None:
        """"dense" or "sparse" (InfLLM v2 above dense_len; a no-op on dense-only models)."""
        if hasattr(self.model, "set_dense"):
            self.model.set_dense(mode == "dense")

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def reset(self) -> None:
        self._cache = self.model.empty_cache(1)
        self._pos = 0
        if self._taps is not None:
            self._taps.clear()

    def enable_taps(self, layers) -> None:
        """Record, from now on, the hidden states at the input of decoder layers `layers` (EAGLE-3's
        taps, arkinfer/speculative/taps.py) of every position this runner evaluates, by forward
        pre-hooks on those layers; `taps` then holds one row per cached position."""
        layers = check_tap_layers(layers, self.layer_count, f"the model of {self.ckpt.path}")
        slots = {i: j for j, i in enumerate(layers)}

        def hook(index):
            def record(_module, args):
                if self._tapped is not None:  # this runner's forward (layers may be shared)
                    self._tapped[slots[index]] = args[0][0].detach()
            return record

        for handle in self._tap_hooks:
            handle.remove()
        self._tap_hooks = [self.model.model.layers[i].register_forward_pre_hook(hook(i))
                           for i in sorted(slots)]
        self._taps = HiddenTaps(layers)
        self.reset()

    def disable_taps(self) -> None:
        """Stop recording taps (the hooks are removed); the cache starts empty."""
        for handle in self._tap_hooks:
            handle.remove()
        self._tap_hooks, self._taps = [], None
        self.reset()

    @torch.no_grad()
    def _step(self, ids: list[int]) -> torch.Tensor:
        x = torch.tensor([ids], dtype=torch.long)
        positions = torch.arange(self._pos, self._pos + len(ids))
        if self._taps is not None:
            self._tapped = [None] * len(self._taps.layers)
        try:
            logits, self._cache = forward_checked(self.model, x, positions, self._cache,
                                                  f"the reference model of {self.ckpt.path}")
            if self._taps is not None:
                self._taps.append(self._tapped)
        finally:
            self._tapped = None
        self._pos += len(ids)
        return logits[0].float()

    def window_logits(self, ids: list[int]) -> torch.Tensor:
        self.reset()
        return self._step(ids)

    def prefill(self, ids: list[int]) -> torch.Tensor:
        return self._step(ids)[-1]

    def chunk_logits(self, ids: list[int]) -> torch.Tensor:
        """Append `ids` as one forward call; logits [T, V] of each of them."""
        return self._step(ids)

    def decode(self, token: int) -> torch.Tensor:
        return self._step([token])[-1]

    def extend(self, ids: list[int]) -> torch.Tensor:
        """Append `ids` as one forward call; logits [len(ids), V] of each of them."""
        return self._step(ids)

    def truncate(self, n: int) -> None:
        """Keep the first `n` cached positions: every layer's k, v [B, Hkv, S, D] cut to S = n.
        InfLLM v2's compressed keys stay when they cover at most n keys (they describe only
        those), else they are dropped and the layer recompresses on its next call."""
        if not 0 <= n <= self._pos:
            raise ArkError(f"cannot truncate the cache to {n} positions: it holds {self._pos}",
                           hint=f"pass 0..{self._pos}")
        cut = []
        for layer in self._cache:
            k, v = layer[0][:, :, :n], layer[1][:, :, :n]
            state = carried_state(SparseLayerCache(k, v, getattr(layer, "infllm", None)))
            cut.append(SparseLayerCache(k, v, state) if state is not None else (k, v))
        self._cache, self._pos = cut, n
        if self._taps is not None:
            self._taps.truncate(n)


def early_exit_model(model: nn.Module, n: int) -> nn.Module:
    """A shallow copy of the reference model `model` (LlamaForCausalLM or a subclass) whose
    backbone runs only `model.model.layers[:n]`; the embedding, the layers, the final norm and the
    LM head are the same modules (no weight is copied). Its config says num_hidden_layers = n,
    so `empty_cache` makes n layer caches; each layer keeps the residual scale it was built
    with (MiniCPM's scale_depth / sqrt(L) of the full model), as an early exit must."""
    backbone = copy.copy(model.model)
    # copy.copy shares the module's child table: give the copy its own before replacing layers
    backbone._modules = dict(model.model._modules)
    backbone.layers = nn.ModuleList(list(model.model.layers)[:n])
    clone = copy.copy(model)
    clone._modules = dict(model._modules)
    clone.model = backbone
    clone.config = dataclasses.replace(model.config, num_hidden_layers=n)
    return clone
