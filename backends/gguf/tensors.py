"""The tensors of a GGUF file: names, ggml types and bytes, planned from a Hugging Face folder.

Names follow `arkinfer/frontend/gguf_model.py` (the import direction), inverted. Row layout: a
ggml tensor stores rows of `ne0 = in_features` values, so a Hugging Face weight `[out, in]` is
written as it is, and a quantised row is `in / block` consecutive blocks. The q/k row permutation
for llama.cpp's interleaved RoPE (`permute_qk`) moves whole rows, so it applies to block bytes
exactly as to floats (no re-rounding).

Type rules (see README.md):
- 1-D tensors (norms, biases, RoPE factors): F32.
- float build: every 2-D tensor in the requested dtype (F32 / F16 / BF16).
- quantised build: a linear stored packed in a `gguf-*` format keeps its block bytes and type;
  token embedding and output (unless the recipe quantised lm_head) go to `EMBED_TYPE` (Q8_0) by
  ggml's own reference quantiser; linears the recipe skips stay in the float dtype; linears the
  quantiser left in float are quantised to the recipe's type by ggml's reference quantiser.
- a type whose block does not divide the row falls back along `FALLBACK` (llama.cpp's own
  choices in llama-quantize: TQ -> Q4_0 -> F16, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,
  Q5_0 / Q5_1 / IQ4_NL -> F16); every fallback is reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from arkinfer.quant.formats.gguf_blocks import BLOCK, GGMLType, quantize_gguf

from arkinfer.errors import ArkError
from arkinfer.frontend.checkpoint import Checkpoint
from arkinfer.frontend.gguf_model import GLOBAL_NAMES, LAYER_NAMES, ArchSpec, permute_qk

HF_GLOBAL = {hf: g for g, hf in GLOBAL_NAMES.items()}
HF_LAYER = {hf: g for g, hf in LAYER_NAMES.items()}
FLOAT_TYPES = {"f32": GGMLType.F32, "f16": GGMLType.F16, "bf16": GGMLType.BF16}
FALLBACK = {GGMLType.TQ1_0: GGMLType.Q4_0, GGMLType.TQ2_0: GGMLType.Q4_0,
            GGMLType.Q4_K: GGMLType.Q5_0, GGMLType.Q5_K: GGMLType.Q5_1, GGMLType.Q6_K: GGMLType.Q8_0,
            GGMLType.Q4_0: GGMLType.F16, GGMLType.Q4_1: GGMLType.F16, GGMLType.Q5_0: GGMLType.F16,
            GGMLType.Q5_1: GGMLType.F16, GGMLType.Q8_0: GGMLType.F16,
            GGMLType.IQ4_NL: GGMLType.F16}
EMBED_TYPE = GGMLType.Q8_0
_F16_MAX = 65504.0


def gguf_name(hf_name: str) -> str:
    """`model.layers.3.mlp.up_proj.weight` -> `blk.3.ffn_up.weight` (ArkError when unknown)."""
    if hf_name in HF_GLOBAL:
        return HF_GLOBAL[hf_name]
    parts = hf_name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in HF_LAYER:
        return f"blk.{parts[2]}.{HF_LAYER[parts[3]]}"
    raise ArkError(f"tensor '{hf_name}' has no GGUF name in the llama / minicpm / qwen layouts",
                   hint="the checkpoint holds a tensor llama.cpp's architectures do not have")


def fits(qtype: GGMLType, shape: tuple[int, ...]) -> bool:
    """Whether rows of `shape` (last dim) split into whole `qtype` blocks."""
    return shape[-1] % BLOCK[qtype][0] == 0


def fit_type(qtype: GGMLType, shape: tuple[int, ...]) -> tuple[GGMLType, list[GGMLType]]:
    """(`qtype` or its first fallback whose block divides the row, the types passed over)."""
    skipped = []
    while not fits(qtype, shape):
        skipped.append(qtype)
        qtype = FALLBACK[qtype]
    return qtype, skipped


@dataclass
class TensorPlan:
    """One GGUF tensor. shape: Hugging Face order ([out, in]); source: where the bytes come from
    ("float": a float tensor converted to `qtype`, "packed": block bytes of a gguf-* linear,
    "source": the float source checkpoint's tensor converted to `qtype`, "data": `data` as
    given); permute_heads: q/k heads for llama.cpp's row permutation."""

    hf_name: str
    name: str
    shape: tuple[int, ...]
    qtype: GGMLType
    source: str
    permute_heads: int | None = None
    data: np.ndarray | None = field(default=None, repr=False)

    @property
    def byte_shape(self) -> tuple[int, ...]:
        size, nbytes = BLOCK[self.qtype]
        return (*self.shape[:-1], self.shape[-1] // size * nbytes)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.byte_shape))


def _to_float(ckpt: Checkpoint, name: str) -> np.ndarray:
    return ckpt.weights.get(name).float().numpy()


def tensor_bytes(ckpt: Checkpoint, plan: TensorPlan, source: Checkpoint | None = None
                 ) -> np.ndarray:
    """The tensor's data for `GGUFWriter.write_tensor_data`: float32 / float16 arrays in the
    plan's shape, or uint8 `[rows, row_bytes]` for block and BF16 types. `source`: the float
    checkpoint "source" plans read from."""
    if plan.source == "data":
        return np.ascontiguousarray(plan.data, dtype=np.float32)
    if plan.source == "packed":
        raw = ckpt.weights.get(plan.hf_name).numpy().view(np.uint8).reshape(plan.byte_shape)
        if plan.permute_heads:
            raw = permute_qk(raw, plan.permute_heads)
        return np.ascontiguousarray(raw)
    x = _to_float(source if plan.source == "source" else ckpt, plan.hf_name)
    if tuple(x.shape) != tuple(plan.shape):
        raise ArkError(f"'{plan.hf_name}' has shape {list(x.shape)} in the float source, "
                       f"{list(plan.shape)} in the quantised folder",
                       hint="give the float checkpoint the folder was quantised from")
    if plan.permute_heads:
        x = permute_qk(x, plan.permute_heads)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if plan.qtype is GGMLType.F32:
        return x
    if plan.qtype is GGMLType.F16:
        peak = float(np.abs(x).max(initial=0.0))
        if peak > _F16_MAX:
            raise ArkError(f"tensor '{plan.hf_name}' has values up to {peak:.4g}, beyond "
                           f"float16's range ({_F16_MAX})",
                           hint="build with --quant bf16 or --quant f32 (or a quantised type)")
        return x.astype(np.float16)
    raw = np.frombuffer(quantize_gguf(x, plan.qtype), dtype=np.uint8)
    return raw.reshape(plan.byte_shape)


def qk_heads(spec: ArchSpec, hf_name: str, config) -> int | None:
    """Heads to permute q/k rows (weights and biases) by, for llama.cpp's NORM RoPE archs."""
    if not spec.permuted_qk:
        return None
    if ".self_attn.q_proj." in hf_name:
        return config.num_attention_heads
    if ".self_attn.k_proj." in hf_name:
        return config.num_key_value_heads
    return None
