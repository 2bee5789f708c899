"""ArkInfer's MLX model: the Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2 with q/k/v biases,
Qwen3 with q/k norms) and MiniCPM4 / MiniCPM4.1 (the three scales, LongRoPE, GQA, tied or
separate lm_head, InfLLM v2) in MLX ops, over an artifact in mlx-lm's layout.

    model = MlxModel.load(artifact_dir)
    logits, cache = model(ids [B, T] int32, model.empty_cache())     # [B, T, V]; cache in/out
    logits, cache = model(mx.array([[tok]]), cache, last_only=True)  # decode: [B, 1, V]

The config is ArkInfer's own parse of config.json (`arkinfer.models.parse_config`: the scales,
RoPE frequencies incl. LongRoPE, sparse_config), so the runtime computes what the reference
model (`arkinfer/models/llama.py`, `minicpm.py`) computes:

    h = embed(ids) * scale_emb
    per layer: h += r * attn(rms_norm(h));  h += r * mlp(rms_norm(h))     (r = scale_depth/sqrt(L))
    logits = lm_head(rms_norm(h) / (hidden_size / dim_model_base))

Scales are 1 for the Llama family. Ops follow mlx-lm's own models (mx.fast.rms_norm, mx.fast.rope
with rotate-half pairing, mx.fast.scaled_dot_product_attention, mx.quantized_matmul), so on the
same folder the two agree to rounding. Attention of a MiniCPM model with sparse_config is InfLLM
v2 (infllmv2.py) whenever the call's total length reaches dense_len, as in the reference.

Activations take the dtype of the float tensors (the embedding's scales when it is quantised).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import mlx.core as mx

from arkinfer import models
from arkinfer.errors import ConfigError, NotAvailableError
from arkinfer.frontend.checkpoint import read_config
from arkinfer.ops.infllmv2.common import CompressedKeys
from arkinfer.ops.infllmv2.config import SparseConfig

from .infllmv2 import infllmv2_attention
from .weights import Embedding, Linear, read_weights

__all__ = ["CACHE_STEP", "LayerCache", "MlxModel"]

CACHE_STEP = 256  # KV capacity grows in steps of this many positions (mlx-lm's KVCache.step)


@dataclass(frozen=True)
class LayerCache:
    """One layer's KV cache, a value: `k`, `v` [B, Hkv, capacity, D] whose first `length`
    positions are filled, and `infllm`, the InfLLM v2 compressed keys of the first
    `infllm.length` keys (None until the first sparse call). Appending returns a new
    LayerCache; the old one stays valid (mx.slice_update writes in place only when MLX may
    donate the buffer)."""

    k: mx.array
    v: mx.array
    length: int = 0
    infllm: CompressedKeys | None = None

    def append(self, k: mx.array, v: mx.array) -> LayerCache:
        b, h, t, d = k.shape
        keys, values = self.k, self.v
        end = self.length + t
        if end > keys.shape[2]:
            grow = -(-(end - keys.shape[2]) // CACHE_STEP) * CACHE_STEP
            pad = mx.zeros((b, h, grow, d), dtype=keys.dtype)
            keys = mx.concatenate([keys[:, :, :self.length], pad], axis=2)
            values = mx.concatenate([values[:, :, :self.length], pad], axis=2)
        start = mx.array([self.length])
        keys = mx.slice_update(keys, k.astype(keys.dtype), start, axes=(2,))
        values = mx.slice_update(values, v.astype(values.dtype), start, axes=(2,))
        return replace(self, k=keys, v=values, length=end)

    def filled(self) -> tuple[mx.array, mx.array]:
        return self.k[:, :, :self.length], self.v[:, :, :self.length]


def _rms_norm(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    return mx.fast.rms_norm(x, weight, eps)


class _Rope:
    """Rotate-half RoPE with ArkInfer's frequencies for a call ending at `total` positions:
    plain (theta) as mlx-lm's nn.RoPE, otherwise the config's inv_freq (linear, llama3,
    LongRoPE short/long factors) as periods; LongRoPE's attention scale multiplies q and k."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        scaling = cfg.rope_scaling or {}
        self.plain = scaling.get("rope_type", scaling.get("type", "default")) == "default"
        self._cache: dict[bool, tuple[mx.array, float]] = {}

    def tables(self, total: int) -> tuple[mx.array | None, float]:
        if self.plain:
            return None, 1.0
        scaling = self.cfg.rope_scaling
        orig = int(scaling.get("original_max_position_embeddings",
                               self.cfg.max_position_embeddings))
        long = total > orig  # the only thing the frequencies depend on (short / long factors)
        if long not in self._cache:
            inv_freq, scale = self.cfg.inv_freq(total)
            periods = mx.array((1.0 / inv_freq.double()).float().numpy())
            self._cache[long] = (periods, scale)
        return self._cache[long]

    def __call__(self, x: mx.array, offset: int, freqs: mx.array | None, scale: float) -> mx.array:
        d = x.shape[-1]
        if freqs is None:
            return mx.fast.rope(x, d, traditional=False, base=self.cfg.rope_theta, scale=1.0,
                                offset=offset)
        if scale != 1.0:
            x = x * scale
        return mx.fast.rope(x, d, traditional=False, base=None, scale=1.0, offset=offset,
                            freqs=freqs)


