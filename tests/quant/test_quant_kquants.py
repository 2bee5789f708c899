"""GGUF Q5_0 / Q5_1 and the K-quants (Q4_K, Q5_K, Q6_K) written from calibrated codes (IQ4_NL:
test_quant_iq4_nl.py; it joins the llama.cpp end-to-end model here).

References: gguf-py's numpy dequantisers (`gguf.quants.dequantize`, an implementation apart from
ArkInfer's), llama.cpp's own quantiser (`ggml_quantize_chunk` in the libggml llama-cpp-python
ships) and llama.cpp itself loading a GGUF. Exactness: the canonical dequantisation of Q5_0,
Q4_K, Q5_K and Q6_K weights equals gguf-py's bit for bit (np.array_equal); Q5_1 differs by the
fp16 rounding of its bias m, as Q4_1 (tests/quant/test_quant_formats_roundtrip.py bounds it).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from arkinfer.quant import QuantizedWeight, quantize_rtn
from arkinfer.quant.calib.gptq import gptq_quantize
from arkinfer.quant.formats import FormatError, get_format
from arkinfer.quant.formats.ggml_native import ggml_library, ggml_quantize
from arkinfer.quant.formats.gguf_blocks import (
    BLOCK,
    GGMLType,
    dequantize_gguf,
    quantize_gguf,
)
from arkinfer.quant.recipe import QuantRecipe
from arkinfer.quant.weight import QuantError

gguf = pytest.importorskip("gguf")

# name, bits, group size, sym, ggml type
KQUANTS = [("gguf-q4_k", 4, 32, False, "Q4_K"), ("gguf-q5_k", 5, 32, False, "Q5_K"),
           ("gguf-q6_k", 6, 16, True, "Q6_K")]
EXACT = KQUANTS + [("gguf-q5_0", 5, 32, True, "Q5_0")]
needs_ggml = pytest.mark.skipif(ggml_library() is None,
                                reason="llama-cpp-python (its libggml) is not installed")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _scale_dtype(fmt):
    return torch.float16 if fmt.constraints.scale_dtype == "float16" else None


def _gguf_py(raw: np.ndarray, qtype: str, rows: int) -> np.ndarray:
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(rows, -1)


# ---------------------------------------------------------------------------- byte layouts
@pytest.mark.parametrize("qtype", ["Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"])
def test_dequantize_matches_gguf_py_on_random_blocks(qtype):
    """Random block bytes (finite fp16 fields): ours == gguf-py bit for bit; codecs invert."""
    t = GGMLType[qtype]
    per, nbytes = BLOCK[t]
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, (50, nbytes), dtype=np.uint8)
    halves = {"Q5_0": [0], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}[qtype]
    for off in halves:
        raw[:, off:off + 2] = (rng.standard_normal((50, 1)) * 0.01).astype(np.float16).view(
            np.uint8)
    ours = dequantize_gguf(raw, t, per)
    assert np.array_equal(ours, _gguf_py(raw, qtype, 50))


@pytest.mark.parametrize("qtype", ["Q5_0", "Q5_1"])
def test_quantize_gguf_q5_equals_gguf_py(qtype):
    x = np.random.default_rng(2).standard_normal((16, 256)).astype(np.float32)
    ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType[qtype]).tobytes()
    assert quantize_gguf(x, GGMLType[qtype]) == ref


# ------------------------------------------------------------ canonical weights <-> blocks
@pytest.mark.parametrize("name,bits,group,sym,qtype", EXACT)
@pytest.mark.parametrize("grid", ["mse", "minmax"])
def test_pack_dequantises_as_gguf_py_and_roundtrips(name, bits, group, sym, qtype, grid):
    fmt = get_format(name)
    w = torch.randn(48, 512) * 0.03
    qw = quantize_rtn(w, bits, group, sym, grid=grid, fmt=fmt, scale_dtype=_scale_dtype(fmt))
    assert (qw.mins is not None) == fmt.constraints.float_mins
    packed = fmt.pack(qw)
    assert packed["weight"].shape == (48, 512 // BLOCK[GGMLType[qtype]][0]
                                      * BLOCK[GGMLType[qtype]][1])
    assert fmt.nbytes(48, 512, bits=bits, group_size=group, sym=sym) == packed["weight"].nbytes
    assert np.array_equal(_gguf_py(packed["weight"], qtype, 48), qw.dequantize().numpy())
    assert np.array_equal(fmt.dequantize(packed, 48, 512), qw.dequantize().numpy())
    assert fmt.unpack(packed, 48, 512).equals(qw)


def test_q5_1_pack_within_fp16_bias_rounding():
    fmt = get_format("gguf-q5_1")
    w = torch.randn(16, 256) * 0.03
    qw = quantize_rtn(w, 5, 32, False, grid="mse", fmt=fmt, scale_dtype=torch.float16)
    packed = fmt.pack(qw)
    ref = qw.dequantize().numpy()
    bias = (qw.scales * qw.zeros.float())[:, qw.group_index()].numpy()
    assert (np.abs(_gguf_py(packed["weight"], "Q5_1", 16) - ref)
            <= np.abs(bias) * 2.0**-11 + 1e-7).all()
    assert fmt.unpack(packed, 16, 256).equals(qw)


@needs_ggml
@pytest.mark.parametrize("name,bits,group,sym,qtype", KQUANTS)
def test_llamacpp_blocks_unpack_and_repack_byte_exact(name, bits, group, sym, qtype):
    """llama.cpp's own K-quant bytes: unpack gives a canonical weight whose dequantisation is
    gguf-py's, and pack writes the same bytes back (the sub-scale factorisation finds ggml's d)."""
    fmt = get_format(name)
    x = np.random.default_rng(3).standard_normal((32, 512)).astype(np.float32)
    raw = np.frombuffer(ggml_quantize(x, int(GGMLType[qtype])), np.uint8).reshape(32, -1)
    qw = fmt.unpack({"weight": raw}, 32, 512)
    assert np.array_equal(qw.dequantize().numpy(), _gguf_py(raw, qtype, 32))
    assert np.array_equal(fmt.pack(qw)["weight"], raw)


def test_snap_params_gives_d_times_subscale():
    """Snapped values are fp16 d x integer sub-scales per super-block, as the layout stores."""
    rng = np.random.default_rng(4)
    s = rng.uniform(0.001, 0.2, (3, 32)).astype(np.float32)  # 2 super-blocks of 16 (Q6_K)
    snapped, _ = get_format("gguf-q6_k").snap_params(s)
    for blk in snapped.reshape(-1, 16):
        d = np.float32(np.float16(blk[np.abs(blk).argmax()] / -128))
        k = np.rint(blk / d)
        assert ((k >= -128) & (k <= 127)).all() and np.array_equal(np.float32(d) * k, blk)
    m = rng.uniform(0, 0.5, (3, 16)).astype(np.float32)
    s4, m4 = get_format("gguf-q4_k").snap_params(s[:, :16], m)
    for vals in (s4.reshape(-1, 8), m4.reshape(-1, 8)):
        for blk in vals:
            d = np.float32(np.float16(blk.max() / 63))
            assert np.array_equal(d * np.rint(blk / d), blk) and np.rint(blk / d).max() <= 63


# ---------------------------------------------------------------------------------- refusals
def test_refusals():
    q4k = get_format("gguf-q4_k")
    w = torch.randn(8, 288)
    with pytest.raises(FormatError, match=r"not whole super-blocks"):
        quantize_rtn(w, 4, 32, False, fmt=q4k)
    with pytest.raises(QuantError, match=r"multiple of gguf-q6_k's 256-column super-block"):
        gptq_quantize(w, torch.eye(288), bits=6, group_size=16, fmt="gguf-q6_k")
    assert "in_features=288 is not a multiple of 256" in q4k.shape_refusal(8, 288, bits=4,
                                                                            group_size=32)
    # scales that are no fp16 d x 6-bit sc
    good = quantize_rtn(torch.randn(4, 256), 4, 32, False, fmt=q4k)
    bad = QuantizedWeight(good.codes, good.scales * 1.001, good.zeros, 4, 32, False,
                          mins=good.mins)
    with pytest.raises(FormatError, match=r"scales of super-block 0 of row 0 .* not fp16 d x"):
        q4k.check(bad, "blk")
    bad_min = QuantizedWeight(good.codes, good.scales, good.zeros, 4, 32, False,
                              mins=good.mins + 1e-4)
    with pytest.raises(FormatError, match=r"the mins of super-block"):
        q4k.pack(bad_min)
    q6k = get_format("gguf-q6_k")
    six = quantize_rtn(torch.randn(4, 256), 6, 16, True, fmt=q6k)
    with pytest.raises(FormatError, match=r"not fp16 d x int8 sc"):
        q6k.check(QuantizedWeight(six.codes, six.scales + 1e-5, six.zeros, 6, 16, True))
    # integer zero points into a float-min format, float mins into any other format
    plain = quantize_rtn(torch.randn(4, 256), 4, 32, False)
    with pytest.raises(FormatError, match=r"stores a float min per group"):
        q4k.check(plain)
    with pytest.raises(FormatError, match=r"has float mins"):
        get_format("gguf-q4_1").check(good)
    with pytest.raises(QuantError, match=r"pass sym=False"):
        quantize_rtn(torch.randn(4, 256), 4, 32, True, fmt=q4k)
    # 5- and 6-bit weights in the bit-packed formats: refused by their constraints
    five = quantize_rtn(torch.randn(8, 256), 5, 32, True)
    for other in ("gptq", "marlin", "awq", "mlx", "gguf-q4_0"):
        with pytest.raises(FormatError, match=r"bits=5 is not supported"):
            get_format(other).check(five)


def test_recipes_accept_kquants():
    assert QuantRecipe("gptq", "gguf-q6_k", bits=6, group_size=16).format == "gguf-q6_k"
    assert QuantRecipe("rtn", "gguf-q4_k", 4, 32, sym=False).bits == 4
    assert QuantRecipe("rtn", "gguf-q5_0", 5, 32).bits == 5
    with pytest.raises(QuantError, match=r"sym=True not in \(False,\)"):
        QuantRecipe("rtn", "gguf-q4_k", 4, 32, sym=True)


# ---------------------------------------------------------------------------------- quality
@needs_ggml
@pytest.mark.parametrize("name,bits,group,sym,qtype", KQUANTS)
def test_rtn_error_no_worse_than_llamacpp(name, bits, group, sym, qtype):
    """ArkInfer's RTN K-quant (grid mse, snapped sub-scales) against llama.cpp's own quantiser
    for the same type (quantize_row_*_ref, what llama-quantize writes without an imatrix)."""
    fmt = get_format(name)
    w = torch.randn(128, 1024, generator=torch.Generator().manual_seed(5))
    ours = quantize_rtn(w, bits, group, sym, grid="mse", fmt=fmt)
    mse = float(((ours.dequantize() - w) ** 2).mean())
    raw = np.frombuffer(ggml_quantize(w.numpy(), int(fmt.ggml_type)), np.uint8).reshape(128, -1)
    ref = float(((_gguf_py(raw, qtype, 128) - w.numpy()) ** 2).mean())
    assert mse <= ref, (mse, ref)


@pytest.mark.parametrize("name,bits,group,sym,qtype", EXACT)
@pytest.mark.parametrize("static", [True, False])
def test_gptq_writes_representable_codes(name, bits, group, sym, qtype, static):
    """GPTQ with a K-quant (static groups, or per super-block when reached) gives a weight the
    format stores as it is, with a lower output error than RTN's on the same Hessian."""
    fmt = get_format(name)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(1024, 256, generator=gen) * torch.linspace(0.2, 3, 256)
    h = 2 * x.T @ x / x.shape[0]
    w = torch.randn(32, 256, generator=gen) * 0.02
    res = gptq_quantize(w, h, bits=bits, group_size=group, sym=sym, static_groups=static,
                        grid="mse", fmt=fmt, scale_dtype=_scale_dtype(fmt))
    qw = res.weight
    fmt.check(qw, "layer")
    assert np.array_equal(_gguf_py(fmt.pack(qw)["weight"], qtype, 32), qw.dequantize().numpy())
    rtn = quantize_rtn(w, bits, group, sym, grid="mse", fmt=fmt, scale_dtype=_scale_dtype(fmt))

    def out_err(q):
        return float(((x @ (q.dequantize() - w).T) ** 2).mean())

    assert out_err(qw) < out_err(rtn)


