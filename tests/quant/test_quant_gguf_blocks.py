"""GGUF block types against two independent references: the `gguf` package's numpy quantisers
and dequantisers, and llama.cpp's own C code (`quantize_row_*_ref` / `dequantize_row_*` in the
libggml-base shipped with llama-cpp-python, called through ctypes)."""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from arkinfer.quant import QuantizedWeight, quantize_rtn
from arkinfer.quant.formats import FormatError, get_format
from arkinfer.quant.formats.gguf_blocks import (
    BLOCK,
    GGMLType,
    dequantize_gguf,
    quantize_gguf,
)

gguf = pytest.importorskip("gguf")
QT = gguf.GGMLQuantizationType
TYPES = [GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1,
         GGMLType.TQ1_0, GGMLType.TQ2_0]
C_NAMES = {GGMLType.Q8_0: "q8_0", GGMLType.Q4_0: "q4_0", GGMLType.Q4_1: "q4_1",
           GGMLType.TQ1_0: "tq1_0", GGMLType.TQ2_0: "tq2_0"}
FORMAT_OF = {"gguf-q4_0": GGMLType.Q4_0, "gguf-q4_1": GGMLType.Q4_1, "gguf-q8_0": GGMLType.Q8_0,
             "gguf-tq1_0": GGMLType.TQ1_0, "gguf-tq2_0": GGMLType.TQ2_0}


def _ggml():
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        pytest.skip("llama-cpp-python is not installed (the [gguf] extra)")
    path = Path(spec.origin).parent / "lib" / "libggml-base.so"
    if not path.exists():
        pytest.skip(f"llama-cpp-python ships no {path.name} here")
    return ctypes.CDLL(str(path))


def _c_call(lib, name: str, src: np.ndarray, dst: np.ndarray, n: int) -> None:
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn(src.ctypes.data, dst.ctypes.data, n)


def _awkward_rows() -> np.ndarray:
    """Random rows plus the edge cases: an all-zero block, ties, a lone extreme, nan-free."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 512)).astype(np.float32)
    x[0, :256] = 0.0
    x[1] = np.round(x[1] * 4) / 4
    x[2, 7] = 40.0
    x[3] = np.abs(x[3])
    x[4, :32] = -np.abs(x[4, :32])
    x[5] *= 1e-6
    return x


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_quantize_bytes_identical_to_gguf_package(qtype: GGMLType) -> None:
    x = _awkward_rows()
    ours = quantize_gguf(x, qtype)
    ref = gguf.quants.quantize(x, QT(int(qtype)))
    assert ours == ref.tobytes()
    back = gguf.quants.dequantize(np.frombuffer(ours, ref.dtype).reshape(ref.shape),
                                  QT(int(qtype)))
    assert np.array_equal(dequantize_gguf(ours, qtype, x.shape[1]), back)


@pytest.mark.llamacpp
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_quantize_bytes_identical_to_llama_cpp(qtype: GGMLType) -> None:
    lib, x = _ggml(), _awkward_rows().reshape(-1)
    size, nbytes = BLOCK[qtype]
    out = np.zeros(x.size // size * nbytes, np.uint8)
    if qtype is GGMLType.F16:
        _c_call(lib, "ggml_fp32_to_fp16_row", x, out, x.size)
    elif qtype is GGMLType.BF16:
        _c_call(lib, "ggml_fp32_to_bf16_row_ref", x, out, x.size)
    else:
        _c_call(lib, f"quantize_row_{C_NAMES[qtype]}_ref", x, out, x.size)
    assert quantize_gguf(x, qtype) == out.tobytes()


@pytest.mark.llamacpp
@pytest.mark.parametrize("name", sorted(FORMAT_OF))
def test_llama_cpp_dequantises_our_blocks_to_our_values(name: str) -> None:
    """Blocks packed from a canonical weight: llama.cpp, the gguf package and our numpy
    dequantisation agree bit for bit; for all but Q4_1 that is the canonical value itself."""
    lib, fmt, qtype = _ggml(), get_format(name), FORMAT_OF[name]
    torch.manual_seed(4)
    w = torch.randn(16, 512) * 0.02
    if qtype in (GGMLType.TQ1_0, GGMLType.TQ2_0):
        from arkinfer.quant import quantize_ternary
        qw = quantize_ternary(w, "row", scale_dtype=torch.float16)
    else:
        bits, sym = (8, True) if qtype is GGMLType.Q8_0 else (4, qtype is GGMLType.Q4_0)
        qw = quantize_rtn(w, bits, 32, sym, scale_dtype=torch.float16)
    blocks = fmt.pack(qw)["weight"]
    ours = fmt.dequantize({"weight": blocks}, 16, 512)
    c_out = np.zeros(16 * 512, np.float32)
    _c_call(lib, f"dequantize_row_{C_NAMES[qtype]}", np.ascontiguousarray(blocks), c_out,
            c_out.size)
    assert np.array_equal(c_out.reshape(16, 512), ours)
    assert np.array_equal(gguf.quants.dequantize(blocks, QT(int(qtype))), ours)
    canonical = qw.dequantize().numpy()
    if qtype is GGMLType.Q4_1:  # m = fp16(-scale * zero)
        assert np.abs(ours - canonical).max() <= np.abs(canonical).max() * 2.0**-10
    else:
        assert np.array_equal(ours, canonical)


@pytest.mark.parametrize("name", ["gguf-q4_0", "gguf-q8_0", "gguf-tq2_0", "gguf-tq1_0"])
def test_unpack_of_ggml_written_blocks_is_exact(name: str) -> None:
    """Blocks quantised by ggml itself (Q4_0 with its negative d = max / -8) unpack to a
    canonical weight whose dequantisation equals ggml's and which packs back to the same bytes."""
    fmt, qtype = get_format(name), FORMAT_OF[name]
    raw = np.frombuffer(quantize_gguf(_awkward_rows(), qtype), np.uint8).reshape(6, -1)
    qw = fmt.unpack({"weight": raw}, 6, 512)
    assert np.array_equal(qw.dequantize().numpy(), gguf.quants.dequantize(raw, QT(int(qtype))))
    assert np.array_equal(fmt.pack(qw)["weight"], raw)
    if name == "gguf-q4_0":
        assert (qw.scales < 0).any()


