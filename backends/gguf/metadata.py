"""GGUF metadata of a model: `general.*`, the architecture's hyper-parameters and `arkinfer.*`.

Keys as upstream llama.cpp's convert_hf_to_gguf.py writes them (the values llama.cpp reads):

    {arch}.context_length / embedding_length / block_count / feed_forward_length
    {arch}.attention.head_count / head_count_kv / layer_norm_rms_epsilon
    {arch}.attention.key_length / value_length      (only when head_dim != hidden / heads)
    {arch}.rope.dimension_count / freq_base
    {arch}.rope.scaling.type "linear" + factor      (linear rope scaling)
    minicpm.embedding_scale = scale_emb             (h = embed * 12)
    minicpm.residual_scale  = scale_depth / sqrt(L) (h += 0.247 * block(h) for MiniCPM4.1-8B)
    minicpm.logit_scale     = hidden / dim_model_base   (llama.cpp divides the logits by it)
    minicpm.rope.scaling.type "longrope" + original_context_length (+ attn_factor when != 1)

InfLLM v2's `sparse_config` goes to `arkinfer.sparse.<key>` and, named the way llama.cpp names
MiniMax-M3's MSA indexer keys, to the keys ArkInfer's llama.cpp patch (llamacpp_patch/) reads:

    minicpm.attention.indexer.block_size    uint32  block_size                      (64)
    minicpm.attention.indexer.top_k         uint32  blocks selected in all: topk + window/block (96)
    minicpm.attention.indexer.local_blocks  uint32  trailing blocks forced, the query's own included:
                                                    window/block + 1 (33)
    minicpm.attention.indexer.init_blocks   uint32  init_blocks                     (1)
    minicpm.attention.indexer.kernel_size   uint32  kernel_size                     (32)
    minicpm.attention.indexer.kernel_stride uint32  kernel_stride                   (16)
    minicpm.attention.indexer.dense_len     uint32  dense_len, 0 for -1 (always sparse) (8192)
    minicpm.attention.indexer.use_nope      bool    use_nope

Upstream llama.cpp ignores both sets and runs attention dense; `arkinfer.version` /
`arkinfer.recipe` record the build.
"""

from __future__ import annotations

import math
from typing import Any

from arkinfer.frontend.gguf_model import SPARSE_PREFIX, ArchSpec
from arkinfer.ops.rope import longrope_attention_scale


def _add_sparse(writer: Any, sparse: dict[str, Any]) -> None:
    for key, value in sparse.items():
        name = SPARSE_PREFIX + key
        if isinstance(value, bool):
            writer.add_bool(name, value)
        elif isinstance(value, int):
            writer.add_int32(name, value)
        elif isinstance(value, float):
            writer.add_float32(name, value)
        elif isinstance(value, str):
            writer.add_string(name, value)
        # None and nested values have no GGUF form; the manifest keeps the whole sparse_config


def _add_indexer(writer: Any, arch: str, sparse: dict[str, Any]) -> None:
    """`{arch}.attention.indexer.*` (the table above) from a valid sparse_config."""
    from dataclasses import fields

    from arkinfer.ops.infllmv2.config import SparseConfig

    known = {f.name for f in fields(SparseConfig)}
    cfg = SparseConfig.from_dict({k: v for k, v in sparse.items() if k in known})
    prefix = f"{arch}.attention.indexer."
    for key, value in (("block_size", cfg.block_size), ("top_k", cfg.budget),
                       ("local_blocks", cfg.local_blocks + 1), ("init_blocks", cfg.init_blocks),
                       ("kernel_size", cfg.kernel_size), ("kernel_stride", cfg.kernel_stride),
                       ("dense_len", max(cfg.dense_len, 0))):
        writer.add_uint32(prefix + key, value)
    writer.add_bool(prefix + "use_nope", cfg.use_nope)


def write_metadata(writer: Any, spec: ArchSpec, config: Any, raw: dict[str, Any], *,
                   name: str, file_type: int, quantised: bool, recipe: str | None) -> None:
    """Add general.*, `{arch}.*` and arkinfer.* keys for `config` to a gguf.GGUFWriter."""
    import gguf

    from arkinfer import __version__

    writer.add_type("model")
    writer.add_name(name)
    writer.add_file_type(file_type)
    if quantised:
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_quantized_by(f"ArkInfer {__version__}")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_rope_dimension_count(config.head_dim)
    if config.head_dim * config.num_attention_heads != config.hidden_size:
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
    writer.add_vocab_size(config.vocab_size)
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
    if spec.gguf_arch == "minicpm":
        writer.add_embedding_scale(float(config.scale_emb))
        writer.add_residual_scale(config.scale_depth / math.sqrt(config.num_hidden_layers))
        writer.add_logit_scale(config.hidden_size / config.dim_model_base)
        if kind == "longrope":
            orig = int(scaling.get("original_max_position_embeddings",
                                   config.max_position_embeddings))
            writer.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
            writer.add_rope_scaling_orig_ctx_len(orig)
            factor = longrope_attention_scale(config.max_position_embeddings, orig)
            if factor != 1.0:
                writer.add_rope_scaling_attn_factors(factor)
        sparse = getattr(config, "sparse_config", None)
        if sparse:
            _add_sparse(writer, sparse)
            _add_indexer(writer, spec.gguf_arch, sparse)
    writer.add_string("arkinfer.version", __version__)
    if recipe is not None:
        writer.add_string("arkinfer.recipe", recipe)
