"""GGUF IQ4_NL: 4-bit codes indexing ggml's fixed non-uniform table, written from RTN and GPTQ.

References: gguf-py's numpy dequantiser (`gguf.quants.dequantize`, an implementation apart from
ArkInfer's) and llama.cpp's own quantiser (`ggml_quantize_chunk` in the libggml llama-cpp-python
ships, what llama-quantize writes without an imatrix). llama.cpp running IQ4_NL layers is
checked in tests/quant/test_quant_kquants.py (the mixed-type tiny model).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from arkinfer.quant import Kind, QuantizedWeight, quantize_rtn
from arkinfer.quant.calib.gptq import gptq_quantize
from arkinfer.quant.formats import FormatError, get_format
from arkinfer.quant.formats.ggml_native import ggml_library, ggml_quantize
from arkinfer.quant.formats.gguf_blocks import (
    KVALUES_IQ4NL,
    GGMLType,
    decode_q4,
    dequantize_gguf,
    encode_q4,
    quantize_gguf,
)
from arkinfer.quant.recipe import QuantRecipe
from arkinfer.quant.rtn import nearest_level
from arkinfer.quant.weight import QuantError

gguf = pytest.importorskip("gguf")
FMT = get_format("gguf-iq4_nl")
LEVELS = torch.tensor(KVALUES_IQ4NL, dtype=torch.float32)
needs_ggml = pytest.mark.skipif(ggml_library() is None,
                                reason="llama-cpp-python (its libggml) is not installed")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _gguf_py(raw: np.ndarray, rows: int) -> np.ndarray:
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.IQ4_NL).reshape(rows, -1)


def _heavy_tailed(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Student-t (3 degrees of freedom) weights: outliers as real LLM linears have them."""
    gen = np.random.default_rng(seed)
    return torch.from_numpy(gen.standard_t(3, (rows, cols)).astype(np.float32) * 0.02)


# ---------------------------------------------------------------------------- byte layout
def test_dequantize_matches_gguf_py_on_random_blocks():
    """Random block bytes (finite fp16 d): ours == gguf-py bit for bit; the codec inverts."""
    rng = np.random.default_rng(1)
    q = rng.integers(0, 16, (50, 32), dtype=np.uint8)
    d = rng.uniform(-0.1, 0.1, 50).astype(np.float16).astype(np.float32)
    raw = encode_q4(q, d)
    assert raw.shape == (50, 18)
    assert np.array_equal(dequantize_gguf(raw, GGMLType.IQ4_NL, 32), _gguf_py(raw, 50))
    q2, d2 = decode_q4(raw, with_min=False)
    assert np.array_equal(q2, q) and np.array_equal(d2, d)


@pytest.mark.parametrize("grid", ["mse", "ggml"])
def test_rtn_pack_dequantises_as_gguf_py_and_roundtrips(grid):
    w = _heavy_tailed(24, 320, 2)
    qw = quantize_rtn(w, 4, 32, True, scale_dtype=torch.float16, grid=grid, fmt=FMT)
    assert qw.kind is Kind.CODEBOOK and torch.equal(qw.levels, LEVELS)
    FMT.check(qw, "layer")
    raw = FMT.pack(qw)["weight"]
    assert np.array_equal(_gguf_py(raw, 24), qw.dequantize().numpy())
    assert FMT.unpack({"weight": raw}, 24, 320).equals(qw)
    assert FMT.nbytes(24, 320, bits=4, group_size=32, sym=True) == raw.size


def test_nearest_level_ties_to_the_upper_level_as_ggml():
    """ggml's best_index_iq4nl: below the table -> 0, above -> 15, a midpoint -> the upper."""
    x = torch.tensor([-500.0, -115.5, -115.6, 0.0, 6.9, 7.0, 113.0, 900.0])
    assert nearest_level(x, LEVELS).tolist() == [0, 1, 0, 8, 8, 9, 15, 15]


# ------------------------------------------------------------------------- llama.cpp's bytes
@needs_ggml
def test_llamacpp_blocks_unpack_and_repack_byte_exact():
    x = np.random.default_rng(3).standard_normal((16, 256)).astype(np.float32)
    raw = np.frombuffer(ggml_quantize(x, int(GGMLType.IQ4_NL)), np.uint8).reshape(16, -1)
    qw = FMT.unpack({"weight": raw}, 16, 256)
    assert np.array_equal(qw.dequantize().numpy(), _gguf_py(raw, 16))
    assert np.array_equal(FMT.pack(qw)["weight"], raw)
    assert quantize_gguf(x, GGMLType.IQ4_NL) == raw.tobytes()


