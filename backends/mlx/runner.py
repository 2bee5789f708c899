"""An MLX artifact on this machine: ArkInfer's MLX runtime (model.py) as a Runner
(`arkinfer.backend.Runner`), so verify, eval and bench work on it; on Linux it runs on mlx[cpu].

    runner = load_runner(artifact_dir, manifest)
    logits = runner.window_logits(ids)                # [T, V] float32 from an empty cache
    runner.reset(); runner.prefill(ids[:-1]); nxt = runner.decode(ids[-1])
    runner.set_attention("dense")                     # MiniCPM with sparse_config: dense / sparse
    rows = runner.extend(draft); runner.truncate(n)   # speculative decoding's verify / rollback

The KV cache (with the InfLLM v2 compressed keys) is a value the runner holds between calls:
each call hands the model the cache and keeps the one it returns. `prefill` and `decode` run
the output projection on the last position only; every call evaluates (mx.eval) before it
returns, so timings measure the work.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arkinfer.backend import StepRunner, check_token_ids
from arkinfer.errors import ArkError, NotAvailableError
from arkinfer.frontend.tokenizer import load_tokenizer
from arkinfer.generate import require_finite
from arkinfer.speculative.taps import HiddenTaps, RecordsTaps, check_tap_layers

INSTALL_HINT = "pip install 'arkinfer[mlx]'  (mlx[cpu] on Linux, mlx with Metal on macOS)"


def _mlx():
    try:
        import mlx.core as mx
    except ImportError as exc:
        raise NotAvailableError(f"MLX is not installed ({exc}); the mlx backend's runtime needs it",
                                hint=INSTALL_HINT) from None
    return mx


class MlxRunner(RecordsTaps, StepRunner):
    """ArkInfer's MLX runtime over one artifact folder in mlx-lm's layout."""

    speculates = True
    _layers: int | None = None  # the first layers this runner runs (None: all; the self:N draft)

    def __init__(self, artifact_dir: str | Path) -> None:
        self.mx = _mlx()
        from .model import MlxModel

        self.dir = Path(artifact_dir)
        self.model = MlxModel.load(self.dir)
        self.vocab_size = self.model.vocab_size
        # Only a model with sparse_config has two attentions to switch between.
        self.attention_modes = ("dense", "sparse") if self.model.sparse is not None else ()
        self.tokenizer = load_tokenizer(self.dir)
        self.reset()

    def set_attention(self, mode: str) -> None:
        """"dense" or "sparse" (InfLLM v2 from dense_len on, the default)."""
        if mode not in self.attention_modes:
            super().set_attention(mode)  # raises, naming what this model can run
        self.model.force_dense = mode == "dense"

    def reset(self) -> None:
        self.cache = self.model.empty_cache(1)[:self._layers]
        if self._taps is not None:
            self._taps.clear()

    @property
    def layer_count(self) -> int:
        return self._layers or int(self.model.cfg.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.model.cfg.hidden_size)

    def first_layers(self, n: int) -> MlxRunner:
        """A runner over the same model's first `n` layers, its final norm and LM head (the
        `self:N` draft): the same weights, its own cache of n layers."""
        if not 1 <= n < self.layer_count:
            raise ArkError(f"first_layers({n}): {self.dir} has {self.layer_count} layers; take "
                           f"1..{self.layer_count - 1}", hint="pick fewer layers")
        draft = copy.copy(self)
        draft._layers, draft._taps = n, None
        draft.reset()
        return draft

    def enable_taps(self, layers) -> None:
        """Record the hidden states at the input of `layers` (EAGLE-3's taps, 1..L-1) of every
        position evaluated from now on; the cache starts empty."""
        self._taps = HiddenTaps(check_tap_layers(layers, self.layer_count, str(self.dir)))
        self.reset()

    def disable_taps(self) -> None:
        self._taps = None
        self.reset()

    def truncate(self, n: int) -> None:
        """Keep the first `n` cached positions: each LayerCache's `length` goes back to n (the
        rows past it are overwritten by the next append); InfLLM v2's compressed keys stay when
        they cover at most n keys, else they are dropped and recomputed on the next sparse call."""
        held = self.cache[0].length
        if not 0 <= n <= held:
            raise ArkError(f"cannot truncate the cache to {n} positions: it holds {held}",
                           hint=f"pass 0..{held}")
        self.cache = [replace(c, length=n, infllm=c.infllm if c.infllm is None or
                              c.infllm.length <= n else None) for c in self.cache]
        if self._taps is not None:
            self._taps.truncate(n)

    def _step(self, ids: list[int], last_only: bool) -> torch.Tensor:
        mx = self.mx
        check_token_ids(ids, self.vocab_size)
        x = mx.array([ids], dtype=mx.int32)
        taps = self._taps.layers if self._taps is not None else ()
        logits, self.cache = self.model(x, self.cache, last_only=last_only, taps=taps)
        state = [a for c in self.cache for a in (c.k, c.v) + (
            (c.infllm.fine, c.infllm.coarse) if c.infllm is not None else ())]
        mx.eval(logits, state, *self.model.tapped)
        if taps:
            self._taps.append([torch.from_numpy(np.array(t[0].astype(mx.float32)))
                               for t in self.model.tapped])
        out = torch.from_numpy(np.array(logits[0].astype(mx.float32)))
        require_finite(out, f"the MLX runtime on {self.dir}")
        return out


def load_runner(artifact_dir: Path, manifest: dict[str, Any], *, bench: bool = False) -> MlxRunner:
    """The Runner of an MLX artifact (`Backend.load`); `bench` changes nothing: every call is
    already evaluated before it returns, and no extra work is done for verification."""
    return MlxRunner(artifact_dir)
