"""Choose the ggml type of every tensor of a checkpoint (float or quantised folder) for a GGUF.

    plan = plan_model(ckpt, spec, recipe, dtype="f16", options={})
    plan.tensors   # [TensorPlan], in file order
    plan.notes     # fallbacks and other choices the user must know
    plan.layers    # {"model.layers.0.mlp.up_proj": "Q4_0", ...}

The rules are in tensors.py's docstring and README.md. Options: `embeddings=<type>` sets the
type of token_embd / output (default q8_0 in quantised builds, the float dtype otherwise; f32,
f16, bf16, q8_0, q4_0, q4_1). `rtn=ggml|folder` (RTN recipes only): "ggml" (default) quantises the
float source with ggml's reference quantiser, so the blocks are byte-identical to llama-quantize's;
"folder" copies ArkInfer's RTN blocks (a different rounding rule: scale 2·absmax/15 instead of
ggml's d = max/-8). Calibrated recipes (GPTQ, P-GPTQ, AWQ, ternary) always keep the folder's blocks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from arkinfer.quant.formats import get_format
from arkinfer.quant.formats.gguf_blocks import GGMLType
from arkinfer.quant.load import format_of, layer_format

from arkinfer import models
from arkinfer.errors import ArkError
from arkinfer.frontend.checkpoint import Checkpoint
from arkinfer.frontend.gguf_model import ArchSpec
from arkinfer.ops import rope as rope_ops

from .options import OPTIONS
from .tensors import EMBED_TYPE, FLOAT_TYPES, TensorPlan, fit_type, gguf_name, qk_heads

# the `embeddings=` values the backend declares, as ggml types (q8_0 -> GGMLType.Q8_0)
EMBED_CHOICES = {name: GGMLType[name.upper()] for name in OPTIONS["embeddings"].choices}


@dataclass
class ModelPlan:
    """quantised: the file holds quantised linears (from a quantised folder, or rounded here
    from the float source for an RTN recipe with rtn=ggml)."""

    tensors: list[TensorPlan]
    notes: list[str] = field(default_factory=list)
    layers: dict[str, str] = field(default_factory=dict)
    quantised: bool = False

    def main_type(self) -> GGMLType:
        """The type most linear weights (2-D, inside the layers) have: the file's `file_type`."""
        counts = Counter(t.qtype for t in self.tensors
                         if len(t.shape) == 2 and t.name.startswith("blk."))
        return counts.most_common(1)[0][0] if counts else GGMLType.F32


def rtn_option(options: dict[str, str]) -> str:
    """The `rtn=` option: "ggml" (default) or "folder"; anything else is an ArkError."""
    rtn = options.get("rtn", "ggml").lower()
    if rtn not in OPTIONS["rtn"].choices:
        raise ArkError(f"--option rtn={rtn} is not a choice", hint="use rtn=ggml or rtn=folder")
    return rtn


def ggml_rtn(recipe: Any, options: dict[str, str]) -> bool:
    """True when ggml's reference quantiser rounds the linears from the float source: an RTN
    recipe in a GGUF block format with rtn=ggml (the default). The build then needs no quantised
    folder (`Backend.quantizes_in_lower`)."""
    return (recipe is not None and recipe.calib == "rtn" and rtn_option(options) == "ggml"
            and getattr(get_format(recipe.format), "ggml_type", None) is not None)


def packed_format(ckpt: Checkpoint) -> tuple[str | None, GGMLType | None]:
    """(format name, ggml type) of a quantised folder's packed linears; (None, None) for float."""
    qcfg = ckpt.raw_config.get("quantization_config")
    if not isinstance(qcfg, dict):
        return None, None
    name, _ = format_of(qcfg)
    fmt = get_format(name)
    qtype = getattr(fmt, "ggml_type", None)
    if qtype is None:
        raise ArkError(f"{ckpt.path} is quantised in the {name!r} format, which GGUF cannot hold",
                       hint="quantise with a GGUF block format: --format gguf-q4_0, gguf-q4_1, "
                       "gguf-q8_0, gguf-iq4_nl, gguf-tq1_0 or gguf-tq2_0 (or build from the float "
                       "checkpoint)")
    return name, GGMLType(int(qtype))


def layer_ggml_type(ckpt: Checkpoint, owner: str, default: GGMLType) -> GGMLType:
    """The ggml type of packed linear `owner`: its entry in the folder's per-layer table
    (`quantization_config.layers`, mixed precision) or the folder's own type."""
    own = layer_format(ckpt.raw_config.get("quantization_config") or {}, owner)
    if own is None:
        return default
    qtype = getattr(get_format(own[0]), "ggml_type", None)
    if qtype is None:
        raise ArkError(f"{ckpt.path}: layer {owner} is stored in the {own[0]!r} format, which "
                       "GGUF cannot hold", hint="quantise it with a GGUF block format")
    return GGMLType(int(qtype))


def _expected(ckpt: Checkpoint) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = models.build_model(ckpt.config)
    return models.module_for(ckpt.raw_config).expected_weights(model)


