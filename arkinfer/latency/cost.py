"""What a model costs per token, independent of the device: `ModelCost`.

    cost = ModelCost.from_config(raw_config, quant="marlin")            # sizes from config.json
    cost = ModelCost.from_config(raw_config, quant="q4_0", headers=infos)  # exact tensor sizes

Tensor inventory: with `headers` (safetensors `TensorInfo`s: name -> dtype tag and shape) every
tensor of the checkpoint with its dtype; without, the tensors the reference model expects
(`arkinfer.models`, built on the meta device: shapes only, no memory) in config.json's
`torch_dtype`. Roles: `embedding` (model.embed_tokens.weight), `lm_head` (lm_head.weight; a tied
lm_head reads the embedding), `linear` (2-D weights inside model.layers), `other` (norms, biases).

Storage per tensor follows the build: `--quant f32|f16|bf16` stores every tensor in that dtype; a
quant preset packs each decoder linear in the recipe's format (latency/storage.py) unless the
recipe skips it or the format refuses its shape, and keeps every other tensor in its source dtype
(quant/export.py does the same). lm_head is quantised only when the recipe does not skip it.

Per decode step the device reads (docs/targets.md): every linear + lm_head + norms/biases + one
embedding row + the KV cache (see `kv_read_bytes`); FLOPs 2 · (linear + lm_head parameters).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from arkinfer.errors import ConfigError
from arkinfer.frontend.safetensors_io import DTYPES
from arkinfer.latency.storage import FLOAT_BYTES, Storage, dtype_of, linear_storage
from arkinfer.resolve import FLOAT_SCHEMES
from arkinfer.frontend.summary import compressed_key_bytes, kv_bytes_per_token

Role = str  # "embedding" | "lm_head" | "linear" | "other"


@dataclass(frozen=True)
class TensorCost:
    """One stored tensor: name, role, shape, parameter count and storage."""

    name: str
    role: Role
    shape: tuple[int, ...]
    storage: Storage

    @property
    def params(self) -> int:
        return math.prod(self.shape)


def resolve_quant(quant: Any) -> tuple[str, Any]:
    """(label, recipe) for a --quant value: a float dtype (recipe None), a preset name, or a
    `QuantRecipe`. Unknown names raise ConfigError listing the accepted ones."""
    from arkinfer.quant.recipe import PRESETS, QuantRecipe, get_preset

    if isinstance(quant, QuantRecipe):
        return quant.describe(), quant
    if quant in FLOAT_SCHEMES:
        return quant, None
    if quant in PRESETS:
        return quant, get_preset(quant)
    raise ConfigError(f"unknown quant scheme {quant!r}; known: {', '.join([*FLOAT_SCHEMES, *PRESETS])}",
                      hint="pick a float dtype or a preset (quant/recipe.py lists the presets)")


def _role(name: str, ndim: int) -> Role:
    if name == "model.embed_tokens.weight":
        return "embedding"
    if name == "lm_head.weight":
        return "lm_head"
    if name.startswith("model.layers.") and name.endswith(".weight") and ndim == 2:
        return "linear"
    return "other"


def _inventory(raw: dict[str, Any], config: Any,
               headers: Mapping[str, Any] | None) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, safetensors dtype tag) of every tensor: from the headers, else from the
    meta model in config.json's torch_dtype."""
    if headers:
        return [(n, tuple(i.shape), str(i.dtype).upper()) for n, i in headers.items()]
    import torch

    from arkinfer import models

    with torch.device("meta"):
        model = models.build_model(config)
    shapes = models.module_for(raw).expected_weights(model)
    tag = dtype_of(raw).upper()
    return [(n, tuple(s), tag) for n, s in shapes.items()]


