"""Open a Hugging Face model folder and load its reference model strictly.

A folder holds config.json, `*.safetensors` (optionally sharded with
model.safetensors.index.json), tokenizer.json + tokenizer_config.json and generation_config.json.
Nothing from the folder is executed and nothing is unpickled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from arkinfer import models
from arkinfer.errors import CheckpointError, ConfigError
from arkinfer.frontend.safetensors_io import LazyWeights, weight_files
from arkinfer.frontend.tokenizer import TextTokenizer, load_tokenizer


@dataclass
class Checkpoint:
    """A checkpoint folder, opened lazily: no tensor data is read until `load_model`."""

    path: Path
    raw_config: dict[str, Any]
    config: Any  # LlamaConfig or subclass
    weights: LazyWeights
    generation_config: dict[str, Any]
    tokenizer: TextTokenizer | None

    @property
    def model_type(self) -> str:
        return self.config.model_type


def resolve_model_path(name: str) -> Path:
    """'demo' -> the embedded demo model; a .gguf file -> its cached import; else a folder."""
    if name == "demo":
        from arkinfer.frontend.demo import demo_model_path

        return demo_model_path()
    path = Path(name).expanduser()
    if not path.exists():
        raise CheckpointError(f"model path {str(path)!r} does not exist",
                              hint="give a Hugging Face model folder, or 'demo' for the embedded model")
    if path.is_file() and path.suffix == ".gguf":
        from arkinfer.frontend.cache import cached_import

        return cached_import(path)  # imported once into the cache, then reused
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a model folder",
                              hint="give the folder that holds config.json and *.safetensors")
    return path


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.exists():
        raise ConfigError(f"{folder} has no config.json",
                          hint="point at a Hugging Face model folder (config.json + *.safetensors)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}",
                          hint="fix the file or download it again") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a JSON object, found {type(raw).__name__}")
    return raw


def open_checkpoint(name: str | Path, with_tokenizer: bool = True) -> Checkpoint:
    """Read config, safetensors headers, tokenizer and generation config of a model folder."""
    folder = resolve_model_path(str(name))
    raw = read_config(folder)
    config = models.parse_config(raw, str(folder / "config.json"))
    weights = LazyWeights(weight_files(folder))
    gen_path = folder / "generation_config.json"
    generation = {}
    if gen_path.exists():
        try:
            generation = json.loads(gen_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{gen_path} is not valid JSON: {exc}") from None
    tokenizer = load_tokenizer(folder, generation) if with_tokenizer else None
    return Checkpoint(folder, raw, config, weights, generation, tokenizer)


def check_weights(expected: dict[str, tuple[int, ...]], weights: LazyWeights, source: Path) -> None:
    """Raise one CheckpointError listing every missing, unexpected and mis-shaped tensor."""
    missing = [n for n in expected if n not in weights]
    unexpected = [n for n in weights.names() if n not in expected
                  and not n.endswith("rotary_emb.inv_freq")]
    misshaped = [f"{n}: checkpoint {list(weights.shape(n))}, model expects {list(expected[n])}"
                 for n in expected if n in weights and weights.shape(n) != expected[n]]
    if not (missing or unexpected or misshaped):
        return
    lines = []
    for title, items in (("missing", missing), ("unexpected", unexpected),
                         ("wrong shape", misshaped)):
        if items:
            shown = items[:20] + ([f"... and {len(items) - 20} more"] if len(items) > 20 else [])
            lines.append(f"{title} ({len(items)}): " + "; ".join(shown))
    raise CheckpointError(f"weights in {source} do not match the {len(expected)}-tensor model "
                          "described by config.json:\n  " + "\n  ".join(lines),
                          hint="the config and the weights come from different models, or the "
                          "export was incomplete")


def load_model(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The reference model with the checkpoint's weights (strict), in `dtype`, in eval mode.

    A quantised checkpoint (config.json with `quantization_config`) is unpacked by its format's
    reference unpack into dequantised float weights."""
    if "quantization_config" in ckpt.raw_config:
        from arkinfer.quant.load import load_quantized_model

        return load_quantized_model(ckpt, dtype)
    with torch.device("meta"):
        model = models.build_model(ckpt.config)
    expected = models.module_for(ckpt.raw_config).expected_weights(model)
    check_weights(expected, ckpt.weights, ckpt.path)
    state = {name: ckpt.weights.get(name).to(dtype) for name in expected}
    model.load_state_dict(state, strict=False, assign=True)
    if ckpt.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()


def load(name: str | Path, dense: bool = False, dtype: torch.dtype = torch.float32,
         sparse_impl: str = "fast") -> tuple[Checkpoint, torch.nn.Module]:
    """Open and load in one call. On sparse-config (InfLLM v2) models `dense=True` forces dense
    attention and `sparse_impl` picks the "fast" CPU implementation or the literal "reference"."""
    ckpt = open_checkpoint(name)
    model = load_model(ckpt, dtype)
    if hasattr(model, "set_dense"):
        model.set_dense(dense)
        model.set_sparse_impl(sparse_impl)
    return ckpt, model
