"""config.json of an MLX artifact: the source's Hugging Face config as mlx-lm reads it.

    raw = artifact_config(source_raw, quantization, dtype="f16", untie_lm_head=False)

- The source's keys are kept (mlx-lm's ModelArgs take HF key names; ArkInfer's runtime reads
  the same file): rope_scaling (LongRoPE lists), the MiniCPM scales, sparse_config, ...
- `quantization_config` of the quantised folder (gptq / awq / arkinfer) is dropped: the
  artifact's tensors are MLX affine, described by mlx-lm's own key
      "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
                       "lm_head": false, ...}           # one false entry per linear kept float
  mlx-lm also copies it to "quantization_config"; the artifact does not, because transformers
  and ArkInfer read a `quantization_config` as an HF quantiser (`quant_method`).
- `torch_dtype` names the dtype of the float tensors.
- `untie_lm_head` (MiniCPM with tied embeddings): tie_word_embeddings=false, because the
  artifact carries lm_head.weight explicitly (mlx-lm's tied minicpm path drops the logit scale).
"""

from __future__ import annotations

import copy
from typing import Any

TORCH_DTYPE = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
ARKINFER_KEYS = ("quantization_config",)


def artifact_config(source_raw: dict[str, Any], quantization: dict[str, Any] | None,
                    float_dtype: str, untie_lm_head: bool = False) -> dict[str, Any]:
    """The artifact's config.json dict (see the module docstring)."""
    raw = copy.deepcopy(source_raw)
    for key in ARKINFER_KEYS:
        raw.pop(key, None)
    raw.pop("quantization", None)
    if quantization is not None:
        raw["quantization"] = dict(quantization)
    raw["torch_dtype"] = TORCH_DTYPE[float_dtype]
    if untie_lm_head:
        raw["tie_word_embeddings"] = False
    return raw


def quantization_of(raw: dict[str, Any]) -> tuple[int, int, dict[str, Any]] | None:
    """(bits, group_size, per-layer entries) of an artifact config's "quantization", or None.

    A per-layer entry is `false` (float) or a dict with its own "bits" / "group_size"."""
    q = raw.get("quantization")
    if not isinstance(q, dict):
        return None
    layers = {k: v for k, v in q.items() if k not in ("group_size", "bits", "mode")}
    return int(q["bits"]), int(q["group_size"]), layers
