"""Stream tensors into (sharded) safetensors files, one tensor in memory at a time.

Shapes and dtypes are known before any data is produced, so each file's header is written first
and tensors are appended as they are produced: peak memory is one tensor, not one shard.

File layout (safetensors): u64 little-endian header length N, N bytes of JSON header
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}` padded with spaces
to a multiple of 8, then the tensors' bytes back to back in header order.

Sharding follows Hugging Face: one `model.safetensors`, or `model-00001-of-0000N.safetensors` ...
plus `model.safetensors.index.json` (`{"metadata": {"total_size"}, "weight_map": {name: file}}`).
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

WeightDtype = Literal["f32", "bf16", "f16"]
# --dtype value -> (safetensors tag, bytes per element, config.json torch_dtype)
DTYPES: dict[str, tuple[str, int, str]] = {
    "f32": ("F32", 4, "float32"),
    "bf16": ("BF16", 2, "bfloat16"),
    "f16": ("F16", 2, "float16"),
}
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]

    def nbytes(self, dtype: str) -> int:
        return math.prod(self.shape) * DTYPES[dtype][1]


def plan_shards(specs: list[TensorSpec], dtype: str, max_shard_bytes: int) -> list[list[TensorSpec]]:
    """Split `specs` in order into shards of at most `max_shard_bytes` (a bigger tensor: alone)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        nbytes = spec.nbytes(dtype)
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes
    return shards


def shard_names(count: int) -> list[str]:
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def to_storage(data: np.ndarray, dtype: str) -> np.ndarray:
    """float32 array -> C-contiguous little-endian array in `dtype` (bf16 as int16 bit patterns,
    rounded to nearest even via torch), ready to be written with no further copy."""
    if dtype == "f32":
        return np.ascontiguousarray(data, dtype="<f4")
    if dtype == "f16":
        return np.ascontiguousarray(data.astype("<f2"))
    import torch

    t = torch.from_numpy(np.array(data, dtype=np.float32)).to(torch.bfloat16)  # copy: writable
    return np.ascontiguousarray(t.view(torch.int16).numpy(), dtype="<i2")


def _header(specs: list[TensorSpec], dtype: str, metadata: dict[str, str]) -> bytes:
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for spec in specs:
        end = offset + spec.nbytes(dtype)
        header[spec.name] = {"dtype": DTYPES[dtype][0], "shape": list(spec.shape),
                             "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def honour_umask(path: Path) -> None:
    """Give `path` the mode a plain `open(path, "w")` would: 0o666 minus the process umask.

    `safetensors.torch.save_file` (0.8) writes through a private temporary file and so leaves
    0600 behind, while every other file of a model folder or artifact gets the umask's 0644."""
    mask = os.umask(0o022)  # reading the umask means setting it; restored on the next line
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def save_safetensors(tensors: dict[str, Any], path: Path, metadata: dict[str, str] | None = None
                     ) -> None:
    """`safetensors.torch.save_file(tensors, path, metadata)` with the umask's permissions."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    honour_umask(Path(path))


def write_shards(folder: Path, specs: list[TensorSpec], produce: Callable[[TensorSpec], np.ndarray],
                 dtype: str, max_shard_bytes: int, metadata: dict[str, str] | None = None,
                 on_tensor: Callable[[TensorSpec], None] | None = None) -> list[str]:
    """Write every tensor of `specs` (in order) to `folder`; returns the file names written.

    `produce(spec)` returns the float32 array for one tensor, shaped `spec.shape`; `on_tensor` is
    called after each tensor is written. A shape mismatch raises ValueError (a programming error).
    """
    shards = plan_shards(specs, dtype, max_shard_bytes)
    names = shard_names(len(shards))
    meta = {"format": "pt", **(metadata or {})}
    weight_map: dict[str, str] = {}
    for file_name, shard in zip(names, shards, strict=True):
        with open(folder / file_name, "wb") as fh:
            fh.write(_header(shard, dtype, meta))
            for spec in shard:
                data = produce(spec)
                if tuple(data.shape) != spec.shape:
                    raise ValueError(f"{spec.name}: produced {data.shape}, planned {spec.shape}")
                fh.write(to_storage(data, dtype).reshape(-1).data)
                weight_map[spec.name] = file_name
                if on_tensor is not None:
                    on_tensor(spec)
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(s.nbytes(dtype) for s in specs)},
                 "weight_map": weight_map}
        (folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return names + ([INDEX_NAME] if len(shards) > 1 else [])

