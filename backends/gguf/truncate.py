"""A GGUF model's first N blocks as a GGUF of its own: the `self:N` draft of speculative decoding
(LayerSkip-style early exit: the target's blocks 0..N-1, then its final norm and LM head; no new
weights, no training).

    path = truncated_gguf(Path("artifact/model.gguf"), 2)
    # -> <cache>/drafts/<sha256 of model.gguf, 16 hex>-self2.gguf, written once, then reused

What changes and what does not:

    {arch}.block_count              N (same value type)
    {arch}.* arrays of L values     the first N (llama.cpp's per-layer hyper-parameters, e.g.
                                    head_count on OpenELM, must have exactly block_count values)
    every other key                 the same type and value; strings and string arrays as their
                                    raw bytes (no UTF-8 round trip), floats as the stored float32
    blk.{i}.* tensors, i < N        copied raw: the quantised blocks as stored, same type, shape
    blk.{i}.* tensors, i >= N       dropped (llama.cpp refuses a file with tensors it does not load)
    every other tensor              copied raw (token_embd, output_norm, output, rope_factors_*)

`{arch}.residual_scale` (MiniCPM: scale_depth / sqrt(L)) keeps the target's L: each block must add
what it adds inside the full model, or the first blocks would compute other hidden states.
The file goes to the ArkInfer cache (`cache_dir_path()`, $ARKINFER_CACHE), never next to the
artifact, through a temporary file renamed into place (a reader never sees half a file).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import gguf
from gguf import GGUFValueType

from arkinfer.errors import ArkError, GGUFError
from arkinfer.frontend.cache import cache_dir_path, content_key, locked

from .fast_writer import FastArrayWriter

BLOCK = re.compile(r"^blk\.(\d+)\.")
DRAFTS = "drafts"  # the cache's subfolder


def block_count(reader: gguf.GGUFReader, where: Path) -> tuple[str, int]:
    """(architecture, {arch}.block_count) of an open GGUF; GGUFError when either is missing."""
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise GGUFError(f"{where} has no general.architecture key",
                        hint="rebuild the artifact (arkinfer build ... --backend gguf)")
    arch = bytes(arch_field.parts[-1]).decode("utf-8")
    count = reader.fields.get(f"{arch}.block_count")
    if count is None:
        raise GGUFError(f"{where} has no {arch}.block_count key",
                        hint="rebuild the artifact (arkinfer build ... --backend gguf)")
    return arch, int(count.parts[-1][0])


def _raw_value(field: Any) -> Any:
    """The value of a reader field for GGUFWriter.add_key_value: strings as bytes, arrays as
    lists (of bytes for string arrays), scalars as Python numbers of the stored value."""
    kind = field.types[0]
    if kind == GGUFValueType.STRING:
        return bytes(field.parts[-1])
    if kind == GGUFValueType.ARRAY and field.types[-1] == GGUFValueType.STRING:
        return [bytes(field.parts[i]) for i in field.data]
    if kind == GGUFValueType.ARRAY and field.types[-1] == GGUFValueType.ARRAY:
        raise GGUFError(f"metadata key {field.name} is an array of arrays, which gguf-py cannot "
                        "copy", hint="use another draft (--draft lookup)")
    return field.contents()


def write_first_blocks(source: Path, dest: Path, layers: int) -> None:
    """Write to `dest` the GGUF of `source`'s blocks 0..layers-1 (the module docstring's table)."""
    reader = gguf.GGUFReader(source)
    arch, total = block_count(reader, source)
    if not 1 <= layers < total:
        raise ArkError(f"{source} has {total} blocks; a truncated copy keeps 1..{total - 1}, "
                       f"not {layers}", hint=f"pass 1..{total - 1}")
    writer = FastArrayWriter(str(dest), arch, endianess=reader.endianess)
    writer.data_alignment = reader.alignment  # general.alignment itself is copied below
    for name, field in reader.fields.items():
        # GGUF.* are the header's counts; GGUFWriter writes general.architecture itself, first
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == GGUFValueType.ARRAY else None
        value = _raw_value(field)
        if name == f"{arch}.block_count":
            value = layers
        elif name.startswith(f"{arch}.") and sub_type is not None and len(value) == total:
            value = value[:layers]
        writer.add_key_value(name, value, kind, sub_type=sub_type)
    kept = [t for t in reader.tensors
            if (m := BLOCK.match(t.name)) is None or int(m.group(1)) < layers]
    for tensor in kept:
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype,
                               tensor.data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in kept:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()


def truncated_gguf(source: Path, layers: int, cache: Path | None = None) -> Path:
    """The cached GGUF of `source`'s first `layers` blocks, written now when absent. The name
    carries a SHA-256 of `source`'s bytes, so a rebuilt artifact never reuses a stale draft.
    `cache`: the folder to use instead of `cache_dir_path() / "drafts"`."""
    folder = cache if cache is not None else cache_dir_path() / DRAFTS
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / f"{content_key(source)}-self{layers}.gguf"
    with locked(folder, dest.name):
        if dest.is_file():
            return dest
        # the lock keeps other writers out, so one temporary name per process is enough
        tmp = folder / f".{dest.name}.{os.getpid()}.tmp"
        try:
            write_first_blocks(source, tmp, layers)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
    return dest
