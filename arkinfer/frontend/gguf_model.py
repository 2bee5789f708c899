"""GGUF architectures as data: tensor-name map, q/k row permutation and config.json builders.

llama.cpp's `llama` and `minicpm` architectures apply RoPE to interleaved pairs (dims 2i, 2i+1),
Hugging Face to halves (dims i, i + D/2). Its converter (convert_hf_to_gguf.py, `LlamaModel.permute`)
therefore reorders the rows of q_proj / k_proj (and their biases) once per head:

    w.reshape(n_head, 2, D // 2, *rest).swapaxes(1, 2).reshape(w.shape)

with `n_head = num_key_value_heads` for k. `unpermute_qk` is the exact inverse. Qwen2 / Qwen3 use
NEOX ("rotate half") RoPE in llama.cpp, so their rows are stored unpermuted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from arkinfer.errors import GGUFError
from arkinfer.frontend.gguf_reader import GGUFFile, float32_clean


@dataclass(frozen=True)
class ArchSpec:
    """How one GGUF `general.architecture` maps onto a Hugging Face `model_type`."""

    gguf_arch: str
    model_type: str
    hf_class: str
    permuted_qk: bool  # llama.cpp "NORM" RoPE: q/k rows were permuted at conversion
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3


ARCHS: dict[str, ArchSpec] = {
    "llama": ArchSpec("llama", "llama", "LlamaForCausalLM", permuted_qk=True),
    "minicpm": ArchSpec("minicpm", "minicpm", "MiniCPMForCausalLM", permuted_qk=True),
    "qwen2": ArchSpec("qwen2", "qwen2", "Qwen2ForCausalLM", permuted_qk=False, qkv_bias=True),
    "qwen3": ArchSpec("qwen3", "qwen3", "Qwen3ForCausalLM", permuted_qk=False, qk_norm=True),
}

GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Carried into config.json (rope_scaling), not written as weights.
ROPE_FACTOR_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's conversion permutation of q/k rows (HF halves -> GGUF interleaved pairs).

    w: [n_head * D, *rest] (weight [out, in] or bias [out]).
    """
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Exact inverse of `permute_qk`: GGUF interleaved rows back to HF's rotate-half order."""
    if w.shape[0] % (2 * n_head):
        raise GGUFError(f"cannot undo the q/k row permutation: {w.shape[0]} rows are not a "
                        f"multiple of 2 x {n_head} heads", hint="the head counts in the GGUF "
                        "metadata do not match the tensor shapes; the file is inconsistent")
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def spec_from_gguf(f: GGUFFile) -> ArchSpec:
    spec = ARCHS.get(f.arch)
    if spec is None:
        raise GGUFError(f"{f.path.name} has architecture {f.arch!r}, which ArkInfer cannot import",
                        hint=f"supported GGUF architectures: {', '.join(ARCHS)}")
    return spec