def _extra_tensors(spec: ArchSpec, config: Any) -> list[TensorPlan]:
    """RoPE factor tensors: MiniCPM LongRoPE lists, Llama 3 frequency factors."""
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    half = config.head_dim // 2
    if kind == "longrope":
        if spec.gguf_arch != "minicpm":
            raise ArkError(f"rope_scaling 'longrope' on a {config.model_type!r} model has no "
                           "llama.cpp form in the GGUF backend", hint="only MiniCPM uses LongRoPE")
        out = []
        for key, name in (("long_factor", "rope_factors_long.weight"),
                          ("short_factor", "rope_factors_short.weight")):
            data = np.asarray(scaling[key], dtype=np.float32)
            if data.shape != (half,):
                raise ArkError(f"rope_scaling.{key} has {data.size} values; head_dim/2 = {half}",
                               hint="fix rope_scaling in config.json")
            out.append(TensorPlan(name, name, (half,), GGMLType.F32, "data", data=data))
        return out
    if kind == "llama3":
        # llama.cpp divides each frequency by rope_freqs[i]: factor = default / llama3 frequency.
        base = rope_ops.default_inv_freq(config.head_dim, config.rope_theta)
        ours, _ = config.inv_freq(0)
        data = (base / ours).numpy().astype(np.float32)
        return [TensorPlan("rope_freqs.weight", "rope_freqs.weight", (half,), GGMLType.F32,
                           "data", data=data)]
    return []


def plan_model(ckpt: Checkpoint, spec: ArchSpec, recipe: Any, dtype: str,
               options: dict[str, str], source: Checkpoint | None = None) -> ModelPlan:
    """Every tensor of `ckpt` with its GGUF name and ggml type (see the module docstring).

    source: the float checkpoint `ckpt` was quantised from (used by `rtn=ggml`)."""
    if dtype not in FLOAT_TYPES:
        raise ArkError(f"dtype {dtype!r} is not a GGUF float type",
                       hint=f"use one of {', '.join(FLOAT_TYPES)}")
    float_type = FLOAT_TYPES[dtype]
    fmt_name, packed_type = packed_format(ckpt)
    quantised = fmt_name is not None
    # a float checkpoint with an RTN recipe: ggml rounds every linear right here
    rounds_here = not quantised and ggml_rtn(recipe, options)
    if rounds_here:
        fmt_name = recipe.format
        packed_type = GGMLType(int(get_format(recipe.format).ggml_type))
        quantised = True
    embed_opt = options.get("embeddings", "q8_0").lower()
    if embed_opt not in EMBED_CHOICES:
        raise ArkError(f"--option embeddings={embed_opt} is not a type the GGUF backend writes",
                       hint=f"use one of {', '.join(EMBED_CHOICES)}")
    explicit = "embeddings" in options
    embed_type = EMBED_CHOICES[embed_opt] if explicit else (EMBED_TYPE if quantised else float_type)
    from_source = (quantised and not rounds_here and ggml_rtn(recipe, options)
                   and source is not None)
    plan = ModelPlan(_extra_tensors(spec, ckpt.config), quantised=quantised)
    config = ckpt.config
    for hf_name, shape in _expected(ckpt).items():
        name = gguf_name(hf_name)
        owner = hf_name.rsplit(".", 1)[0]
        heads = qk_heads(spec, hf_name, config)
        if len(shape) == 1:
            plan.tensors.append(TensorPlan(hf_name, name, shape, GGMLType.F32, "float", heads))
            continue
        info = ckpt.weights.infos[hf_name]
        if info.dtype == "U8":
            if not quantised:
                raise ArkError(f"'{hf_name}' is stored as bytes but {ckpt.path}/config.json has "
                               "no quantization_config", hint="the folder is damaged; re-export it")
            kind = "source" if from_source else "packed"
            qtype = layer_ggml_type(ckpt, owner, packed_type)
            plan.tensors.append(TensorPlan(hf_name, name, shape, qtype, kind, heads))
            plan.layers[owner] = qtype.name
            continue
        is_embed = name in ("token_embd.weight", "output.weight")
        if is_embed:
            want, why = embed_type, "embeddings/output rule"
        elif not quantised:
            want, why = float_type, "float build"
        elif recipe is not None and recipe.skips(owner):
            want, why = float_type, "skipped by the recipe"
        elif rounds_here:
            want, why = packed_type, "RTN recipe"
        else:
            want, why = packed_type, "left in float by the quantiser"
            plan.notes.append(f"{owner}: left in float by the quantiser; stored as "
                              f"{packed_type.name} by ggml's reference quantiser (re-rounded)")
        qtype, skipped = fit_type(want, shape)
        if skipped:
            plan.notes.append(f"{owner}: rows of {shape[-1]} do not split into "
                              f"{'/'.join(t.name for t in skipped)} blocks ({why}); stored as "
                              f"{qtype.name}")
        plan.tensors.append(TensorPlan(hf_name, name, shape, qtype, "float", heads))
        plan.layers[owner] = qtype.name
    if from_source or rounds_here:
        plan.notes.append(f"RTN recipe: linears quantised to {packed_type.name} from the float "
                          "source by ggml's reference quantiser (bytes as llama-quantize writes "
                          "them; --option rtn=folder keeps ArkInfer's RTN blocks)")
    elif quantised:
        plan.notes.append(f"linears from the {fmt_name} folder: block bytes copied unchanged "
                          "(no re-rounding)")
    return plan
