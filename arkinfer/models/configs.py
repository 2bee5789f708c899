"""Known configs as data: the real MiniCPM4.1-8B config.json and tiny test configs.

Tiny configs keep the real key names and tensor layout; their widths are multiples of 128 (in) and
64 (out) so every quantisation format, Marlin included, can take them.
"""

from __future__ import annotations

import copy
from typing import Any

# docs/model.md §1; the published 4.1 LongRoPE lists are identical for long and short. Only
# the first (0.99823…) and last (126.0171…) values are given there, so the 64 factors are
# interpolated geometrically between them: enough to size, trace and exercise LongRoPE.
_FIRST, _LAST = 0.9982316082870437, 126.01711130143255
LONGROPE_FACTORS = [_FIRST * (_LAST / _FIRST) ** (i / 63) for i in range(64)]

MINICPM4_1_8B: dict[str, Any] = {
    "architectures": ["MiniCPMForCausalLM"],
    "model_type": "minicpm",
    "vocab_size": 73448,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "intermediate_size": 16384,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 65536,
    "scale_emb": 12,
    "scale_depth": 1.4,
    "dim_model_base": 256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": [2, 73440],
    "pad_token_id": 2,
    "rope_scaling": {
        "rope_type": "longrope",
        "long_factor": LONGROPE_FACTORS,
        "short_factor": LONGROPE_FACTORS,
        "original_max_position_embeddings": 65536,
    },
}

SPARSE_CONFIG_4_1: dict[str, Any] = {
    "kernel_size": 32, "kernel_stride": 16, "block_size": 64, "init_blocks": 1,
    "window_size": 2048, "topk": 64, "use_nope": False, "dense_len": 8192,
}


def tiny_config(model_type: str = "llama", **overrides: Any) -> dict[str, Any]:
    """A small config.json dict of `model_type` (llama, mistral, qwen2, qwen3, minicpm)."""
    cfg: dict[str, Any] = {
        "architectures": [], "model_type": model_type, "vocab_size": 512, "hidden_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 256, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "max_position_embeddings": 2048, "tie_word_embeddings": False,
        "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
    }
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "minicpm": "MiniCPMForCausalLM"}[model_type]
    cfg["architectures"] = [arch]
    if model_type == "qwen3":
        cfg["head_dim"] = 64  # Qwen3 stores head_dim and need not equal hidden/heads
    if model_type == "mistral":
        cfg["sliding_window"] = None
    if model_type == "minicpm":
        half = cfg["hidden_size"] // cfg["num_attention_heads"] // 2
        factors = [1.0 + 0.5 * i for i in range(half)]
        cfg.update(scale_emb=12, scale_depth=1.4, dim_model_base=32,
                   rope_scaling={"rope_type": "longrope", "long_factor": factors[::-1],
                                 "short_factor": factors, "original_max_position_embeddings": 64})
    cfg.update(copy.deepcopy(overrides))
    return cfg
