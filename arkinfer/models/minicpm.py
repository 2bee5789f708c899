"""MiniCPM4 / MiniCPM4.1 reference model (`model_type: "minicpm"`).

MiniCPM4 = Llama + three scales + LongRoPE + InfLLM v2 sparse attention (docs/model.md §2):

    h = embed(ids) * scale_emb
    h = h + scale_depth / sqrt(L) * attn(rmsnorm(h));  h = h + scale_depth / sqrt(L) * mlp(rmsnorm(h))
    logits = lm_head(rmsnorm(h) / (hidden_size / dim_model_base))

With `sparse_config` in config.json every layer is an InfLLM v2 layer: a forward call whose total
length (cache + new tokens) is below `dense_len` runs dense attention — that is the InfLLM v2
semantics, not a fallback — and a longer one runs the sparse path (arkinfer.ops.infllmv2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Self

from torch import Tensor

from arkinfer.errors import ConfigError, NotAvailableError
from arkinfer.models.config_values import ConfigReader
from arkinfer.models.llama import (
    Attention,
    LlamaConfig,
    LlamaForCausalLM,
    expected_weights,
)
from arkinfer.ops.infllmv2.common import CompressedKeys
from arkinfer.ops.infllmv2.config import SparseConfig

__all__ = ["MiniCPMConfig", "MiniCPMForCausalLM", "SparseLayerCache", "expected_weights"]


@dataclass(frozen=True)
class MiniCPMConfig(LlamaConfig):
    scale_emb: float = 1.0
    scale_depth: float = 1.0
    dim_model_base: int = 1
    sparse_config: dict[str, Any] | None = None

    @property
    def embedding_scale(self) -> float:
        return self.scale_emb

    @property
    def residual_scale(self) -> float:
        return self.scale_depth / math.sqrt(self.num_hidden_layers)

    @property
    def logit_divisor(self) -> float:
        return self.hidden_size / self.dim_model_base

    @property
    def dense_len(self) -> int | None:
        """Total length at which sparse attention starts (-1: always); None without sparse_config."""
        if self.sparse_config is None:
            return None
        return int(self.sparse_config.get("dense_len", 8192))

    @classmethod
    def from_hf(cls, raw: dict[str, Any], source: str = "config.json") -> MiniCPMConfig:
        r = ConfigReader(raw, source)
        kw = cls._read_common(r, raw)
        kw["scale_emb"] = r.get("scale_emb", float, 1.0)
        kw["scale_depth"] = r.get("scale_depth", float, 1.0)
        kw["dim_model_base"] = r.get("dim_model_base", int, kw["hidden_size"] or 1)
        kw["sparse_config"] = r.get("sparse_config", dict, None)
        if kw["sparse_config"] is not None:
            try:
                SparseConfig.from_dict(kw["sparse_config"])
            except ConfigError as exc:
                r.check(False, exc.message)
        r.check(not raw.get("attention_bias", False), "MiniCPM has no attention biases")
        r.finish()
        return cls(**kw)


SparseImpl = Literal["fast", "reference"]


class SparseLayerCache(tuple):
    """One layer's cache (k, v) — a plain 2-tuple to every caller — that also carries `infllm`,
    the InfLLM v2 compressed keys (`CompressedKeys`) of the first `infllm.length` keys of k.

    A sparse MiniCPM layer returns one of these, and reads `infllm` back from the cache it is
    given, so decode extends the compressed keys incrementally instead of recompressing the whole
    cache every step. A plain (k, v) tuple (a fresh cache, or one rebuilt by the caller) simply
    has no state: the layer recompresses, with the same result.
    """

    infllm: CompressedKeys | None

    def __new__(cls, k: Tensor, v: Tensor, infllm: CompressedKeys | None) -> Self:
        cache = super().__new__(cls, (k, v))
        cache.infllm = infllm
        return cache


def carried_state(cache: tuple[Tensor, Tensor]) -> CompressedKeys | None:
    """The compressed keys a cache carries, if they can still describe its keys: a state covering
    more keys than the cache holds (the caller cut the cache back) is dropped."""
    state = getattr(cache, "infllm", None)
    if state is None or state.length > cache[0].shape[2]:
        return None
    return state


class MiniCPMAttention(Attention):
    """GQA attention that switches to InfLLM v2 at `dense_len` when sparse_config is present.

    `sparse_impl` picks the fast CPU implementation (default) or the literal reference; both are
    held to the same conformance suite. The compressed keys travel with the KV cache
    (`SparseLayerCache`): cache in, cache out, nothing kept in the module between calls.
    """

    force_dense: bool = False
    sparse_impl: SparseImpl = "fast"
    # [state] only during one forward call: the carried state in, the updated one out. A direct
    # attend() call (no cache at hand) carries nothing.
    _carry: list[CompressedKeys | None] | None = None

    def __init__(self, cfg: MiniCPMConfig) -> None:
        super().__init__(cfg)
        self.sparse = SparseConfig.from_dict(cfg.sparse_config) if cfg.sparse_config else None
        if self.sparse is not None and self.sparse.use_nope:
            raise NotAvailableError(
                "sparse_config.use_nope=true (block selection on pre-RoPE keys) is not wired into "
                "the reference model yet", hint="set use_nope to false (MiniCPM4.1's value)")

    def forward(self, x: Tensor, positions: Tensor, rope: tuple[Tensor, float],
                cache: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Attention.forward, with the InfLLM v2 state read from and returned in the cache."""
        self._carry = [carried_state(cache)]
        try:
            out, (k, v) = super().forward(x, positions, rope, cache)
            state = self._carry[0]
        finally:
            self._carry = None
        # Without a state (dense so far, or while tracing the IR) the cache stays a plain tuple.
        return out, (k, v) if state is None else SparseLayerCache(k, v, state)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # Read dense_len from self.cfg on every call: IR tracing swaps in a config whose
        # dense_len is None so the dense op is traced (the IR node carries the sparse_config).
        dense_len = self.cfg.dense_len
        if dense_len is None or self.force_dense or (0 <= k.shape[2] < dense_len):
            return super().attend(q, k, v)
        from arkinfer.ops import infllmv2
        from arkinfer.ops.infllmv2 import reference

        impl = infllmv2.infllmv2_attention if self.sparse_impl == "fast" else \
            reference.infllmv2_attention
        carry = self._carry
        out, state, _idx = impl(q, k, v, config=self.sparse, scale=1.0 / math.sqrt(self.d),
                                cache_len=k.shape[2] - q.shape[2],
                                state=None if carry is None else carry[0])
        if carry is not None:
            carry[0] = state
        return out


class MiniCPMForCausalLM(LlamaForCausalLM):
    attention_cls = MiniCPMAttention

    def set_dense(self, dense: bool) -> None:
        """Force dense attention everywhere (the `--dense` switch), e.g. to compare with sparse."""
        for layer in self.model.layers:
            layer.self_attn.force_dense = dense

    def set_sparse_impl(self, impl: SparseImpl) -> None:
        """Run InfLLM v2 with the fast CPU implementation or the literal reference."""
        for layer in self.model.layers:
            layer.self_attn.sparse_impl = impl


MODEL_TYPES = ("minicpm",)
ConfigClass = MiniCPMConfig
ModelClass = MiniCPMForCausalLM
