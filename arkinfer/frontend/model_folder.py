"""Open a Hugging Face model folder lazily: config, safetensors headers, tokenizer and generation
config, checked against each other before any tensor data is read.

    ckpt = open_checkpoint("./model")        # Checkpoint: path, raw_config, config, weights, ...

A folder holds config.json, `*.safetensors` (optionally sharded with
model.safetensors.index.json), tokenizer.json + tokenizer_config.json and generation_config.json.
Nothing from the folder is executed and nothing is unpickled. Building the reference model from
an opened folder is `checkpoint.load_model` (float, or quantised through `quant.load`), one layer
above this module, which `quant.load` imports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arkinfer import models
from arkinfer.errors import CheckpointError, ConfigError
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
