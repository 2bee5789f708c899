"""Open a Hugging Face model folder and load its reference model strictly.

A folder holds config.json, `*.safetensors` (optionally sharded with
model.safetensors.index.json), tokenizer.json + tokenizer_config.json and generation_config.json.
Nothing from the folder is executed and nothing is unpickled.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from arkinfer import models
from arkinfer.errors import ArkError, CheckpointError, ConfigError
from arkinfer.frontend.safetensors_io import LazyWeights, weight_files
from arkinfer.frontend.tokenizer import TextTokenizer, load_tokenizer
from arkinfer.paths import read_json_object


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
    """config.json of `folder` as a dict (ConfigError when absent or malformed)."""
    path = folder / "config.json"
    if not path.exists() and not path.is_symlink():
        raise ConfigError(f"{folder} has no config.json",
                          hint="point at a Hugging Face model folder (config.json + *.safetensors)")
    return read_json_object(path, ConfigError)


def read_generation_config(folder: Path, vocab_size: int) -> dict[str, Any]:
    """generation_config.json ({} when absent); its token ids must lie inside the vocabulary."""
    path = folder / "generation_config.json"
    if not path.exists() and not path.is_symlink():
        return {}
    generation = read_json_object(path, ConfigError)
    from arkinfer.models.llama import token_id_problems

    problems = token_id_problems(generation, vocab_size)
    if problems:
        raise ConfigError(f"{path} is not valid: " + "; ".join(problems),
                          hint="compare it with the model's published generation_config.json")
    return generation


def open_checkpoint(name: str | Path, with_tokenizer: bool = True) -> Checkpoint:
    """Read config, safetensors headers, tokenizer and generation config of a model folder."""
    folder = resolve_model_path(str(name))
    raw = read_config(folder)
    config = models.parse_config(raw, str(folder / "config.json"))
    weights = LazyWeights(weight_files(folder))
    check_layers(config, weights, folder)  # before anything builds num_hidden_layers layers
    generation = read_generation_config(folder, config.vocab_size)
    tokenizer = load_tokenizer(folder, generation, config.vocab_size) if with_tokenizer else None
    return Checkpoint(folder, raw, config, weights, generation, tokenizer)


_LAYER = re.compile(r"model\.layers\.(\d+)\.")
# Every tensor of the float reference model (weights, norms, biases) is floating point; integer
# dtypes belong to quantised layouts (qweight, qzeros, g_idx), which quant/load.py reads instead.
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


def check_layers(config: Any, weights: LazyWeights, source: Path) -> None:
    """The weights hold exactly layers 0..num_hidden_layers-1 (`model.layers.N.*`) and a float
    embedding of [vocab_size, hidden_size].

    Called when a checkpoint is opened, before any model is built or traced, so a config
    claiming 4000 layers over a 2-layer checkpoint is refused at once instead of after building
    4000 layers."""
    found = {int(m.group(1)) for n in weights.names() if (m := _LAYER.match(n))}
    want = config.num_hidden_layers
    if found != set(range(want)):
        held = f"layers {min(found)}..{max(found)} ({len(found)} distinct)" if found else "no layers"
        raise CheckpointError(f"config.json of {source} declares num_hidden_layers={want} but its "
                              f"weights hold {held}",
                              hint="the config and the weights come from different models, or the "
                              "export was incomplete")
    embed = weights.infos.get("model.embed_tokens.weight")
    dims = (config.vocab_size, config.hidden_size)
    if embed is not None and embed.dtype in FLOAT_DTYPES and embed.shape != dims:
        raise CheckpointError(f"config.json of {source} declares vocab_size x hidden_size = "
                              f"{list(dims)} but model.embed_tokens.weight is {list(embed.shape)}",
                              hint="the config and the weights come from different models")


def check_memory(nbytes: int, what: str, error: type[ArkError] = CheckpointError,
                 hint: str = "free memory, use a machine with more RAM, or use a smaller or "
                 "quantised model") -> None:
    """Raise `error` when `nbytes` exceed the memory this machine has available now (psutil
    `available`: free plus reclaimable page cache), before anything is allocated."""
    import psutil

    available = int(psutil.virtual_memory().available)
    if nbytes > available:
        raise error(f"{what} needs {nbytes / 1024**3:.2f} GiB of memory but this machine has "
                    f"{available / 1024**3:.2f} GiB available", hint=hint)


def check_weights(expected: dict[str, tuple[int, ...]], weights: LazyWeights, source: Path) -> None:
    """Raise one CheckpointError listing every missing, unexpected, mis-shaped and non-float tensor."""
    missing = [n for n in expected if n not in weights]
    unexpected = [n for n in weights.names() if n not in expected
                  and not n.endswith("rotary_emb.inv_freq")]
    misshaped = [f"{n}: checkpoint {list(weights.shape(n))}, model expects {list(expected[n])}"
                 for n in expected if n in weights and weights.shape(n) != expected[n]]
    wrong_dtype = [f"{n}: checkpoint {weights.infos[n].dtype}, model expects a float dtype "
                   f"({'/'.join(FLOAT_DTYPES)})" for n in expected
                   if n in weights and weights.infos[n].dtype not in FLOAT_DTYPES]
    if not (missing or unexpected or misshaped or wrong_dtype):
        return
    lines = []
    for title, items in (("missing", missing), ("unexpected", unexpected),
                         ("wrong shape", misshaped), ("wrong dtype", wrong_dtype)):
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
    numel = sum(math.prod(shape) for shape in expected.values())
    check_memory(numel * torch.empty((), dtype=dtype).element_size(),
                 f"loading {ckpt.path} ({numel:,} parameters) in {dtype}")
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
