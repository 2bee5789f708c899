"""The bytes of llama.cpp's two imatrix files (the data model and its use: `quant/imatrix.py`).

Both as the llama.cpp vendored by llama-cpp-python 0.3.36 writes and reads them:
tools/imatrix/imatrix.cpp (`save_imatrix`, `save_imatrix_legacy`), common/imatrix-loader.cpp
(`common_imatrix_load`, used by llama-imatrix --in-file and llama-quantize --imatrix).

GGUF (llama-imatrix's default output), little-endian, version 3:

    "GGUF"  u32 version  u64 n_tensors  u64 n_kv
    n_kv    x (string key, u32 value type, value)        string = u64 length + UTF-8 bytes
    n_tensors x (string name, u32 n_dims, n_dims x u64 ne, u32 ggml type, u64 offset)
    padding to general.alignment (32), then every tensor's data, each padded to 32 bytes

  metadata: general.type = "imatrix"; imatrix.datasets = [string] (the calibration files);
  imatrix.chunk_count: u32 (chunks processed); imatrix.chunk_size: u32 (tokens per chunk).
  tensors, per weight `<name>` in sorted order: `<name>.in_sum2` F32 ne = [n_in, n_mat] (Σ x²
  of every input column over the counted tokens, one row per expert) and `<name>.counts` F32
  ne = [1, n_mat] (tokens counted). ggml reads the padded size of every tensor, the last one
  included, so the file ends with the last tensor's padding.

Legacy .dat (`--output-format dat`), little-endian:

    i32 n_entries; per entry: i32 name length, name, i32 ncall, i32 nval, nval x f32
    then optionally: i32 chunk_count, i32 dataset length, dataset name

  where each value is (Σ x² / count) · ncall and ncall = ceil(count / chunk_size): the sums are
  kept as a mean square times a call count, so llama-quantize divides them by ncall.

`decode` returns (entries {name: (sums float64 [n_mat, n_in], counts float64 [n_mat])},
metadata); the metadata dict has datasets, chunk_count, chunk_size and legacy.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from .weight import QuantError


class ImatrixError(QuantError):
    """A file is not a llama.cpp importance matrix, or does not fit the model it is used on."""


GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32
F32 = 0  # ggml type
T_U32, T_STRING, T_ARRAY = 4, 8, 9  # gguf value types
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_GGML_SIZES = {0: 4, 1: 2, 24: 1, 25: 2, 26: 4, 27: 8, 28: 8, 30: 2}  # F32 F16 I8..F64 BF16
SUMS, COUNTS = ".in_sum2", ".counts"

Entries = dict[str, tuple[np.ndarray, np.ndarray]]


# ------------------------------------------------------------------------------------ GGUF
def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _pad(n: int) -> int:
    return -n % ALIGNMENT


def encode_gguf(entries: Entries, datasets: list[str], chunk_count: int, chunk_size: int) -> bytes:
    """The GGUF imatrix file of `entries` (byte layout in the module docstring)."""
    kv = [_string("general.type") + struct.pack("<I", T_STRING) + _string("imatrix"),
          _string("imatrix.datasets") + struct.pack("<IIQ", T_ARRAY, T_STRING, len(datasets))
          + b"".join(_string(d) for d in datasets),
          _string("imatrix.chunk_count") + struct.pack("<II", T_U32, chunk_count),
          _string("imatrix.chunk_size") + struct.pack("<II", T_U32, chunk_size)]
    infos, blobs, offset = [], [], 0
    for name in sorted(entries):
        sums, counts = entries[name]
        n_mat, n_in = sums.shape
        for suffix, data, ne in ((SUMS, sums, (n_in, n_mat)), (COUNTS, counts, (1, n_mat))):
            raw = np.ascontiguousarray(data, dtype="<f4").tobytes()
            infos.append(_string(name + suffix) + struct.pack("<I", 2) + struct.pack("<2Q", *ne)
                         + struct.pack("<IQ", F32, offset))
            blobs.append(raw + b"\0" * _pad(len(raw)))
            offset += len(blobs[-1])
    head = GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(infos), len(kv)) + b"".join(kv) \
        + b"".join(infos)
    return head + b"\0" * _pad(len(head)) + b"".join(blobs)


class _Cursor:
    """Bounds-checked little-endian reads from `data`; running past the end is an ImatrixError."""

    def __init__(self, data: bytes, where: str) -> None:
        self.data, self.pos, self.where = data, 0, where

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ImatrixError(f"{self.where} is truncated or damaged: {n} bytes wanted at byte "
                               f"{self.pos} of {len(self.data)}",
                               "write the imatrix again (llama-imatrix or --save-imatrix)")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def count(self, fmt: str, item_bytes: int) -> int:
        n = self.unpack(fmt)
        if n < 0 or n * item_bytes > len(self.data) - self.pos:
            raise ImatrixError(f"{self.where} claims {n} items at byte {self.pos}, more than the "
                               f"{len(self.data)}-byte file holds", "the file is damaged")
        return n

    def string(self) -> str:
        raw = self.take(self.count("<Q", 1))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ImatrixError(f"{self.where} holds a name that is not UTF-8 at byte {self.pos}",
                               "the file is damaged") from None

    def value(self, vtype: int, depth: int = 0):
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == T_STRING:
            return self.string()
        if vtype == T_ARRAY and depth < 2:
            item = self.unpack("<I")
            return [self.value(item, depth + 1) for _ in range(self.count("<Q", 1))]
        raise ImatrixError(f"{self.where} has a metadata value of unknown type {vtype} at byte "
                           f"{self.pos}", "the file is damaged or not a GGUF file")


def decode_gguf(data: bytes, where: str) -> tuple[Entries, dict]:
    """Entries and metadata of a GGUF imatrix (as common_imatrix_load reads it: pairs of
    `<name>.in_sum2` / `<name>.counts` F32 tensors; counts rounded to integers)."""
    cur = _Cursor(data, where)
    cur.take(4)
    version = cur.unpack("<I")
    if version not in (2, 3):
        raise ImatrixError(f"{where} is GGUF version {version}; imatrix files are version 3",
                           "write it with a current llama-imatrix")
    n_tensors, n_kv = cur.count("<Q", 8), cur.count("<Q", 8)
    meta = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.unpack("<I"))
    kind = meta.get("general.type")
    tensors = {}
    for _ in range(n_tensors):
        name = cur.string()
        ne = [cur.unpack("<Q") for _ in range(cur.count("<I", 8))]
        tensors[name] = (ne, cur.unpack("<I"), cur.unpack("<Q"))
    sums_names = sorted(n[:-len(SUMS)] for n in tensors if n.endswith(SUMS))
    if kind != "imatrix" and (kind is not None or not sums_names):
        what = (f"a GGUF model (general.architecture={meta['general.architecture']})"
                if "general.architecture" in meta else f"a GGUF file of general.type={kind!r}")
        raise ImatrixError(f"{where} is {what}, not an importance matrix",
                           "give an imatrix file (llama-imatrix -o imatrix.gguf, or arkinfer "
                           "quantize --save-imatrix)")
    align = meta.get("general.alignment", ALIGNMENT)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise ImatrixError(f"{where} has general.alignment={align!r}; GGUF needs a power of two",
                           "the file is damaged")
    base = cur.pos + (-cur.pos % align)
    counts_names = sorted(n[:-len(COUNTS)] for n in tensors if n.endswith(COUNTS))
    if sums_names != counts_names:
        odd = sorted(set(sums_names) ^ set(counts_names))
        raise ImatrixError(f"{where}: {len(odd)} weight(s) have in_sum2 without counts or the "
                           f"reverse, e.g. {odd[:3]}", "the file is damaged")

    def read(name: str) -> np.ndarray:
        ne, ggml_type, offset = tensors[name]
        if ggml_type != F32:
            raise ImatrixError(f"{where}: tensor {name!r} has ggml type {ggml_type}; in_sum2 and "
                               "counts must be F32 (0)", "the file is damaged")
        n = math.prod(ne)
        raw = _Cursor(data, where)
        raw.pos = base + offset
        return np.frombuffer(raw.take(4 * n), dtype="<f4").astype(np.float64)

    entries: Entries = {}
    for name in sums_names:
        sums, counts = read(name + SUMS), np.rint(read(name + COUNTS))
        if counts.size == 0 or sums.size % counts.size:
            raise ImatrixError(f"{where}: {name} has {sums.size} sums for {counts.size} counts; "
                               "the sums must be whole rows, one per count", "the file is damaged")
        entries[name] = (sums.reshape(counts.size, -1), counts)
    datasets = meta.get("imatrix.datasets", [])
    return entries, {"datasets": [str(d) for d in datasets] if isinstance(datasets, list) else [],
                     "chunk_count": int(meta.get("imatrix.chunk_count", 0)),
                     "chunk_size": int(meta.get("imatrix.chunk_size", 0)), "legacy": False,
                     "has_metadata": all(k in meta for k in ("imatrix.datasets",
                                                             "imatrix.chunk_count",
                                                             "imatrix.chunk_size"))}


# ---------------------------------------------------------------------------------- legacy
def encode_dat(entries: Entries, datasets: list[str], chunk_count: int, chunk_size: int) -> bytes:
    """The legacy .dat file (save_imatrix_legacy): per entry (Σx² / count) · ncall with
    ncall = ceil(max count / chunk_size) (1 when chunk_size is 0); a row with no tokens is
    stored as 1 · ncall, as llama.cpp does."""
    out = [struct.pack("<i", len(entries))]
    for name in sorted(entries):
        sums, counts = entries[name]
        top = float(counts.max()) if counts.size else 0.0
        ncall = max(1, math.ceil(top / chunk_size)) if chunk_size > 0 else 1
        per_row = np.where(counts > 0, counts, 1.0)[:, None]
        values = np.where(counts[:, None] > 0, sums / per_row, 1.0) * ncall
        raw = name.encode("utf-8")
        out.append(struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall, values.size)
                   + np.ascontiguousarray(values, dtype="<f4").tobytes())
    dataset = (datasets[-1] if datasets else "").encode("utf-8")
    out.append(struct.pack("<ii", chunk_count, len(dataset)) + dataset)
    return b"".join(out)


def decode_dat(data: bytes, where: str) -> tuple[Entries, dict]:
    """Entries of a legacy .dat imatrix as (stored values [1, nval], [ncall]); an ncall of 0
    becomes 1 so that values / count is what llama-quantize uses in both cases."""
    cur = _Cursor(data, where)
    n_entries = cur.count("<i", 12)
    if n_entries < 1:
        raise ImatrixError(f"{where} has no entries", "the file is empty or damaged")
    entries: Entries = {}
    for _ in range(n_entries):
        name = cur.take(cur.count("<i", 1)).decode("utf-8", errors="replace")
        ncall = cur.unpack("<i")
        nval = cur.count("<i", 4)
        if nval < 1:
            raise ImatrixError(f"{where}: entry {name!r} has {nval} values", "the file is damaged")
        values = np.frombuffer(cur.take(4 * nval), dtype="<f4").astype(np.float64)
        entries[name] = (values[None, :], np.array([float(ncall if ncall > 0 else 1)]))
    chunk_count, datasets = 0, []
    if len(data) - cur.pos >= 4:
        chunk_count = cur.unpack("<i")
        if len(data) - cur.pos >= 4:
            n = cur.unpack("<i")
            if 0 < n <= len(data) - cur.pos:
                datasets.append(cur.take(n).decode("utf-8", errors="replace"))
    return entries, {"datasets": datasets, "chunk_count": chunk_count, "chunk_size": 0,
                     "legacy": True, "has_metadata": True}
