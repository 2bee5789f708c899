"""llama.cpp's own block quantisers (`ggml_quantize_chunk`), called in the libggml that
llama-cpp-python ships, for the types ArkInfer does not port to numpy (the K-quants).

    data = ggml_quantize(rows, 12)   # float32 [n_rows, n] -> Q4_K bytes, or None

With no importance matrix ggml runs `quantize_row_*_ref`, exactly what `llama-quantize` writes
without `--imatrix`. The library is found next to the `llama_cpp` package without importing it
(the import loads libllama too); None when llama-cpp-python is not installed or the library
lacks the symbol, and callers then use ArkInfer's own quantiser.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import numpy as np

from .ggml_types import BLOCK, GGMLType

_LIB: list = []   # [the loaded libggml-base or None], filled on first use


def ggml_library():
    """libggml-base from llama-cpp-python's package folder (ctypes), or None."""
    if not _LIB:
        lib = None
        spec = importlib.util.find_spec("llama_cpp")
        for folder in (spec.submodule_search_locations or []) if spec else []:
            for sub in ("lib", "."):
                path = Path(folder, sub, "libggml-base.so")
                if lib is None and path.exists():
                    try:
                        lib = ctypes.CDLL(str(path))
                        fn = lib.ggml_quantize_chunk
                    except (OSError, AttributeError):
                        lib = None
                        continue
                    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                   ctypes.c_void_p]
                    fn.restype = ctypes.c_size_t
        _LIB.append(lib)
    return _LIB[0]


def ggml_quantize(rows: np.ndarray, ggml_type: int,
                  importance: np.ndarray | None = None) -> bytes | None:
    """ggml's quantiser for `ggml_type` over float32 `rows` [n_rows, n] (n a multiple of the
    type's block) -> the tensor's bytes; `importance` [n] is llama.cpp's imatrix (None: the
    reference quantiser). None when libggml is unavailable."""
    lib = ggml_library()
    if lib is None:
        return None
    x = np.ascontiguousarray(rows, dtype=np.float32)
    n_rows, n = x.shape
    per_block, nbytes = BLOCK[GGMLType(ggml_type)]
    out = np.empty(n_rows * (n // per_block) * nbytes, np.uint8)
    imat = None if importance is None else np.ascontiguousarray(importance, dtype=np.float32)
    written = lib.ggml_quantize_chunk(int(ggml_type), x.ctypes.data, out.ctypes.data, 0, n_rows,
                                      n, None if imat is None else imat.ctypes.data)
    if written != out.size:
        raise RuntimeError(f"ggml_quantize_chunk wrote {written} bytes, expected {out.size}")
    return out.tobytes()