class MlxModel:
    """The whole model as plain MLX arrays and functions (see the module docstring)."""

    def __init__(self, cfg: Any, weights: dict[str, Any]) -> None:
        self.cfg = cfg
        self.w = weights
        self.hq, self.hkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.scale = 1.0 / math.sqrt(self.d)
        self.rope = _Rope(cfg)
        raw_sparse = getattr(cfg, "sparse_config", None)
        self.sparse = SparseConfig.from_dict(raw_sparse) if raw_sparse else None
        if self.sparse is not None and self.sparse.use_nope:
            raise NotAvailableError(
                "sparse_config.use_nope=true (block selection on pre-RoPE keys) is not wired into "
                "the MLX runtime (nor the reference model)",
                hint="set use_nope to false (MiniCPM4.1's value)")
        self.force_dense = False
        embed: Embedding = weights["model.embed_tokens"]
        table = embed.table
        self.dtype = (table.scales if table.scales is not None else table.weight).dtype
        self.vocab_size = int(cfg.vocab_size)

    @classmethod
    def load(cls, folder: str | Path) -> MlxModel:
        """Read config.json and the weights of an artifact folder (strict, see weights.py)."""
        folder = Path(folder)
        raw = read_config(folder)
        cfg = models.parse_config(raw, str(folder / "config.json"))
        return cls(cfg, read_weights(folder, raw))

    # -- cache -------------------------------------------------------------------------------
    def empty_cache(self, batch: int = 1) -> list[LayerCache]:
        shape = (batch, self.hkv, 0, self.d)
        return [LayerCache(mx.zeros(shape, self.dtype), mx.zeros(shape, self.dtype))
                for _ in range(self.cfg.num_hidden_layers)]

    # -- layers ------------------------------------------------------------------------------
    def _attention(self, i: int, x: mx.array, cache: LayerCache, freqs: mx.array | None,
                   rope_scale: float) -> tuple[mx.array, LayerCache]:
        p = f"model.layers.{i}.self_attn."
        b, t, _ = x.shape
        offset = cache.length
        q = self.w[p + "q_proj"](x).reshape(b, t, self.hq, self.d)
        k = self.w[p + "k_proj"](x).reshape(b, t, self.hkv, self.d)
        v = self.w[p + "v_proj"](x).reshape(b, t, self.hkv, self.d)
        if self.cfg.qk_norm:  # Qwen3: RMSNorm per head before RoPE
            q = _rms_norm(q, self.w[p + "q_norm.weight"], self.cfg.rms_norm_eps)
            k = _rms_norm(k, self.w[p + "k_norm.weight"], self.cfg.rms_norm_eps)
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
        q = self.rope(q, offset, freqs, rope_scale)
        k = self.rope(k, offset, freqs, rope_scale)
        cache = cache.append(k, v)
        keys, values = cache.filled()
        total = cache.length
        window = self.cfg.sliding_window
        if window is not None and total > window:
            raise ConfigError(f"sequence of {total} tokens exceeds sliding_window={window}, "
                              "which ArkInfer does not implement",
                              hint=f"keep prompts under {window}")
        if self.sparse is None or self.force_dense or self.sparse.is_dense(total):
            mask = "causal" if t > 1 else None
            out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=self.scale,
                                                       mask=mask)
        else:
            out, state, _ = infllmv2_attention(q, keys, values, config=self.sparse,
                                               scale=self.scale, cache_len=offset,
                                               state=cache.infllm)
            cache = replace(cache, infllm=state)
        out = out.transpose(0, 2, 1, 3).reshape(b, t, self.hq * self.d)
        return self.w[p + "o_proj"](out), cache

    def _mlp(self, i: int, x: mx.array) -> mx.array:
        p = f"model.layers.{i}.mlp."
        gate: Linear = self.w[p + "gate_proj"]
        return self.w[p + "down_proj"](_swiglu(gate(x), self.w[p + "up_proj"](x)))

    def __call__(self, ids: mx.array, cache: list[LayerCache], *, last_only: bool = False,
                 taps: tuple[int, ...] = ()) -> tuple[mx.array, list[LayerCache]]:
        """ids [B, T] int -> (logits [B, T, V] (last_only: [B, 1, V]) in the activation dtype,
        the cache with the T new positions appended). The layers run are those `cache` has
        entries for (a cache of the first N layers runs them alone: the `self:N` draft).
        `taps`: layers whose input hidden state [B, T, H] (the residual stream, before any
        norm) is kept in `self.tapped`, in the order given (EAGLE-3's taps)."""
        self.tapped = [None] * len(taps)
        cfg = self.cfg
        total = cache[0].length + ids.shape[1]
        freqs, rope_scale = self.rope.tables(total)
        h = self.w["model.embed_tokens"](ids)
        if cfg.embedding_scale != 1.0:
            h = h * cfg.embedding_scale
        r = cfg.residual_scale
        eps = cfg.rms_norm_eps
        new_cache = []
        for i, layer_cache in enumerate(cache):
            if i in taps:
                self.tapped[taps.index(i)] = h
            p = f"model.layers.{i}."
            x = _rms_norm(h, self.w[p + "input_layernorm.weight"], eps)
            attn, layer_cache = self._attention(i, x, layer_cache, freqs, rope_scale)
            h = h + (attn * r if r != 1.0 else attn)
            mlp = self._mlp(i, _rms_norm(h, self.w[p + "post_attention_layernorm.weight"], eps))
            h = h + (mlp * r if r != 1.0 else mlp)
            new_cache.append(layer_cache)
        if last_only:
            h = h[:, -1:]
        h = _rms_norm(h, self.w["model.norm.weight"], eps)
        if cfg.logit_divisor != 1.0:
            h = h / cfg.logit_divisor
        head = self.w.get("lm_head")
        logits = head(h) if head is not None else self.w["model.embed_tokens"].as_linear(h)
        return logits, new_cache


@partial(mx.compile, shapeless=True)
def _swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up, fused like mlx-lm's activations.swiglu."""
    return gate * mx.sigmoid(gate) * up
