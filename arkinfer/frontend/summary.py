"""What a checkpoint is and what it costs: parameters, dims, sparse config, weight and KV memory.

Reads config.json and safetensors headers only (no tensor data), so it works on an 8B checkpoint
within a few hundred MB of RAM.
"""

from __future__ import annotations

from typing import Any

from arkinfer.frontend.checkpoint import Checkpoint

CONTEXTS = (4096, 32768, 131072)
GiB = 1024**3


def kv_bytes_per_token(config: Any, elem_bytes: int = 2) -> int:
    """K and V of one token across all layers: 2 · layers · kv_heads · head_dim · elem."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * elem_bytes


def compressed_key_bytes(config: Any, ctx: int, elem_bytes: int = 2) -> int:
    """InfLLM v2's extra cache: fine (stride 16) and coarse (stride 64) mean-pooled keys."""
    sc = getattr(config, "sparse_config", None)
    if not sc:
        return 0
    stride = int(sc.get("kernel_stride", 16))
    n1, n2 = ctx // stride, ctx // (4 * stride)
    return config.num_hidden_layers * config.num_key_value_heads * config.head_dim * \
        elem_bytes * (n1 + n2)


def summarize(ckpt: Checkpoint) -> dict[str, Any]:
    """A JSON-ready description of the checkpoint (see `arkinfer inspect`)."""
    cfg = ckpt.config
    params = sum(_numel(info.shape) for info in ckpt.weights.infos.values())
    dtypes = sorted({info.dtype for info in ckpt.weights.infos.values()})
    per_token = kv_bytes_per_token(cfg)
    kv = {str(c): {"dense_bf16_bytes": per_token * c,
                   "infllmv2_extra_bytes": compressed_key_bytes(cfg, c)} for c in CONTEXTS}
    return {
        "path": str(ckpt.path),
        "model_type": cfg.model_type,
        "architectures": ckpt.raw_config.get("architectures", []),
        "parameters": params,
        "dims": {
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "layers": cfg.num_hidden_layers,
            "attention_heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "max_position_embeddings": cfg.max_position_embeddings,
            "tie_word_embeddings": cfg.tie_word_embeddings,
        },
        "rope": cfg.rope_scaling.get("rope_type", cfg.rope_scaling.get("type"))
        if cfg.rope_scaling else "default",
        "scales": {"embedding": cfg.embedding_scale, "residual": cfg.residual_scale,
                   "logit_divisor": cfg.logit_divisor},
        "sparse_config": getattr(cfg, "sparse_config", None),
        "weights": {"files": len({i.file for i in ckpt.weights.infos.values()}),
                    "tensors": len(ckpt.weights), "dtypes": dtypes,
                    "bytes": ckpt.weights.total_bytes(), "bf16_bytes": 2 * params,
                    "int4_g128_bytes": int(params * (4 + 16 / 128) / 8)},
        "kv_cache_bytes_per_token_bf16": per_token,
        "kv_cache": kv,
        "tokenizer": None if ckpt.tokenizer is None else {
            "vocab_size": ckpt.tokenizer.vocab_size,
            "chat_template": bool(ckpt.tokenizer.chat_template)},
    }


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
