"""A GGUF file read as a float checkpoint tensor by tensor, without importing it.

    ckpt = open_gguf_lazily(Path("model.gguf"))   # Checkpoint; no file written
    w = ckpt.weights.get("model.layers.0.mlp.down_proj.weight")   # float32, dequantised now

`open_checkpoint` imports a GGUF once into the cache as a float32 Hugging Face folder
(frontend/cache.py): right for models that are loaded whole, but an 8B model's import is 32 GB
of disk. What streams a model block by block (pipeline/streamed_reference.py) only needs each
tensor when its block runs: `GGUFWeights.get` dequantises that tensor from the memory-mapped file
in the import's HF layout (frontend/gguf_model.py: same names, shapes and q/k un-permutation), so
the values equal the imported folder's. The tokenizer is not built (the caller brings prompts).
"""

from __future__ import annotations

from pathlib import Path

import torch

from arkinfer import models

from . import gguf_model
from .gguf_reader import GGUFFile
from .model_folder import Checkpoint
from .safetensors_io import LazyWeights, TensorInfo


class GGUFWeights(LazyWeights):
    """LazyWeights over a GGUF file instead of safetensors shards (names, shapes, `in` as
    there); `get` returns float32 tensors dequantised on demand ([out, in], the HF layout)."""

    def __init__(self, gguf: GGUFFile, plans: list) -> None:  # no safetensors header to read
        self.gguf = gguf
        self._plans = {p.hf_name: p for p in plans}
        self.infos = {p.hf_name: TensorInfo(p.hf_name, gguf.path, "F32", tuple(p.shape),
                                            4 * int(torch.Size(p.shape).numel()))
                      for p in plans}
        self._handles = {}  # what stream.release_maps clears (nothing is cached here)

    def get(self, name: str) -> torch.Tensor:
        data = gguf_model.hf_tensor(self.gguf, self._plans[name])
        return torch.from_numpy(data if data.flags.writeable else data.copy())


def open_gguf_lazily(path: Path) -> Checkpoint:
    """A Checkpoint over the GGUF file `path` whose weights dequantise on `get` (module
    docstring); config as the import writes it, no tokenizer, no generation config."""
    gguf = GGUFFile(Path(path))
    spec = gguf_model.spec_from_gguf(gguf)
    plans = gguf_model.plan_tensors(gguf, spec)
    raw = gguf_model.build_config(gguf, spec, "float32")
    config = models.parse_config(raw, f"{path} (GGUF metadata)")
    return Checkpoint(Path(path), raw, config, GGUFWeights(gguf, plans), {}, None)
