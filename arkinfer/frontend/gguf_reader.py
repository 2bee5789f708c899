"""Open a GGUF file and read its metadata and tensors (memory-mapped, through gguf-py).

A GGUF file is a header of typed key/value metadata (`llama.block_count`, `tokenizer.ggml.tokens`,
...), a table of tensor descriptors and the tensor data. `gguf.GGUFReader` memory-maps the file, so
opening an 8B model reads only the header; tensor data is paged in when a tensor is dequantised.

Layouts: GGUF lists a tensor's dims fastest-first (`ne0` = columns), e.g. `[576, 49152]` for the
token embedding. The reader's numpy view is already row-major in the reversed order, so
`dequantize` returns `[49152, 576]` = Hugging Face's `[out, in]` / `[vocab, hidden]` with no
transpose.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from arkinfer.errors import GGUFError, NotAvailableError
from arkinfer.paths import require_regular_file

_MISSING = object()


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor descriptor: GGUF name, ggml type name (`Q4_1`, `F32`, ...) and numpy shape.

    `shape` is row-major (slowest dim first), i.e. already the Hugging Face order.
    """

    name: str
    type_name: str
    shape: tuple[int, ...]
    index: int


def _import_gguf():
    try:
        import gguf
    except ImportError:
        raise NotAvailableError("reading GGUF files needs the 'gguf' package",
                                hint="pip install 'arkinfer[gguf]'  (or: pip install gguf)") from None
    return gguf


class GGUFFile:
    """A GGUF file opened read-only: typed metadata access and dequantised tensors.

    >>> f = GGUFFile("SmolLM2-135M-Instruct.Q4_1.gguf"); f.arch, f.get_arch("block_count")
    ('llama', 30)
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        gguf = _import_gguf()
        if not self.path.exists():
            raise GGUFError(f"GGUF file {str(self.path)!r} does not exist",
                            hint="give the path of a .gguf file")
        require_regular_file(self.path, "GGUF file", GGUFError)
        size = self.path.stat().st_size
        check_header(self.path)
        try:
            self.reader = gguf.GGUFReader(self.path)
        except Exception as exc:  # noqa: BLE001 - gguf-py raises ValueError, IndexError, ...
            reason = _describe(exc)
            hint = (f"{self.path.name} is not a GGUF model; give the path of a .gguf file"
                    if "magic" in reason or "empty" in reason else _bad_file_hint(self.path))
            raise GGUFError(f"{self.path} is not a readable GGUF file ({size} bytes): {reason}",
                            hint=hint) from None
        self._check_extent(size)
        self.tensors: dict[str, GGUFTensor] = {
            t.name: GGUFTensor(t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)),
                               i)
            for i, t in enumerate(self.reader.tensors)
        }
        arch = self.get("general.architecture", None)
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path} has no 'general.architecture' metadata key",
                            hint="the file was not written by llama.cpp's converter or is damaged")
        self.arch: str = arch

    def _check_extent(self, size: int) -> None:
        """Every tensor's bytes lie inside the file (catches a truncated download), start at a
        multiple of `general.alignment` (default 32) from the data section, and no two tensors
        share a byte: llama.cpp's writer lays them out that way, so anything else is a damaged
        or crafted file whose tensors would alias each other's weights."""
        align, base = int(self.reader.alignment), int(self.reader.data_offset)
        for t in self.reader.tensors:
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size or t.data.nbytes != int(t.n_bytes):
                raise GGUFError(
                    f"{self.path} is truncated: tensor '{t.name}' ends at byte {end} but the file "
                    f"has {size} bytes", hint=_bad_file_hint(self.path))
            if (int(t.data_offset) - base) % align:
                raise GGUFError(
                    f"{self.path}: tensor '{t.name}' starts at data offset "
                    f"{int(t.data_offset) - base}, not a multiple of general.alignment={align}",
                    hint=_bad_file_hint(self.path))
        spans = sorted((int(t.data_offset), int(t.data_offset) + int(t.n_bytes), t.name)
                       for t in self.reader.tensors if int(t.n_bytes) > 0)
        for (start_a, end_a, name_a), (start_b, _end_b, name_b) in zip(spans, spans[1:]):
            if start_b < end_a:
                raise GGUFError(
                    f"{self.path}: tensors '{name_a}' (bytes {start_a}..{end_a - 1}) and "
                    f"'{name_b}' (from byte {start_b}) overlap", hint=_bad_file_hint(self.path))

    # -- metadata ------------------------------------------------------------------------------

    def keys(self) -> list[str]:
        return [k for k in self.reader.fields if not k.startswith("GGUF.")]

    def get(self, key: str, default: Any = _MISSING) -> Any:
        """Metadata value as Python data (str, int, float, bool or list); `default` when absent.

        Without a default, a missing key raises GGUFError naming it.
        """
        field = self.reader.fields.get(key)
        if field is None:
            if default is _MISSING:
                raise GGUFError(f"{self.path} lacks the metadata key '{key}'",
                                hint="the file is incomplete or was written by an unsupported "
                                "converter; re-convert it with a recent llama.cpp")
            return default
        try:
            value = field.contents()
        except Exception as exc:  # noqa: BLE001 - malformed field data
            raise GGUFError(f"metadata key '{key}' in {self.path} cannot be decoded: "
                            f"{_describe(exc)}", hint=_bad_file_hint(self.path)) from None
        if isinstance(value, np.generic):
            value = value.item()
        return value

    def get_arch(self, key: str, default: Any = _MISSING) -> Any:
        """`{arch}.{key}`, e.g. get_arch("block_count") reads `llama.block_count`."""
        return self.get(f"{self.arch}.{key}", default)

    def get_int(self, key: str, default: Any = _MISSING) -> int | None:
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, list):
            raise GGUFError(f"metadata key '{key}' in {self.path} holds a per-layer list "
                            f"({value[:4]}...), which ArkInfer does not support",
                            hint="only models with the same value in every layer can be imported")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise GGUFError(f"metadata key '{key}' in {self.path} must be an integer, got {value!r}",
                            hint=_bad_file_hint(self.path))
        return int(value)

    def get_float(self, key: str, default: Any = _MISSING) -> float | None:
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GGUFError(f"metadata key '{key}' in {self.path} must be a number, got {value!r}",
                            hint=_bad_file_hint(self.path))
        return float32_clean(float(value))

    # -- tensors -------------------------------------------------------------------------------

    def dequantize(self, name: str) -> np.ndarray:
        """Tensor `name` as float32, row-major, Hugging Face order (e.g. `[out, in]`).

        Raises GGUFError for a ggml type gguf-py cannot dequantise.
        """
        from gguf.quants import dequantize

        info = self.tensors[name]
        raw = self.reader.tensors[info.index]
        try:
            data = dequantize(raw.data, raw.tensor_type)
        except NotImplementedError:
            raise GGUFError(f"tensor '{name}' in {self.path} uses ggml type {info.type_name}, "
                            "which gguf-py cannot dequantise",
                            hint="re-quantise the model to a common type (Q8_0, Q4_K_M, F16) with "
                            "llama-quantize, or import the original checkpoint") from None
        data = np.asarray(data, dtype=np.float32).reshape(info.shape)
        return data


