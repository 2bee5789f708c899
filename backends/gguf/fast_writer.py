"""A GGUFWriter whose long metadata arrays (a tokenizer's 49K tokens, scores, types, merges) are
packed in bulk: gguf-py packs them element by element in Python (~1.3 s of SmolLM2's 3 s lower).

    writer = FastArrayWriter(path, arch)      # same API and bytes as gguf.GGUFWriter

Arrays of strings become one join of `u64 length + utf-8 bytes`; arrays of numbers or bools one
numpy `tobytes()` in little-endian order; anything else (big-endian files, short or mixed arrays)
goes through gguf-py's own `_pack_val`. tests/backends/gguf/test_gguf_fast_writer.py compares the
bytes with gguf-py's packing.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import gguf
import numpy as np
from gguf import GGUFEndian, GGUFValueType

BULK_MIN = 64   # shorter arrays are packed by gguf-py itself
NUMPY_TYPES = {GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.UINT16: "<u2",
               GGUFValueType.INT16: "<i2", GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
               GGUFValueType.FLOAT32: "<f4", GGUFValueType.UINT64: "<u8",
               GGUFValueType.INT64: "<i8", GGUFValueType.FLOAT64: "<f8", GGUFValueType.BOOL: "?"}
PYTHON_TYPES = {GGUFValueType.STRING: (str, bytes, bytearray), GGUFValueType.FLOAT32: (float,),
                GGUFValueType.BOOL: (bool,), GGUFValueType.INT32: (int,)}


def _element_type(val: Sequence, sub_type: GGUFValueType | None) -> GGUFValueType | None:
    """gguf-py's element type of `val` (sub_type, else the first item's), or None when the items
    are of mixed Python types (gguf-py then raises; we let it)."""
    if sub_type is not None:
        return sub_type
    ltype = GGUFValueType.get_type(val[0])
    kinds = PYTHON_TYPES.get(ltype)
    if kinds is None:
        return None
    # bool is an int: an int array must hold no bool and a bool array only bools
    if ltype == GGUFValueType.INT32:
        ok = all(type(v) is int for v in val)
    else:
        ok = all(isinstance(v, kinds) for v in val)
    return ltype if ok else None


class FastArrayWriter(gguf.GGUFWriter):
    def _pack_val(self, val: Any, vtype: GGUFValueType, add_vtype: bool,
                  sub_type: GGUFValueType | None = None) -> bytes:
        if (vtype != GGUFValueType.ARRAY or self.endianess != GGUFEndian.LITTLE
                or isinstance(val, bytes) or not isinstance(val, Sequence) or len(val) < BULK_MIN):
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        ltype = _element_type(val, sub_type)
        if ltype == GGUFValueType.STRING:
            encoded = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in val]
            body = b"".join(struct.pack("<Q", len(e)) + e for e in encoded)
        elif ltype in NUMPY_TYPES:
            body = np.asarray(val, dtype=NUMPY_TYPES[ltype]).tobytes()
        else:
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        head = struct.pack("<I", vtype) if add_vtype else b""
        return head + struct.pack("<IQ", ltype, len(val)) + body