@dataclass(frozen=True)
class ModelCost:
    """Sizes and per-token costs of one model under one quant scheme (bytes, parameters).

    `config` is the parsed config (`arkinfer.models.parse_config`); `sparse` the InfLLM v2
    `SparseConfig` or None; `kv_elem_bytes` the KV cache element size (2: fp16/bf16 cache)."""

    quant: str
    recipe: Any
    raw_config: dict[str, Any]
    config: Any
    tensors: tuple[TensorCost, ...]
    sparse: Any
    kv_elem_bytes: int = 2
    source: str = "config.json"

    @classmethod
    def from_config(cls, raw_config: dict[str, Any], quant: Any = "f16",
                    headers: Mapping[str, Any] | None = None, *, kv_elem_bytes: int = 2,
                    source: str = "config.json") -> ModelCost:
        """Cost of the model `raw_config` describes under `quant` (see the module docstring)."""
        from arkinfer import models
        from arkinfer.ops.infllmv2.config import SparseConfig

        if "quantization_config" in raw_config:
            method = raw_config["quantization_config"].get("quant_method", "?")
            raise ConfigError(f"{source} describes an already quantised checkpoint "
                              f"(quant_method {method!r})",
                              hint="plan the float source checkpoint with --quant PRESET")
        config = models.parse_config(raw_config, source)
        label, recipe = resolve_quant(quant)
        sc = raw_config.get("sparse_config")
        sparse = SparseConfig.from_dict(sc, f"{source}: sparse_config") if sc else None
        tensors = []
        for name, shape, tag in _inventory(raw_config, config, headers):
            role = _role(name, len(shape))
            if tag not in FLOAT_BYTES:  # an integer buffer: counted as stored
                if role != "other":
                    raise ConfigError(f"{source}: weight {name!r} is {tag}, not a float tensor",
                                      hint="plan the float source checkpoint")
                nbytes = math.prod(shape) * DTYPES[tag][1]
                tensors.append(TensorCost(name, role, shape, Storage("raw", tag, nbytes)))
                continue
            dtype = label if recipe is None else tag.lower()
            if role in ("linear", "lm_head") and recipe is not None:
                storage = linear_storage(name.removesuffix(".weight"), shape[0], shape[1], recipe,
                                         dtype)
            else:
                storage = Storage("float", dtype, math.prod(shape) * FLOAT_BYTES[dtype])
            tensors.append(TensorCost(name, role, shape, storage))
        if config.tie_word_embeddings and recipe is not None and not recipe.skips("lm_head"):
            # export writes a quantised lm_head of its own (and unties it)
            emb = next(t for t in tensors if t.role == "embedding")
            tensors.append(TensorCost("lm_head.weight", "lm_head", emb.shape, linear_storage(
                "lm_head", emb.shape[0], emb.shape[1], recipe, emb.storage.fmt)))
        return cls(label, recipe, raw_config, config, tuple(tensors), sparse, kv_elem_bytes, source)

    # ------------------------------------------------------------------------------ inventory
    def _sum(self, role: Role, attr: str) -> int:
        return sum(t.storage.nbytes if attr == "bytes" else t.params
                   for t in self.tensors if t.role == role)

    def _lm_head(self) -> TensorCost:
        """The lm_head tensor, or the embedding it is tied to."""
        for role in ("lm_head", "embedding"):
            for t in self.tensors:
                if t.role == role:
                    return t
        raise ConfigError(f"{self.source}: no lm_head.weight and no model.embed_tokens.weight",
                          hint="the checkpoint is incomplete")

    @property
    def params(self) -> int:
        """Parameters stored (a tied lm_head counted once)."""
        return sum(t.params for t in self.tensors if t.role != "lm_head" or
                   not self.config.tie_word_embeddings)

    @property
    def params_linear(self) -> int:
        """Parameters of the decoder-block linears."""
        return self._sum("linear", "params")

    @property
    def params_lm_head(self) -> int:
        return self._lm_head().params

    @property
    def params_active(self) -> int:
        """Parameters multiplied per token: block linears + lm_head (2 FLOPs each)."""
        return self.params_linear + self.params_lm_head

    @property
    def weight_bytes(self) -> int:
        """Bytes resident on the device: every stored tensor."""
        return sum(t.storage.nbytes for t in self.tensors)

    def bytes_of(self, role: Role) -> int:
        return self._sum(role, "bytes")

    @property
    def lm_head_bytes(self) -> int:
        return self._lm_head().storage.nbytes

    @property
    def embedding_row_bytes(self) -> int:
        emb = next((t for t in self.tensors if t.role == "embedding"), None)
        return 0 if emb is None else emb.storage.nbytes // emb.shape[0]

    @property
    def weight_bytes_step(self) -> int:
        """Weight bytes read per decode step: linears + lm_head + other + one embedding row."""
        return (self.bytes_of("linear") + self.lm_head_bytes + self.bytes_of("other")
                + self.embedding_row_bytes)

    @property
    def linear_bits_per_weight(self) -> float:
        """Bits per decoder-linear weight incl. scales / zeros (float layers count as stored)."""
        return 8 * self.bytes_of("linear") / max(self.params_linear, 1)

    def float_layers(self) -> list[TensorCost]:
        """Linears (and lm_head) kept in float in a quantised build, with the reason."""
        return [t for t in self.tensors if t.storage.reason]

    # ------------------------------------------------------------------------------- KV cache
    @property
    def layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def kv_bytes_per_token(self) -> int:
        """2 · layers · kv_heads · head_dim · elem."""
        return kv_bytes_per_token(self.config, self.kv_elem_bytes)

    def compressed_key_bytes(self, ctx: int) -> int:
        """InfLLM v2 compressed keys at `ctx`: layers · kv_heads · head_dim · elem · (ctx/16 +
        ctx/64) (0 without sparse_config)."""
        return compressed_key_bytes(self.config, ctx, self.kv_elem_bytes)

    def sparse_at(self, total_len: int) -> bool:
        """True when InfLLM v2 runs for a call over `total_len` keys (config has sparse_config
        and total_len >= dense_len)."""
        return self.sparse is not None and not self.sparse.is_dense(total_len)

    @property
    def visible_keys(self) -> int | None:
        """Keys one query attends to under InfLLM v2: (topk + window/block) · block (6144)."""
        return None if self.sparse is None else self.sparse.full_visibility_len

    def kv_read_bytes(self, ctx: int, sparse: bool) -> int:
        """KV bytes one decode step reads with `ctx` cached tokens.

        dense: 2 · layers · kv_heads · head_dim · ctx · elem;
        sparse: layers · kv_heads · head_dim · elem · (2 · min(ctx, visible) + ctx/16 + ctx/64)."""
        if not sparse:
            return self.kv_bytes_per_token * ctx
        return (self.kv_bytes_per_token * min(ctx, self.visible_keys)
                + self.compressed_key_bytes(ctx))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready sizes: parameters, bytes per role, per step, KV per token, float layers."""
        by_format: dict[str, int] = {}
        for t in self.tensors:
            by_format[t.storage.fmt] = by_format.get(t.storage.fmt, 0) + t.storage.nbytes
        cfg = self.config
        return {
            "source": self.source, "quant": self.quant,
            "recipe": None if self.recipe is None else self.recipe.describe(),
            "architecture": (self.raw_config.get("architectures") or [cfg.model_type])[0],
            "layers": cfg.num_hidden_layers, "heads": cfg.num_attention_heads,
            "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
            "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "params": self.params, "params_linear": self.params_linear,
            "params_lm_head": self.params_lm_head, "params_active": self.params_active,
            "weight_bytes": self.weight_bytes,
            "weight_bytes_by_role": {r: self.bytes_of(r) for r in
                                     ("linear", "lm_head", "embedding", "other")},
            "weight_bytes_by_format": by_format,
            "linear_bits_per_weight": round(self.linear_bits_per_weight, 4),
            "weight_bytes_step": self.weight_bytes_step,
            "embedding_row_bytes": self.embedding_row_bytes,
            "kv_elem_bytes": self.kv_elem_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "sparse_config": None if self.sparse is None else self.sparse.to_dict(),
            "visible_keys": self.visible_keys,
            "float_layers": [{"name": t.name, "dtype": t.storage.fmt, "reason": t.storage.reason}
                             for t in self.float_layers()],
        }