def test_q4_1_foreign_blocks_are_refused() -> None:
    raw = np.frombuffer(quantize_gguf(_awkward_rows(), GGMLType.Q4_1), np.uint8).reshape(6, -1)
    with pytest.raises(FormatError, match="no canonical form"):
        get_format("gguf-q4_1").unpack({"weight": raw}, 6, 512)


def test_q4_0_rounds_fp16_scale_first() -> None:
    """A canonical weight whose scales are not fp16 is refused; cast_scales() makes it fit."""
    qw = quantize_rtn(torch.randn(4, 64), 4, 32, True, name="blk.0.ffn_up")
    with pytest.raises(FormatError, match=r"'blk.0.ffn_up'.*not exactly representable in float16"):
        get_format("gguf-q4_0").pack(qw)
    fitted = qw.cast_scales(torch.float16)
    assert isinstance(fitted, QuantizedWeight)
    raw = get_format("gguf-q4_0").pack(fitted)["weight"]
    assert raw.shape == (4, 2 * 18)


@pytest.mark.parametrize("path", ["native", "torch"])
@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q8_0], ids=lambda t: t.name)
def test_fast_paths_identical_on_many_random_blocks(qtype: GGMLType, path: str) -> None:
    """quantize_gguf's fast paths for finite input (the C quantiser gguf_quant.c, and torch)
    against gguf-py on 32K blocks at many scales, with exact ties between the largest positive
    and negative values in some blocks, and Q8_0 values at and just below a rounding half."""
    from arkinfer.quant.formats import gguf_blocks

    fast = gguf_blocks._quantize_native if path == "native" else gguf_blocks._quantize_torch
    if path == "native" and gguf_blocks._native_library() is None:
        pytest.skip("no C compiler / AVX2 here: the C quantiser cannot be built")
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((1024, 1024)) * 10.0 ** rng.integers(-6, 4, (1024, 1))).astype(
        np.float32)
    x[::7, 5] = np.abs(x[::7]).max(axis=1)
    x[::7, 9] = -x[::7, 5]
    x[1, :9] = [127, 0.5, -0.5, 1.5, -2.5, 0.49999997, -0.49999997, 126.5, 3.4999998]
    assert fast(x.reshape(-1, 32), qtype) == gguf.quants.quantize(x, QT(int(qtype))).tobytes()


def test_native_quantiser_leaves_non_finite_blocks_to_the_numpy_path() -> None:
    """A NaN or inf anywhere: the C quantiser declines (None) and quantize_gguf's numpy code
    writes what ggml writes (gguf-py's bytes)."""
    from arkinfer.quant.formats import gguf_blocks

    if gguf_blocks._native_library() is None:
        pytest.skip("no C compiler / AVX2 here: the C quantiser cannot be built")
    x = _awkward_rows()
    x[2, 40], x[3, 100] = np.nan, np.inf
    for qtype in (GGMLType.Q4_0, GGMLType.Q8_0):
        assert gguf_blocks._quantize_native(x.reshape(-1, 32), qtype) is None
        with np.errstate(invalid="ignore"):   # NaN * 0 and NaN -> int, as in ggml
            ours, ref = quantize_gguf(x, qtype), gguf.quants.quantize(x, QT(int(qtype)))
        assert ours == ref.tobytes()
