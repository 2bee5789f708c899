"""Refusals name the format, the layer and the reason; recipes and presets validate early."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from arkinfer.quant import (
    QuantError,
    QuantizedWeight,
    QuantRecipe,
    get_preset,
    quantize_rtn,
    quantize_ternary,
)
from arkinfer.quant.formats import FormatError, all_formats, get_format
from arkinfer.quant.recipe import PRESETS

LAYER = "model.layers.3.mlp.down_proj"
F16 = torch.float16


def _rtn(out: int, inp: int, bits: int, group: int, sym: bool,
         dtype: torch.dtype | None = F16) -> QuantizedWeight:
    torch.manual_seed(0)
    return quantize_rtn(torch.randn(out, inp), bits, group, sym, scale_dtype=dtype, name=LAYER)


def _act_order() -> QuantizedWeight:
    qw = _rtn(64, 256, 4, 128, True)
    g_idx = (np.arange(256) // 128)[::-1].astype(np.int32)
    return QuantizedWeight(qw.codes, qw.scales, qw.zeros, 4, 128, True, g_idx, name=LAYER)


def _zero_point_0() -> QuantizedWeight:
    return quantize_rtn(torch.rand(64, 128) + 0.1, 4, 64, False, scale_dtype=F16, name=LAYER)


CASES = [
    ("marlin", lambda: _rtn(64, 192, 4, 64, True), r"in_features=192 is not a multiple of 128"),
    ("marlin", lambda: _rtn(96, 256, 4, 128, True), r"out_features=96 is not a multiple of 64"),
    ("marlin", lambda: _rtn(64, 256, 4, 128, False), r"sym=False is not supported"),
    ("marlin", lambda: _rtn(64, 256, 8, 128, True), r"bits=8 is not supported \(allowed \(4,\)\)"),
    ("marlin", _act_order, r"act-order"),
    ("awq", _act_order, r"act-order"),
    ("awq", lambda: _rtn(64, 256, 4, 256, False), r"group_size=256 is not supported"),
    ("awq", lambda: _rtn(60, 256, 4, 128, False), r"out_features=60 is not a multiple of 8"),
    ("gptq", lambda: _rtn(64, 256, 4, 128, True, None),
     r"scale .* is not exactly representable in float16"),
    ("gptq", _zero_point_0, r"zero point 0 is below 1"),
    ("gptq", lambda: _rtn(16, 256, 3, 128, True), r"out_features=16 is not a multiple of 32"),
    ("gguf-q4_0", lambda: _rtn(8, 256, 4, 64, True), r"group_size=64 is not supported"),
    ("gguf-q8_0", lambda: _rtn(8, 256, 4, 32, True), r"bits=4"),
    ("gguf-tq2_0", lambda: _rtn(8, 256, 2, 32, True), r"kind=uniform"),
    ("gptq", lambda: quantize_ternary(torch.randn(8, 256), name=LAYER), r"kind=ternary"),
    ("gguf-tq1_0", lambda: quantize_ternary(torch.randn(8, 128), scale_dtype=F16, name=LAYER),
     r"in_features=128 is not a multiple of 256"),
    ("mlx", lambda: _rtn(8, 256, 4, 256, False), r"group_size=256"),
    ("ort", lambda: _rtn(8, 256, 3, 128, False), r"bits=3"),
    ("ort", lambda: _rtn(8, 256, 4, -1, False), r"group_size=-1"),
    ("onnx-qdq", lambda: _rtn(8, 256, 2, 128, False), r"bits=2"),
]


@pytest.mark.parametrize("name, make, reason", CASES, ids=[f"{c[0]}:{c[2][:28]}" for c in CASES])
def test_format_refuses_with_layer_and_reason(name: str, make, reason: str) -> None:
    fmt, qw = get_format(name), make()
    with pytest.raises(FormatError, match=rf"format '{name}' cannot store '{LAYER}': {reason}"):
        fmt.check(qw, LAYER)
    with pytest.raises(FormatError) as info:
        fmt.pack(qw)
    assert info.value.hint  # every refusal says what to do next


def test_every_format_has_constraint_data() -> None:
    for fmt in all_formats():
        c = fmt.constraints
        assert c.bits and c.sym and c.kinds and c.scale_dtype in ("float16", "float32")


def test_unknown_format_lists_registered() -> None:
    with pytest.raises(FormatError, match=r"unknown storage format 'exl2'.*'marlin'"):
        get_format("exl2")


def test_unpack_names_bad_shapes() -> None:
    tensors = get_format("gptq").pack(_rtn(64, 256, 4, 128, True))
    with pytest.raises(FormatError, match=r"'qweight' has shape \(32, 64\); expected \(16, 64\)"):
        get_format("gptq").unpack(tensors, 64, 128, bits=4, group_size=128)
    with pytest.raises(FormatError, match=r"'qzeros' is missing"):
        get_format("gptq").unpack({"qweight": tensors["qweight"]}, 64, 256)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid_and_describe_themselves(name: str) -> None:
    recipe = get_preset(name)
    assert get_format(recipe.format).constraints.bits
    assert recipe.format in {f.name for f in all_formats()} and recipe.describe()
    # the output layer stays float except where a bits budget counts it (mixed precision)
    assert recipe.skips("lm_head") != (recipe.budget is not None)
    assert not recipe.skips("model.layers.0.mlp.up_proj")


def test_preset_table() -> None:
    p = PRESETS
    marlin = p["marlin"]
    assert (marlin.calib, marlin.format, marlin.group_size, marlin.desc_act) == (
        "gptq", "marlin", 128, False)
    assert (p["awq"].sym, p["q4_0"].group_size, p["mlx4"].group_size) == (False, 32, 64)
    assert (p["ternary"].calib, p["ternary"].format) == ("ternary", "gguf-tq2_0")
    assert get_preset("awq", group_size=64).group_size == 64


@pytest.mark.parametrize("kw, message", [
    ({"calib": "rtn", "format": "marlin", "bits": 3}, r"bits=3 not in \(4,\)"),
    ({"calib": "awq", "format": "awq", "desc_act": True, "sym": False}, r"desc_act=True"),
    ({"calib": "rtn", "format": "gguf-tq2_0", "bits": 2}, r"stores \['ternary'\]"),
    ({"calib": "gptq", "format": "marlin", "sym": False}, r"sym=False"),
    ({"calib": "smoothquant", "format": "gptq"}, r"calib='smoothquant'"),
    ({"calib": "rtn", "format": "nope"}, r"unknown storage format 'nope'"),
    ({"calib": "rtn", "format": "gguf-q4_0", "group_size": 128}, r"group_size=128 not in \(32,\)"),
    ({"calib": "rtn", "format": "gptq", "skip": "lm_head"}, r"skip='lm_head' is a string"),
])
def test_impossible_recipes_fail_early(kw: dict, message: str) -> None:
    with pytest.raises(QuantError, match=message):
        QuantRecipe(**kw)


def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(QuantError, match=r"unknown quantisation preset 'q5_k'.*'q4_0'"):
        get_preset("q5_k")
