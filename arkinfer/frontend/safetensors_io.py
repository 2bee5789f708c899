"""Lazy, validated access to `*.safetensors` files (single or sharded).

Headers are parsed directly (8-byte little-endian length + JSON) so shapes and dtypes are known
without reading any tensor data; tensors are read through `safetensors.safe_open`, which
memory-maps the file, so an 8B checkpoint never has to fit in RAM at once.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from arkinfer.errors import CheckpointError
from arkinfer.paths import read_limited, require_regular_file, resolve_inside

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
    "U32": (torch.uint32, 4),  # MLX affine codes (quant/formats/mlx.py: weight uint32)
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}

INDEX_NAME = "model.safetensors.index.json"
_MAX_HEADER = 100 * 1024 * 1024

# An index lists every tensor once (~100 bytes each): the largest on the Hub are ~10 MB.
INDEX_MAX_BYTES = 64 << 20


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

    Checks, before any tensor is read (the same rules `safetensors.safe_open` applies, so a file
    that passes here also loads): the file is a regular file; the header length is sane; the
    header is a JSON object of `{"dtype", "shape", "data_offsets"}` objects (plus a string-to-
    string `__metadata__`); every byte range matches its dtype and shape; and the ranges tile
    the data section exactly, in order, without gaps or overlaps (a truncated download is
    caught here).
    """
    header, data_size = _load_header(file)
    infos = {name: _tensor_info(file, name, entry) for name, entry in header.items()
             if name != "__metadata__"}
    _check_layout(file, infos, data_size)
    return {name: info for name, (info, _) in infos.items()}


def read_metadata(file: Path) -> dict[str, str]:
    """The header's `__metadata__` (string to string; {} when absent), without the tensor checks."""
    header, _ = _load_header(file)
    return header.get("__metadata__", {})


def _load_header(file: Path) -> tuple[dict, int]:
    """(header JSON object with a valid `__metadata__`, bytes of the data section)."""
    require_regular_file(file, "safetensors file", CheckpointError)
    hint = "re-download or re-export the checkpoint"
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            raw_len = fh.read(8)
            if len(raw_len) < 8:
                raise CheckpointError(
                    f"{file} is not a safetensors file: it is only {size} bytes long", hint=hint)
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > min(_MAX_HEADER, size - 8):
                limit = (f"the limit of {_MAX_HEADER} bytes" if header_len > _MAX_HEADER
                         else f"the file size ({size} bytes)")
                raise CheckpointError(
                    f"{file} is not a valid safetensors file: header length {header_len} exceeds "
                    f"{limit}; the file is truncated or not safetensors", hint=hint)
            header = json.loads(fh.read(header_len))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        reason = "the JSON is nested too deeply" if isinstance(exc, RecursionError) else exc
        raise CheckpointError(f"cannot read safetensors header of {file}: {reason}",
                              hint=hint) from None
    if not isinstance(header, dict):
        raise CheckpointError(f"the safetensors header of {file} must be a JSON object, found "
                              f"{type(header).__name__}", hint=hint)
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CheckpointError(f"'__metadata__' in {file} must map strings to strings, got "
                              f"{_short(meta)}", hint=hint)
    return header, size - 8 - header_len


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor_info(file: Path, name: str, entry: object) -> tuple[TensorInfo, int]:
    """(TensorInfo, begin offset) of one header entry; CheckpointError naming file and tensor."""
    def bad(problem: str) -> CheckpointError:
        return CheckpointError(f"tensor '{name}' in {file}: {problem}",
                               hint="the file is corrupt; re-download or re-export the checkpoint")

    if not isinstance(entry, dict):
        raise bad(f"header entry must be an object with dtype, shape and data_offsets, got "
                  f"{_short(entry)}")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise CheckpointError(f"tensor '{name}' in {file} has unsupported dtype {_short(dtype)}",
                              hint=f"supported dtypes: {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise bad(f"shape must be a list of non-negative integers, got {_short(shape)}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_int(o) and o >= 0 for o in offsets) or offsets[0] > offsets[1]):
        raise bad(f"data_offsets must be [begin, end] with 0 <= begin <= end, got "
                  f"{_short(offsets)}")
    begin, end = offsets
    nbytes = math.prod(shape) * DTYPES[dtype][1]
    if end - begin != nbytes:
        raise bad(f"declares shape {shape} {dtype} ({nbytes} bytes) but data_offsets "
                  f"[{begin}, {end}] hold {end - begin} bytes")
    return TensorInfo(name, file, dtype, tuple(shape), nbytes), begin


def _check_layout(file: Path, infos: dict[str, tuple[TensorInfo, int]], data_size: int) -> None:
    """Tensors, sorted by offset, must tile [0, data_size) exactly (as safetensors requires)."""
    position = 0
    for info, begin in sorted(infos.values(), key=lambda item: (item[1], item[0].nbytes)):
        if begin != position:
            what = "overlaps the previous tensor" if begin < position else "leaves a gap before it"
            raise CheckpointError(
                f"tensor '{info.name}' in {file} starts at byte {begin} of the data section but "
                f"the previous tensor ends at {position}: it {what}",
                hint="the file is corrupt; re-download or re-export the checkpoint")
        position = begin + info.nbytes
        if position > data_size:
            raise CheckpointError(
                f"{file} is truncated: tensor '{info.name}' ends at byte {position} of the data "
                f"section but the file holds only {data_size} bytes of data",
                hint="the download or copy was interrupted; fetch the file again")
    if position != data_size:
        raise CheckpointError(f"{file} has {data_size - position} bytes after its last tensor",
                              hint="the file is corrupt; re-download or re-export the checkpoint")


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder (from the index when sharded).

    Every shard an index names must resolve inside `folder` (no absolute path, no `..`, no
    symlink out of it): weights are never read from elsewhere."""
    index = folder / INDEX_NAME
    if index.exists() or index.is_symlink():
        raw = read_limited(index, INDEX_NAME, INDEX_MAX_BYTES, CheckpointError)
        try:
            weight_map = json.loads(raw)["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, KeyError,
                TypeError) as exc:
            raise CheckpointError(f"{index} is malformed: {type(exc).__name__}: {exc}",
                                  hint="it must be JSON with a 'weight_map' object") from None
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: 'weight_map' must be a non-empty object of tensor "
                                  f"name -> file name, got {_short(weight_map)}",
                                  hint="re-download the index or re-export the checkpoint")
        files = sorted({resolve_inside(folder, f, f"weight_map entry {n!r} of {index}")
                        for n, f in weight_map.items()})
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
        try:
            handle = self._handles.get(info.file)
            if handle is None:
                handle = safe_open(str(info.file), framework="pt")
                self._handles[info.file] = handle
            return handle.get_tensor(name)  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError: the file changed
            raise CheckpointError(f"cannot read tensor '{name}' from {info.file}: {exc}",
                                  hint="the file changed or is damaged since it was opened; "
                                  "re-download or re-export the checkpoint") from None