@needs_ggml
@pytest.mark.parametrize("seed", [5, 6])
def test_rtn_error_matches_llamacpp_and_beats_q4_0(seed):
    """ArkInfer's RTN IQ4_NL (mse grid: llama.cpp's scale search) is within 0.1 % of llama.cpp's
    own IQ4_NL error (no imatrix), and below Q4_0's at the same 4.5 bits on heavy-tailed
    weights (the point of the non-uniform table)."""
    w = _heavy_tailed(128, 1024, seed)
    ours = quantize_rtn(w, 4, 32, True, scale_dtype=torch.float16, grid="mse", fmt=FMT)
    mse = float(((ours.dequantize() - w) ** 2).mean())
    raw = np.frombuffer(ggml_quantize(w.numpy(), int(GGMLType.IQ4_NL)), np.uint8)
    ref = float(((_gguf_py(raw.reshape(128, -1), 128) - w.numpy()) ** 2).mean())
    assert mse <= ref * 1.001, (mse, ref)
    q4_0 = quantize_rtn(w, 4, 32, True, scale_dtype=torch.float16, grid="mse", fmt="gguf-q4_0")
    assert mse < 0.95 * float(((q4_0.dequantize() - w) ** 2).mean())


# ------------------------------------------------------------------------------------- GPTQ
@pytest.mark.parametrize("static", [True, False])
def test_gptq_writes_table_codes_with_lower_output_error(static):
    """GPTQ into IQ4_NL (act-order with static groups, or natural order with each group's scale
    set when reached) gives a weight the format stores as it is, with a lower output error than
    RTN's on the same Hessian."""
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(1024, 256, generator=gen) * torch.linspace(0.2, 3, 256)
    h = 2 * x.T @ x / x.shape[0]
    w = _heavy_tailed(32, 256, 7)
    res = gptq_quantize(w, h, bits=4, group_size=32, sym=True, act_order=static,
                        static_groups=static, grid="mse", fmt=FMT, scale_dtype=torch.float16)
    qw = res.weight
    FMT.check(qw, "layer")
    assert np.array_equal(_gguf_py(FMT.pack(qw)["weight"], 32), qw.dequantize().numpy())
    rtn = quantize_rtn(w, 4, 32, True, grid="mse", fmt=FMT, scale_dtype=torch.float16)

    def out_err(q):
        return float(((x @ (q.dequantize() - w).T) ** 2).mean())

    assert out_err(qw) < out_err(rtn)


# --------------------------------------------------------------------------------- refusals
def test_refusals_name_the_problem():
    w = torch.randn(8, 64)
    uniform = quantize_rtn(w, 4, 32, True, scale_dtype=torch.float16, grid="mse")
    with pytest.raises(FormatError, match="kind=uniform is not storable"):
        FMT.check(uniform, "layer")
    table = quantize_rtn(w, 4, 32, True, scale_dtype=torch.float16, fmt=FMT)
    with pytest.raises(FormatError, match="kind=codebook is not storable"):
        get_format("gguf-q4_0").check(table, "layer")
    other = QuantizedWeight(table.codes, table.scales, table.zeros, 4, 32, True,
                            kind=Kind.CODEBOOK, levels=LEVELS + 0.5)
    with pytest.raises(FormatError, match="not the format's table"):
        FMT.check(other, "layer")
    with pytest.raises(QuantError, match="strictly ascending"):
        QuantizedWeight(table.codes, table.scales, table.zeros, 4, 32, True,
                        kind=Kind.CODEBOOK, levels=LEVELS.flip(0))
    with pytest.raises(QuantError, match="goes with kind=codebook"):
        QuantizedWeight(table.codes, table.scales, table.zeros, 4, 32, True, levels=LEVELS)


def test_recipes_take_iq4_nl_for_rtn_and_gptq_only():
    for calib in ("rtn", "gptq", "pgptq"):
        QuantRecipe(calib=calib, format="gguf-iq4_nl", group_size=32)
    with pytest.raises(QuantError, match="stores \\['codebook'\\] weights"):
        QuantRecipe(calib="awq", format="gguf-iq4_nl", group_size=32)