# ------------------------------------------------------------------------------ end to end
def _write_mixed(src, dst, replace: dict[str, tuple[np.ndarray, str]]) -> None:
    """Copy GGUF `src` to `dst` with some tensors replaced by (block bytes [rows, row bytes],
    ggml type name)."""
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        if t.name in replace:
            data, qtype = replace[t.name]
            w.add_tensor(t.name, data, raw_dtype=gguf.GGMLQuantizationType[qtype])
        else:
            w.add_tensor(t.name, np.array(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.llamacpp
def test_llamacpp_runs_kquant_layers_like_the_reference(tmp_path):
    """A tiny llama (hidden 256) with its linears in Q4_K, Q5_K, Q6_K, Q5_0 and IQ4_NL (RTN and
    GPTQ): llama.cpp's logits on that GGUF are much closer to ArkInfer's reference model run on the
    canonical dequantised weights than to the float model. What remains is llama.cpp's 8-bit
    rounding of the activations (Q8_K / Q8_0 dot products): here about 0.09 in the logits, the
    size it has for llama.cpp's own Q8_0 blocks too, against a quantisation gap of about 0.47;
    a wrong byte layout gives errors far beyond the gap."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from arkinfer.frontend.checkpoint import load
    from arkinfer.frontend.gguf_import import import_gguf
    from arkinfer.frontend.gguf_model import permute_qk
    from arkinfer.testing.gguf_synthetic import write_tiny_gguf

    heads, kv_heads = 4, 2
    src = tmp_path / "f32.gguf"
    originals = write_tiny_gguf(src, "llama", layers=1, hidden=256, heads=heads,
                                kv_heads=kv_heads, ffn=512, seed=7)
    import_gguf(src, tmp_path / "hf")
    _, model = load(tmp_path / "hf")
    choice = {"self_attn.q_proj": ("gguf-q4_k", "rtn"), "self_attn.k_proj": ("gguf-q5_k", "rtn"),
              "self_attn.v_proj": ("gguf-q6_k", "gptq"), "self_attn.o_proj": ("gguf-q5_0", "rtn"),
              "mlp.gate_proj": ("gguf-q4_k", "gptq"), "mlp.up_proj": ("gguf-iq4_nl", "gptq"),
              "mlp.down_proj": ("gguf-q5_k", "gptq")}
    gguf_names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                  "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                  "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    ids = list(range(3, 35))
    with torch.no_grad():
        ref_float = model(torch.tensor([ids]), torch.arange(len(ids)), model.empty_cache())[0]
    replace, state = {}, model.state_dict()
    gen = torch.Generator().manual_seed(8)
    for part, (name, how) in choice.items():
        fmt = get_format(name)
        c = fmt.constraints
        hf = f"model.layers.0.{part}.weight"
        w = torch.from_numpy(originals[hf])
        bits, group, sym = c.bits[0], c.group_sizes[0], c.sym[0]
        sd = _scale_dtype(fmt)
        if how == "gptq":
            x = torch.randn(512, w.shape[1], generator=gen)
            qw = gptq_quantize(w, 2 * x.T @ x / 512, bits=bits, group_size=group, sym=sym,
                               static_groups=True, grid="mse", fmt=fmt, scale_dtype=sd).weight
        else:
            qw = quantize_rtn(w, bits, group, sym, grid="mse", fmt=fmt, scale_dtype=sd)
        raw = fmt.pack(qw)["weight"]
        if part in ("self_attn.q_proj", "self_attn.k_proj"):  # llama.cpp's row order
            raw = permute_qk(raw, heads if part.endswith("q_proj") else kv_heads)
        replace[f"blk.0.{gguf_names[part]}.weight"] = (raw, fmt.ggml_type.name)
        state[hf].copy_(qw.dequantize())
    with torch.no_grad():
        ref = model(torch.tensor([ids]), torch.arange(len(ids)), model.empty_cache())[0]
    dst = tmp_path / "mixed.gguf"
    _write_mixed(src, dst, replace)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(dst)).tensors}
    assert {types[k] for k in replace} == {"Q4_K", "Q5_K", "Q6_K", "Q5_0", "IQ4_NL"}
    llm = llama_cpp.Llama(str(dst), logits_all=True, n_ctx=64, n_threads=1, verbose=False)
    llm.eval(ids)
    got = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    ref, ref_float = ref[0].double().numpy(), ref_float[0].double().numpy()
    to_quant = np.abs(got - ref).max()
    quant_gap = np.abs(ref - ref_float).max()
    assert to_quant < 0.4 * quant_gap, (to_quant, quant_gap)
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
def test_quantize_gguf_kquants(qtype, monkeypatch):
    """quantize_gguf (the GGUF backend's float -> bytes path): llama.cpp's bytes when its libggml
    is there, else ArkInfer's RTN K-quant in the same layout."""
    from arkinfer.quant.formats import ggml_native

    x = np.random.default_rng(9).standard_normal((8, 512)).astype(np.float32)
    if ggml_library() is not None:
        assert quantize_gguf(x, GGMLType[qtype]) == ggml_quantize(x, int(GGMLType[qtype]))
    monkeypatch.setattr(ggml_native, "_LIB", [None])
    raw = np.frombuffer(quantize_gguf(x, GGMLType[qtype]), np.uint8).reshape(8, -1)
    err = float(((_gguf_py(raw, qtype, 8) - x) ** 2).mean())
    assert err < {"Q4_K": 0.006, "Q5_K": 0.0015, "Q6_K": 0.0004}[qtype]
