"""Ternary absmean semantics (docs/quant.md §5) and lossless GGUF TQ1_0 / TQ2_0 export."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from arkinfer.quant import Kind, QuantError, quantize_ternary
from arkinfer.quant.formats import FormatError, get_format
from arkinfer.quant.formats.gguf_blocks import GGMLType, quantize_gguf


@pytest.mark.parametrize("scope", [32, 64, "row", "tensor"])
def test_absmean_semantics(scope) -> None:
    torch.manual_seed(5)
    w = torch.randn(8, 256)
    qw = quantize_ternary(w, scope)
    assert qw.kind is Kind.TERNARY and qw.bits == 2 and qw.sym
    assert set(qw.codes.unique().tolist()) <= {0, 1, 2} and (qw.zeros == 1).all()
    if scope == "tensor":
        s = w.abs().mean().expand(8, 256)
    elif scope == "row":
        s = w.abs().mean(dim=1, keepdim=True).expand(8, 256)
    else:
        s = w.reshape(8, -1, scope).abs().mean(dim=2).repeat_interleave(scope, dim=1)
    trits = torch.clamp(torch.round(w / s), -1, 1)
    assert torch.equal(qw.codes.long() - 1, trits.long())
    assert torch.allclose(qw.dequantize(), s * trits, rtol=1e-6, atol=0)


def test_eps_floor_and_bad_scope() -> None:
    qw = quantize_ternary(torch.zeros(2, 32), "row", eps=1e-5)
    assert torch.all(qw.scales == 1e-5) and torch.all(qw.dequantize() == 0)
    with pytest.raises(QuantError, match=r"group_size=48 .*in_features=64"):
        quantize_ternary(torch.randn(2, 64), 48)


@pytest.mark.parametrize("scope", ["row", "tensor"])
@pytest.mark.parametrize("name, qtype", [("gguf-tq2_0", GGMLType.TQ2_0),
                                         ("gguf-tq1_0", GGMLType.TQ1_0)])
def test_lossless_tq_export_with_one_scale_per_block(scope: str, name: str,
                                                     qtype: GGMLType) -> None:
    """One scale per 256-block: our blocks dequantise to the ternary weight exactly, and ggml's
    own quantiser applied to that dequantised weight writes the very same bytes."""
    torch.manual_seed(6)
    qw = quantize_ternary(torch.randn(8, 512), scope, scale_dtype=torch.float16)
    fmt = get_format(name)
    raw = fmt.pack(qw)["weight"]
    assert np.array_equal(fmt.dequantize({"weight": raw}, 8, 512), qw.dequantize().numpy())
    assert raw.tobytes() == quantize_gguf(qw.dequantize().numpy(), qtype)
    assert fmt.unpack({"weight": raw}, 8, 512, group_size=-1).equals(qw)


def test_group_scales_are_refused_by_tq() -> None:
    qw = quantize_ternary(torch.randn(4, 256), 32, scale_dtype=torch.float16,
                          name="model.layers.2.mlp.gate_proj")
    with pytest.raises(FormatError, match=r"'model.layers.2.mlp.gate_proj'.*scales differ inside "
                                          r"a 256-column block"):
        get_format("gguf-tq2_0").check(qw)
    # ...and ggml's re-quantisation of it is lossy, which is why it is refused:
    deq = qw.dequantize().numpy()
    back = get_format("gguf-tq2_0").dequantize(
        {"weight": np.frombuffer(quantize_gguf(deq, GGMLType.TQ2_0), np.uint8).reshape(4, -1)},
        4, 256)
    assert not np.array_equal(back, deq)
