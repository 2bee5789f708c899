"""Lazy, validated access to `*.safetensors` files (single or sharded).

Headers are parsed directly (8-byte little-endian length + JSON) so shapes and dtypes are known
without reading any tensor data; tensors are read through `safetensors.safe_open`, which
memory-maps the file, so an 8B checkpoint never has to fit in RAM at once.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from arkinfer.errors import CheckpointError

# safetensors dtype tag -> (torch dtype, bytes per element)
DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}

INDEX_NAME = "model.safetensors.index.json"
_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: file, dtype tag, shape and byte range inside the data section."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def read_header(file: Path) -> dict[str, TensorInfo]:
    """Parse and validate one safetensors header; raises CheckpointError on a broken file.

    Checks: header length is sane, header is JSON, every tensor's byte range matches its dtype and
    shape and lies inside the file (a truncated download is caught here, before any tensor is read).
    """
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            raw_len = fh.read(8)
            if len(raw_len) < 8:
                raise CheckpointError(
                    f"{file} is not a safetensors file: it is only {size} bytes long",
                    hint="re-download or re-export the checkpoint",
                )
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > min(_MAX_HEADER, size - 8):
                raise CheckpointError(
                    f"{file} is not a valid safetensors file: header length {header_len} exceeds "
                    f"the file size ({size} bytes); the file is truncated or not safetensors",
                    hint="re-download or re-export the checkpoint",
                )
            header = json.loads(fh.read(header_len))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read safetensors header of {file}: {exc}",
                              hint="re-download or re-export the checkpoint") from None
    data_size = size - 8 - header_len
    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        if dtype not in DTYPES:
            raise CheckpointError(f"tensor '{name}' in {file} has unsupported dtype {dtype}",
                                  hint=f"supported dtypes: {', '.join(DTYPES)}")
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * DTYPES[dtype][1]:
            raise CheckpointError(
                f"tensor '{name}' in {file} declares shape {list(shape)} {dtype} but "
                f"{end - begin} bytes", hint="the file is corrupt; re-export the checkpoint")
        if end > data_size:
            raise CheckpointError(
                f"{file} is truncated: tensor '{name}' ends at byte {end} of the data section "
                f"but the file holds only {data_size} bytes of data",
                hint="the download or copy was interrupted; fetch the file again")
        infos[name] = TensorInfo(name, file, dtype, shape, end - begin)
    return infos


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder (from the index when sharded)."""
    index = folder / INDEX_NAME
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index} is malformed: {exc}",
                                  hint="it must be JSON with a 'weight_map' object") from None
        files = sorted({folder / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise CheckpointError(f"{index} names shard(s) that are missing: {', '.join(missing)}",
                                  hint="download every shard listed in the index")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    pickled = sorted(p.name for p in folder.iterdir()
                     if p.suffix in (".bin", ".pt", ".pth", ".ckpt") and p.is_file())
    if pickled:
        raise CheckpointError(
            f"{folder} holds only pickled PyTorch weights ({', '.join(pickled)}); ArkInfer never "
            "unpickles files, because loading a pickle can run arbitrary code",
            hint="convert once on a machine you trust: python -c \"from transformers import "
            "AutoModelForCausalLM as M; M.from_pretrained('IN').save_pretrained('OUT', "
            "safe_serialization=True)\"",
        )
    raise CheckpointError(f"no *.safetensors weights in {folder}",
                          hint="point at a Hugging Face model folder, or import a .gguf with "
                          "'arkinfer import FILE.gguf OUT_DIR'")


class LazyWeights:
    """Name -> tensor mapping over one or more safetensors files; tensors load on access."""

    def __init__(self, files: list[Path]) -> None:
        self.infos: dict[str, TensorInfo] = {}
        for file in files:
            for name, info in read_header(file).items():
                if name in self.infos:
                    raise CheckpointError(
                        f"tensor '{name}' appears in both {self.infos[name].file.name} and "
                        f"{file.name}", hint="the shards overlap; re-export the checkpoint")
                self.infos[name] = info
        self._handles: dict[Path, object] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.infos

    def __len__(self) -> int:
        return len(self.infos)

    def names(self) -> list[str]:
        return list(self.infos)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.infos[name].shape

    def total_bytes(self) -> int:
        return sum(i.nbytes for i in self.infos.values())

    def get(self, name: str) -> torch.Tensor:
        """The tensor `name`, memory-mapped (copy it before modifying)."""
        from safetensors import safe_open

        info = self.infos[name]
        handle = self._handles.get(info.file)
        if handle is None:
            handle = safe_open(str(info.file), framework="pt")
            self._handles[info.file] = handle
        return handle.get_tensor(name)  # type: ignore[attr-defined]