# GGUF value type -> bytes of one value (None: a string, 8-byte length + bytes; 9: an array).
_VALUE_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 8: None, 9: None, 10: 8, 11: 8,
                12: 8}
MAX_COUNT = 1 << 24  # tensors, metadata keys, array items (a 256 K vocabulary uses 2^18)
MAX_DIMS = 4  # GGML_MAX_DIMS


def check_header(path: Path) -> None:
    """Walk the GGUF header and check every count and length against the bytes left in the file
    (and MAX_COUNT / MAX_DIMS) before gguf-py parses it: gguf-py trusts them, so a claimed array
    length of 2^62 would allocate until MemoryError. Only lengths are read, nothing is kept.

    Layout (little-endian): "GGUF", u32 version, u64 tensor_count, u64 kv_count; kv_count x
    (string key, u32 type, value); tensor_count x (string name, u32 n_dims, n_dims x u64,
    u32 type, u64 offset). A string is a u64 length + bytes; an array a u32 type, u64 count,
    values.
    """
    size = path.stat().st_size
    with open(path, "rb") as fh:
        def fail(what: str) -> GGUFError:
            return GGUFError(f"{path} is not a readable GGUF file ({size} bytes): {what} at byte "
                             f"{fh.tell()}", hint=_bad_file_hint(path))

        def read(fmt: str) -> int:
            raw = fh.read(struct.calcsize(fmt))
            if len(raw) < struct.calcsize(fmt):
                raise fail("it ends inside the header (truncated)")
            return struct.unpack("<" + fmt, raw)[0]

        def count(n: int, item_bytes: int, what: str) -> int:
            if n > MAX_COUNT or n * item_bytes > size - fh.tell():
                raise fail(f"{what} {n} does not fit in the file (limit {MAX_COUNT:,})")
            return n

        def skip_string(what: str) -> None:
            fh.seek(count(read("Q"), 1, f"{what} length"), 1)

        def skip_value(vtype: int, depth: int = 0) -> None:
            if vtype not in _VALUE_BYTES or depth > 2:
                raise fail(f"unknown or too deeply nested value type {vtype}")
            if vtype == 8:
                skip_string("string")
            elif vtype == 9:
                item = read("I")
                n = count(read("Q"), _VALUE_BYTES.get(item) or 8, "array length")
                if _VALUE_BYTES.get(item):
                    fh.seek(n * _VALUE_BYTES[item], 1)
                else:
                    for _ in range(n):
                        skip_value(item, depth + 1)
            else:
                fh.seek(_VALUE_BYTES[vtype], 1)

        if fh.read(4) != b"GGUF":
            return  # gguf-py reports the bad magic with its own message
        read("I")
        n_tensors, n_kv = read("Q"), read("Q")
        count(n_tensors, 24, "tensor count")
        for _ in range(count(n_kv, 13, "metadata key count")):
            skip_string("key")
            skip_value(read("I"))
        for _ in range(n_tensors):
            skip_string("tensor name")
            n_dims = read("I")
            if n_dims > MAX_DIMS:
                raise fail(f"a tensor with {n_dims} dimensions (GGUF allows {MAX_DIMS})")
            if math.prod(read("Q") for _ in range(n_dims)) > 8 * size:
                raise fail("a tensor with more elements than the file can hold")
            read("I"), read("Q")
        if fh.tell() > size:
            raise fail("the header runs past the end of the file")


def float32_clean(value: float) -> float:
    """Shortest decimal that round-trips a float32 (GGUF stores 1e-5 as 9.99999974e-06)."""
    return float(str(np.float32(value)))


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if "magic" in text.lower():
        return "it does not start with the GGUF magic bytes"
    if "mmap" in text.lower() and "empty" in text.lower():
        return "the file is empty"
    if "version" in text.lower():
        return f"unsupported GGUF version ({text})"
    return f"it is truncated or damaged (gguf-py: {type(exc).__name__}: {text})"


def _bad_file_hint(path: Path) -> str:
    return (f"check that {path.name} is a complete .gguf download (compare its size and checksum "
            "with the source), or re-convert the model with llama.cpp's convert_hf_to_gguf.py")
