"""latency/storage.py's byte formulas against the bytes every registered packer really writes, and
its refusal rule against `Format.check`."""

from __future__ import annotations

import pytest
import torch
from arkinfer.quant import (
    QuantRecipe,
    all_formats,
    get_format,
    quantize_rtn,
    quantize_ternary,
)
from arkinfer.quant.formats import FormatError
from arkinfer.quant.recipe import PRESETS
from arkinfer.quant.weight import Kind

from arkinfer.latency.storage import format_bytes, linear_storage, refusal


def _cases():
    """(format, bits, group_size, sym) for every format: each allowed value at least once."""
    for fmt in all_formats():
        c = fmt.constraints
        groups = c.group_sizes or (-1,)
        for bits in c.bits:
            for g in groups:
                for sym in c.sym:
                    yield pytest.param(fmt.name, bits, g, sym, id=f"{fmt.name}-b{bits}-g{g}-{sym}")


def _weight(fmt: str, out: int, inp: int, bits: int, g: int, sym: bool):
    torch.manual_seed(0)
    w = torch.randn(out, inp)
    scale_dtype = torch.float32 if get_format(fmt).constraints.scale_dtype == "float32" \
        else torch.float16
    if Kind.TERNARY in get_format(fmt).constraints.kinds:
        return quantize_ternary(w, "row", scale_dtype=scale_dtype)
    return quantize_rtn(w, bits, g, sym, scale_dtype=scale_dtype, fmt=fmt)


@pytest.mark.parametrize("fmt,bits,g,sym", list(_cases()))
def test_formula_equals_packed_bytes(fmt, bits, g, sym):
    c = get_format(fmt).constraints
    step_in = c.in_step(bits, g if g > 0 else 1)
    step_out = c.out_step(bits)
    # two shapes with several groups, rows and (for odd group counts) padded zero-point rows
    for k_mult, n_mult in ((1, 1), (3, 2)):
        inp = max(step_in, 256) * k_mult
        out = max(step_out, 64) * n_mult
        if g > 0 and inp % g:
            continue
        qw = _weight(fmt, out, inp, bits, g, sym)
        packed = get_format(fmt).pack(qw)
        actual = sum(a.nbytes for a in packed.values())
        assert format_bytes(fmt, out, inp, bits=bits, group_size=g, sym=sym) == actual, \
            (fmt, out, inp, {k: (a.dtype, a.shape) for k, a in packed.items()})


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("shape", [(64, 200), (100, 256), (64, 384), (128, 512)])
def test_refusal_agrees_with_format_check(preset, shape):
    """A shape refusal() lets through packs; one it refuses makes Format.check raise."""
    recipe = PRESETS[preset]
    out, inp = shape
    g = recipe.group_size
    if g > 0 and inp % g:
        assert "does not divide" in refusal(recipe, out, inp)  # no weight can be built at all
        return
    qw = _weight(recipe.format, out, inp, recipe.bits, g, recipe.sym)
    why = refusal(recipe, out, inp)
    if why is None:
        get_format(recipe.format).check(qw)
    else:
        with pytest.raises(FormatError):
            get_format(recipe.format).check(qw)


def test_linear_storage_skips_and_refusals_stay_float():
    recipe = QuantRecipe("rtn", "gguf-q4_0", 4, 32)
    head = linear_storage("lm_head", 512, 128, recipe, "bf16")
    assert (head.kind, head.fmt, head.nbytes) == ("float", "bf16", 512 * 128 * 2)
    assert "skipped" in head.reason
    ragged = linear_storage("model.layers.0.mlp.down_proj", 128, 200, recipe, "f32")
    assert (ragged.kind, ragged.nbytes) == ("float", 128 * 200 * 4)
    assert "in_features=200" in ragged.reason
    ok = linear_storage("model.layers.0.mlp.up_proj", 200, 128, recipe, "f32")
    assert (ok.kind, ok.nbytes) == ("quantised", 200 * 128 // 32 * 18)
