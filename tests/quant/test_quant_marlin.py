"""Marlin: the permutation tables, an independent transcription of IST-DASLab/marlin's
`Layer.pack` (torch, from the weight in fp16 as upstream takes it), and GPTQ -> Marlin repacking
by data movement alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from arkinfer.quant import quantize_rtn
from arkinfer.quant.formats import FormatError, get_format
from arkinfer.quant.formats.marlin import (
    PERM,
    SCALE_PERM,
    SCALE_PERM_SINGLE,
    gptq_to_marlin,
)


def test_perm_tables() -> None:
    assert PERM[:16].tolist() == [0, 128, 8, 136, 16, 144, 24, 152,
                                  256, 384, 264, 392, 272, 400, 280, 408]
    assert sorted(PERM.tolist()) == list(range(1024))
    assert sorted(SCALE_PERM.tolist()) == list(range(64))
    assert sorted(SCALE_PERM_SINGLE.tolist()) == list(range(32))
    assert SCALE_PERM[:9].tolist() == [0, 8, 16, 24, 32, 40, 48, 56, 1]
    assert SCALE_PERM_SINGLE[:10].tolist() == [0, 1, 8, 9, 16, 17, 24, 25, 2, 3]


def upstream_marlin_pack(weight_fp16: torch.Tensor, scales: torch.Tensor, groupsize: int):
    """Transcription of marlin `Layer.pack(linear, scales)`: weight [n, k] fp16, scales
    [n, k/groupsize] (per-channel: [n, 1]); returns (B int32 [k/16, 2n], s fp16)."""
    perm = []
    for i in range(32):
        perm1 = []
        col = i // 4
        for block in [0, 1]:
            for row in [2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1]:
                perm1.append(16 * row + col + 8 * block)
        for j in range(4):
            perm.extend([p + 256 * j for p in perm1])
    perm = torch.from_numpy(np.array(perm).reshape((-1, 8))[:, [0, 2, 4, 6, 1, 3, 5, 7]].ravel())
    scale_perm = [i + 8 * j for i in range(8) for j in range(8)]
    scale_perm_single = [2 * i + j for i in range(4) for j in [0, 1, 8, 9, 16, 17, 24, 25]]

    n, k = weight_fp16.shape
    groupsize = k if groupsize == -1 else groupsize
    tile, maxq = 16, 2**4 - 1
    s = scales.t()
    w = weight_fp16.t()
    if groupsize != k:
        w = w.reshape((-1, groupsize, n)).permute(1, 0, 2).reshape((groupsize, -1))
        s = s.reshape((1, -1))
    w = torch.round(w / s).int()
    w += (maxq + 1) // 2
    w = torch.clamp(w, 0, maxq)
    if groupsize != k:
        w = w.reshape((groupsize, -1, n)).permute(1, 0, 2).reshape((k, n)).contiguous()
        s = s.reshape((-1, len(scale_perm)))[:, scale_perm]
    else:
        s = s.reshape((-1, len(scale_perm_single)))[:, scale_perm_single]
    s = s.reshape((-1, n)).contiguous()
    w = w.reshape((k // tile, tile, n // tile, tile)).permute((0, 2, 1, 3))
    res = w.reshape((k // tile, n * tile))
    res = res.reshape((-1, perm.numel()))[:, perm].reshape(res.shape)
    q = np.zeros((res.shape[0], res.shape[1] // 8), dtype=np.uint32)
    res = res.numpy().astype(np.uint32)
    for i in range(8):
        q |= res[:, i::8] << 4 * i
    return q.astype(np.int32), s


@pytest.mark.parametrize("group", [128, 64, -1])
def test_pack_matches_upstream_marlin(group: int) -> None:
    torch.manual_seed(1)
    qw = quantize_rtn(torch.randn(128, 256) * 0.05, 4, group, True, scale_dtype=torch.float16)
    # Upstream takes the fp16 weight and fp16 scales and recomputes round(w / s) + 8.
    weight = qw.dequantize().half()
    assert torch.equal(torch.round(weight.float() / qw.scales.repeat_interleave(
        qw.in_features if group == -1 else group, dim=1)).int() + 8, qw.codes.int())
    b_ref, s_ref = upstream_marlin_pack(weight, qw.scales.half(), group)
    ours = get_format("marlin").pack(qw)
    assert ours["B"].shape == (256 // 16, 2 * 128) and ours["B"].dtype == np.int32
    assert np.array_equal(ours["B"], b_ref)
    assert np.array_equal(ours["s"], s_ref.numpy())


@pytest.mark.parametrize("group", [128, 32, -1])
def test_gptq_to_marlin_equals_direct_pack(group: int) -> None:
    torch.manual_seed(2)
    qw = quantize_rtn(torch.randn(192, 384), 4, group, True, scale_dtype=torch.float16)
    direct = get_format("marlin").pack(qw)
    repacked = gptq_to_marlin(get_format("gptq").pack(qw))
    assert direct.keys() == repacked.keys()
    for key in direct:
        assert direct[key].dtype == repacked[key].dtype
        assert np.array_equal(direct[key], repacked[key]), key


def test_gptq_to_marlin_refuses_asym_and_act_order() -> None:
    torch.manual_seed(3)
    asym = quantize_rtn(torch.randn(64, 128), 4, 128, False, scale_dtype=torch.float16)
    with pytest.raises(FormatError, match="symmetric 4-bit"):
        gptq_to_marlin(get_format("gptq").pack(asym))
    sym = quantize_rtn(torch.randn(64, 256), 4, 128, True, scale_dtype=torch.float16)
    tensors = get_format("gptq").pack(sym)
    tensors["g_idx"] = tensors["g_idx"][::-1].copy()
    with pytest.raises(FormatError, match="act-order"):
        gptq_to_marlin(tensors)
