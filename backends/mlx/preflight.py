"""What the MLX backend can build, checked from config.json alone before any weight is read.

- Architectures: those with a model file in mlx-lm (`mlx_lm/models/<model_type>.py`) that the
  artifact targets: `minicpm` (MiniCPM4 / 4.1), `llama`, `mistral`, `qwen2`, `qwen3`.
- Quantised builds: the formats the backend declares (`Capabilities`): storage format `mlx` (RTN
  presets: mlx4, mlx8), or `gptq` / `awq` (calibrated codes, repacked to MLX affine with fp32
  scales and biases, exactly). Bits 2/3/4/8 and group sizes 32/64/128 (MLX's affine modes, the
  `mlx` format's constraints); no act-order (MLX has no g_idx).
- Every linear the recipe quantises must fit MLX's shape rules (`MLX.shape_refusal`: the group
  size divides in_features, in_features*bits a multiple of 32). A layer that does not is a
  plan-time `TargetError` naming it, never a silent float fallback.

`compat_notes` lists what unmodified mlx-lm cannot express of the model (found by running mlx-lm
0.32.2: tests/backends/mlx/test_mlx_artifact.py); the manifest carries them.
"""

from __future__ import annotations

import re
from typing import Any

from arkinfer.backend import Capabilities, get_backend
from arkinfer.errors import TargetError
from arkinfer.lowering.linears import linear_shapes
from arkinfer.lowering.recipe_check import check_declared
from arkinfer.quant.formats import get_format

MODEL_TYPES = ("minicpm", "llama", "mistral", "qwen2", "qwen3")


def check_recipe(recipe: Any, caps: Capabilities) -> None:
    """Raise TargetError unless MLX affine can hold the recipe's codes (format, bits, group)."""
    mlx = get_format("mlx").constraints
    check_declared(recipe, caps, "mlx", stores="MLX affine",
                   hint="use --quant mlx4, mlx8, gptq or awq (4 or 8 bits)")
    if recipe.bits not in mlx.bits:
        raise TargetError(f"{recipe.bits}-bit codes have no MLX affine mode (bits {mlx.bits})",
                          hint="quantise with 4 or 8 bits")
    if recipe.group_size not in mlx.group_sizes:
        raise TargetError(f"group_size={recipe.group_size} is not an MLX affine group size "
                          f"(allowed {mlx.group_sizes})",
                          hint="quantise with a group size of 32, 64 or 128")


def check_shapes(raw_config: dict[str, Any], recipe: Any) -> None:
    """Raise TargetError naming the first linear MLX affine cannot take, and every pattern."""
    fmt = get_format("mlx")
    bad: list[tuple[str, str]] = []
    for name, (out, inp) in linear_shapes(raw_config).items():
        if recipe.skips(name):
            continue
        why = fmt.shape_refusal(out, inp, bits=recipe.bits, group_size=recipe.group_size)
        if why is not None:
            bad.append((f"{name} [{out}x{inp}]", why))
    if bad:
        pattern = sorted({re.sub(r"\.\d+\.", ".*.", layer.split(" ")[0]) for layer, _ in bad})
        ok = [g for g in fmt.constraints.group_sizes
              if all(fmt.shape_refusal(o, i, bits=recipe.bits, group_size=g) is None
                     for n, (o, i) in linear_shapes(raw_config).items() if not recipe.skips(n))]
        raise TargetError(f"mlx affine cannot take layer '{bad[0][0]}': {bad[0][1]} "
                          f"({len(bad)} layers fail: {', '.join(pattern)})",
                          hint=(f"use a group size of {' or '.join(map(str, ok))}" if ok else
                                "skip those layers in the recipe (they stay in float)"))


def compat_notes(raw_config: dict[str, Any]) -> list[str]:
    """What unmodified mlx-lm (0.32.2, transformers 5.x) does differently with this model."""
    if raw_config.get("model_type") != "minicpm":
        return []
    notes = []
    if raw_config.get("sparse_config"):
        notes.append("mlx-lm's minicpm model runs attention dense: it ignores sparse_config "
                     "(InfLLM v2 runs in ArkInfer's MLX runtime only)")
    scaling = raw_config.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) == "longrope":
        same = scaling.get("long_factor") == scaling.get("short_factor")
        notes.append("mlx-lm's SuScaledRoPE always applies long_factor; ArkInfer switches to it "
                     "past original_max_position_embeddings" +
                     (" (the lists are equal here, so both agree)" if same else
                      " (the lists differ here: mlx-lm is wrong on short contexts)"))
        notes.append("mlx_lm.load() fails in transformers >= 5 while loading the tokenizer: "
                     "transformers has no 'minicpm' config class, and its generic config reads "
                     "max_position_embeddings before setting it when rope_scaling is longrope "
                     "(AttributeError). Workaround: mlx_lm.load(path, tokenizer_config="
                     "{'config': transformers.PreTrainedConfig()}); the model itself loads")
    if raw_config.get("tie_word_embeddings"):
        notes.append("tied embeddings written as an explicit lm_head.weight (config: "
                     "tie_word_embeddings=false): mlx-lm cannot load a tied minicpm folder (its "
                     "sanitize adds lm_head.weight: 'parameters not in model'), and its tied "
                     "path would skip the logit scale hidden_size/dim_model_base")
    heads = int(raw_config["num_attention_heads"])
    head_dim = raw_config.get("head_dim")
    if head_dim and int(head_dim) != int(raw_config["hidden_size"]) // heads:
        notes.append(f"head_dim={head_dim} differs from hidden_size/heads: mlx-lm's minicpm "
                     "model assumes hidden_size/heads and will not load these weights")
    return notes


def preflight(raw_config: dict[str, Any], recipe: Any, target: Any, dtype: str) -> list[str]:
    """Raise TargetError when the MLX artifact cannot be built; else the notes to report."""
    # the declaration from the registry: backend.py imports this module, so this one does not
    # import backend.py
    caps = get_backend("mlx").capabilities
    model_type = raw_config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise TargetError(f"model_type {model_type!r} has no MLX model here (supported: "
                          f"{', '.join(MODEL_TYPES)})",
                          hint="pick another backend with --backend (`arkinfer targets show "
                          "TARGET` lists them)")
    if target is not None:
        target.check("mlx", recipe.format if recipe is not None else None, None)
    if recipe is None:
        if dtype not in caps.dtypes:
            raise TargetError(f"dtype {dtype!r} is not an MLX float type ({', '.join(caps.dtypes)})",
                              hint="build with --quant f16, bf16 or f32")
    else:
        check_recipe(recipe, caps)
        check_shapes(raw_config, recipe)
    return compat_notes(raw_config)