@dataclass(frozen=True)
class ImportTensor:
    """One output tensor: HF name and shape, its GGUF source, and the q/k heads to unpermute."""

    hf_name: str
    gguf_name: str
    shape: tuple[int, ...]
    unpermute_heads: int | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _dims(f: GGUFFile) -> dict[str, int]:
    hidden = f.get_int(f"{f.arch}.embedding_length")
    heads = f.get_int(f"{f.arch}.attention.head_count")
    kv = f.get_int(f"{f.arch}.attention.head_count_kv", heads)
    if not heads or not kv or heads % kv:
        raise GGUFError(f"{f.path.name}: head_count={heads} is not a positive multiple of "
                        f"head_count_kv={kv}", hint="the file's metadata is inconsistent")
    head_dim = f.get_int(f"{f.arch}.attention.key_length", None) or \
        f.get_int(f"{f.arch}.rope.dimension_count", None) or hidden // heads
    rope_dim = f.get_int(f"{f.arch}.rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise GGUFError(f"{f.path.name}: RoPE covers {rope_dim} of {head_dim} head dims (partial "
                        "rotary), which ArkInfer's models do not support",
                        hint="only full-rotary Llama-family models can be imported")
    vocab = f.tensors["token_embd.weight"].shape[0] if "token_embd.weight" in f.tensors else 0
    dims = {"hidden": hidden, "heads": heads, "kv": kv, "head_dim": head_dim, "vocab": vocab,
            "layers": f.get_int(f"{f.arch}.block_count"),
            "ffn": f.get_int(f"{f.arch}.feed_forward_length")}
    _check_dims(f, dims)
    return dims


# _dims key -> (GGUF metadata key, config.json key whose range applies: models/config_values.py)
_DIM_KEYS = {"hidden": ("embedding_length", "hidden_size"),
             "heads": ("attention.head_count", "num_attention_heads"),
             "kv": ("attention.head_count_kv", "num_key_value_heads"),
             "head_dim": ("attention.key_length", "head_dim"),
             "layers": ("block_count", "num_hidden_layers"),
             "ffn": ("feed_forward_length", "intermediate_size")}


def _check_dims(f: GGUFFile, dims: dict[str, int]) -> None:
    """Sizes within config.json's ranges, and block_count equal to the `blk.N.` layers present,
    before anything is planned or allocated per layer (a block_count of 10^7 over a 2-layer file
    is one error, not a 7 GB MemoryError)."""
    from arkinfer.models.config_values import range_problem

    for name, (gguf_key, hf_key) in _DIM_KEYS.items():
        problem = range_problem(hf_key, dims[name])
        if problem:
            raise GGUFError(f"{f.path.name}: " + problem.replace(
                f"'{hf_key}'", f"metadata '{f.arch}.{gguf_key}'"), hint="the file's metadata is "
                "damaged or the model is too large for ArkInfer")
    found = {int(m.group(1)) for name in f.tensors if (m := re.match(r"blk\.(\d+)\.", name))}
    if found != set(range(dims["layers"])):
        held = f"blocks {min(found)}..{max(found)} ({len(found)} distinct)" if found else "no blocks"
        raise GGUFError(f"{f.path.name}: metadata '{f.arch}.block_count' = {dims['layers']} but "
                        f"the file's tensors hold {held}",
                        hint="the file's metadata does not match its tensors; it is damaged or "
                        "was edited")


def plan_tensors(f: GGUFFile, spec: ArchSpec) -> list[ImportTensor]:
    """Every output tensor in HF order (embed, layers 0..L-1, norm, lm_head), shapes checked.

    Raises one GGUFError listing missing, unexpected and mis-shaped tensors.
    """
    d = _dims(f)
    h, q, kv, i = d["hidden"], d["heads"] * d["head_dim"], d["kv"] * d["head_dim"], d["ffn"]
    layer_shapes: dict[str, tuple[int, ...]] = {
        "attn_norm.weight": (h,), "attn_q.weight": (q, h), "attn_k.weight": (kv, h),
        "attn_v.weight": (kv, h), "attn_output.weight": (h, q), "ffn_norm.weight": (h,),
        "ffn_gate.weight": (i, h), "ffn_up.weight": (i, h), "ffn_down.weight": (h, i),
    }
    if spec.qkv_bias:
        layer_shapes.update({"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)})
    if spec.qk_norm:
        layer_shapes.update({"attn_q_norm.weight": (d["head_dim"],),
                             "attn_k_norm.weight": (d["head_dim"],)})
    expected: dict[str, tuple[str, tuple[int, ...], int | None]] = {
        "token_embd.weight": (GLOBAL_NAMES["token_embd.weight"], (d["vocab"], h), None)}
    for layer in range(d["layers"]):
        for suffix, shape in layer_shapes.items():
            heads = None
            if spec.permuted_qk and suffix.startswith(("attn_q.", "attn_k.")):
                heads = d["heads"] if suffix.startswith("attn_q.") else d["kv"]
            expected[f"blk.{layer}.{suffix}"] = (
                f"model.layers.{layer}.{LAYER_NAMES[suffix]}", shape, heads)
    expected["output_norm.weight"] = (GLOBAL_NAMES["output_norm.weight"], (h,), None)
    if "output.weight" in f.tensors:
        expected["output.weight"] = (GLOBAL_NAMES["output.weight"], (d["vocab"], h), None)
    # Optional biases some Llama conversions carry (attention_bias=True checkpoints).
    for name in f.tensors:
        suffix = name.split(".", 2)[-1] if name.startswith("blk.") else ""
        if suffix in ("attn_q.bias", "attn_k.bias", "attn_v.bias") and name not in expected:
            raise GGUFError(f"{f.path.name} has attention biases ('{name}'), which the "
                            f"{spec.model_type!r} import does not carry",
                            hint="only bias-free Llama / MiniCPM models (and Qwen2) are supported")
    allowed_extra = set(ROPE_FACTOR_TENSORS) if spec.gguf_arch == "minicpm" else set()
    missing = [n for n in expected if n not in f.tensors]
    unexpected = [n for n in f.tensors if n not in expected and n not in allowed_extra]
    misshaped = [f"{n}: file {list(f.tensors[n].shape)}, expected {list(expected[n][1])}"
                 for n in expected if n in f.tensors and f.tensors[n].shape != expected[n][1]]
    if missing or unexpected or misshaped:
        parts = []
        for title, items in (("missing", missing), ("unexpected", unexpected),
                             ("wrong shape", misshaped)):
            if items:
                shown = items[:12] + ([f"... and {len(items) - 12} more"] if len(items) > 12 else [])
                parts.append(f"{title} ({len(items)}): " + "; ".join(shown))
        hint = ("'rope_freqs.weight' means Llama-3.1-style rope scaling, which the importer does "
                "not reconstruct yet" if "rope_freqs.weight" in unexpected else
                "the file's tensors do not match its own metadata, or it uses a variant of "
                f"the {f.arch!r} architecture that ArkInfer does not import")
        raise GGUFError(f"{f.path.name} does not hold the tensors of a {d['layers']}-layer "
                        f"{f.arch!r} model:\n  " + "\n  ".join(parts), hint=hint)
    return [ImportTensor(hf, gname, shape, heads) for gname, (hf, shape, heads) in expected.items()]


def hf_tensor(f: GGUFFile, plan: ImportTensor) -> np.ndarray:
    """Dequantised float32 tensor in HF layout (q/k rows unpermuted where llama.cpp permuted)."""
    data = f.dequantize(plan.gguf_name)
    if plan.unpermute_heads:
        data = np.ascontiguousarray(unpermute_qk(data, plan.unpermute_heads))
    return data


def _clean(value: float) -> int | float:
    """7 significant digits (float32 precision); whole numbers as int (scale_emb: 12)."""
    value = float(f"{value:.7g}")
    return int(value) if value.is_integer() else value


def _token_ids(f: GGUFFile) -> dict[str, Any]:
    bos = f.get_int("tokenizer.ggml.bos_token_id", None)
    eos = f.get_int("tokenizer.ggml.eos_token_id", None)
    pad = f.get_int("tokenizer.ggml.padding_token_id", None)
    extra = [f.get_int(k, None) for k in ("tokenizer.ggml.eot_token_id",
                                          "tokenizer.ggml.eom_token_id")]
    stops = [t for t in [eos, *extra] if t is not None]
    stops = list(dict.fromkeys(stops))
    return {"bos_token_id": bos, "eos_token_id": stops[0] if len(stops) == 1 else (stops or None),
            "pad_token_id": pad}


def build_config(f: GGUFFile, spec: ArchSpec, torch_dtype: str) -> dict[str, Any]:
    """config.json for the HF `model_type` of `spec`, from the GGUF metadata.

    MiniCPM: embedding_scale -> scale_emb; residual_scale = scale_depth / sqrt(L) -> scale_depth;
    logit_scale = hidden / dim_model_base -> dim_model_base; rope_factors_* -> longrope.
    """
    d = _dims(f)
    a = f.arch
    cfg: dict[str, Any] = {
        "architectures": [spec.hf_class],
        "model_type": spec.model_type,
        "vocab_size": d["vocab"],
        "hidden_size": d["hidden"],
        "intermediate_size": d["ffn"],
        "num_hidden_layers": d["layers"],
        "num_attention_heads": d["heads"],
        "num_key_value_heads": d["kv"],
        "head_dim": d["head_dim"],
        "hidden_act": "silu",
        "rms_norm_eps": f.get_float(f"{a}.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": f.get_float(f"{a}.rope.freq_base", 10000.0),
        "max_position_embeddings": f.get_int(f"{a}.context_length"),
        "tie_word_embeddings": "output.weight" not in f.tensors,
        **_token_ids(f),
        "torch_dtype": torch_dtype,
        "attention_bias": spec.qkv_bias,
        "mlp_bias": False,
        "rope_scaling": _rope_scaling(f, spec),
        "use_cache": True,
    }
    if spec.model_type == "qwen2":
        cfg["use_sliding_window"] = False
    if spec.model_type == "minicpm":
        if cfg["head_dim"] == d["hidden"] // d["heads"]:
            del cfg["head_dim"]  # MiniCPM's config.json does not store it
        del cfg["attention_bias"], cfg["mlp_bias"]
        logit_scale = f.get_float(f"{a}.logit_scale", 1.0)
        cfg["scale_emb"] = _clean(f.get_float(f"{a}.embedding_scale", 1.0))
        cfg["scale_depth"] = _clean(f.get_float(f"{a}.residual_scale", 1.0)
                                    * math.sqrt(d["layers"]))
        cfg["dim_model_base"] = _clean(d["hidden"] / logit_scale)
        sparse = _sparse_config(f)
        if sparse:
            cfg["sparse_config"] = sparse
    return cfg


#: where the gguf backend writes a model's InfLLM v2 `sparse_config` (backends/gguf/metadata.py)
SPARSE_PREFIX = "arkinfer.sparse."


def _sparse_config(f: GGUFFile) -> dict[str, Any]:
    """The `sparse_config` an ArkInfer GGUF carries as `arkinfer.sparse.<key>`, so the imported
    model (verify's quantised reference) runs InfLLM v2 as the file's runtime does; {} when the
    file has none (llama.cpp's own converters write none)."""
    names = f.keys()  # GGUFFile.keys(): the metadata keys in file order
    return {key[len(SPARSE_PREFIX):]: f.get(key) for key in names
            if key.startswith(SPARSE_PREFIX)}


def _rope_scaling(f: GGUFFile, spec: ArchSpec) -> dict[str, Any] | None:
    a = f.arch
    kind = f.get(f"{a}.rope.scaling.type", None)
    if spec.gguf_arch == "minicpm" and ROPE_FACTOR_TENSORS[0] in f.tensors:
        long = f.dequantize(ROPE_FACTOR_TENSORS[0]).reshape(-1)
        short_name = ROPE_FACTOR_TENSORS[1]
        short = f.dequantize(short_name).reshape(-1) if short_name in f.tensors else long
        orig = f.get_int(f"{a}.rope.scaling.original_context_length", None) or \
            f.get_int(f"{a}.context_length")
        return {"rope_type": "longrope", "long_factor": [float32_clean(x) for x in long],
                "short_factor": [float32_clean(x) for x in short],
                "original_max_position_embeddings": orig}
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": f.get_float(f"{a}.rope.scaling.factor")}
    raise GGUFError(f"{f.path.name} uses rope scaling {kind!r}, which the importer does not carry",
                    hint="supported rope scaling in GGUF import: none, linear, and MiniCPM longrope")
