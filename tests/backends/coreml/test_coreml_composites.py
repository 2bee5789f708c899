"""The Core ML composites (attention, InfLLM v2, rms_norm, rope) evaluated by MIL constant
folding (value inference) against ArkInfer's reference implementations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

ct = pytest.importorskip("coremltools")

from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import Function  # noqa: E402

from arkinfer.backends.coreml import composites as C  # noqa: E402
from arkinfer.backends.coreml.infllmv2 import infllmv2_attention, selection  # noqa: E402
from arkinfer.backends.coreml.verify import composite_check  # noqa: E402
from arkinfer.ops.infllmv2 import reference as ref  # noqa: E402
from arkinfer.ops.infllmv2.config import SparseConfig  # noqa: E402
from arkinfer.ops.norm import rms_norm  # noqa: E402
from arkinfer.ops.rope import rope  # noqa: E402


def _fold(build):
    """Build ops on constants in an iOS 18 function: MIL folds them, return the values."""
    with Function({}, opset_version=ct.target.iOS18), np.errstate(over="ignore"):
        out = build()
    return [o.val for o in out] if isinstance(out, (tuple, list)) else out.val


def test_composite_check_of_verify_passes():
    result = composite_check()
    assert result["passed"], result["cases"]
    assert {(c["cache"], c["new_tokens"]) for c in result["cases"]} == {(640, 40), (700, 1),
                                                                         (333, 333)}


def _padded(k: torch.Tensor, smax: int) -> np.ndarray:
    out = np.zeros((*k.shape[:2], smax, k.shape[3]), np.float32)
    out[:, :, :k.shape[2]] = k.numpy()
    return out


@pytest.mark.parametrize("length,dense_len", [(300, 1024), (300, 200), (1000, -1)])
def test_infllmv2_dense_switch_and_needle(length, dense_len):
    """Dense below dense_len (§6.2), sparse above; a planted needle block far behind the window
    is selected (§6.4); with MiniCPM4.1's kernel / block sizes and GQA group 3."""
    cfg = SparseConfig(window_size=128, topk=3, dense_len=dense_len)  # one free slot
    gen = torch.Generator().manual_seed(1)
    hq, hkv, d, t = 6, 2, 16, 4
    q = torch.randn(1, hq, t, d, generator=gen)
    k = torch.randn(1, hkv, length, d, generator=gen)
    v = torch.randn(1, hkv, length, d, generator=gen)
    k[:, 0, 64:128] = q[0, 0, -1] * 3  # block 1 of group 0 aligned with head 0's last query
    start, smax, scale = length - t, 1024, d ** -0.5
    want, _, want_idx = ref.infllmv2_attention(q, k, v, config=cfg, scale=scale,
                                               cache_len=start)

    def build():
        st = mb.const(val=np.array([start], np.int32))
        pos = C.positions(st, t)
        qc, kc, vc = (mb.const(val=q.numpy()), mb.const(val=_padded(k, smax)),
                      mb.const(val=_padded(v, smax)))
        return (infllmv2_attention(qc, kc, vc, pos, st, t, cfg, scale, "fp32"),
                selection(qc, kc, pos, cfg, scale))

    out, idx = _fold(build)
    np.testing.assert_allclose(out, want.numpy(), atol=2e-5, rtol=1e-4)
    if want_idx is not None:
        np.testing.assert_array_equal(idx, want_idx.numpy())
        if length > cfg.full_visibility_len:
            assert 1 in idx[0, 0, -1]  # the needle block is selected


def test_rms_norm_and_rope_composites_match_the_ops():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, 5, 32, generator=gen) * 3
    w = torch.rand(32, generator=gen) + 0.5
    q = torch.randn(1, 2, 5, 16, generator=gen)
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    start = 4000  # angles above fp16's exact range: the composite keeps them fp32

    def build():
        cos, sin = C.rope_tables(C.positions(mb.const(val=np.array([start], np.int32)), 5),
                                 inv.numpy(), 1.25)
        return (C.rms_norm(mb.const(val=x.numpy()), w.numpy(), 1e-6, "fp32"),
                C.rope(mb.const(val=q.numpy()), cos, sin, 16))

    norm, rot = _fold(build)
    np.testing.assert_allclose(norm, rms_norm(x, w, 1e-6).numpy(), atol=1e-5, rtol=1e-5)
    want = rope(q, torch.arange(start, start + 5), inv, 1.25)
    np.testing.assert_allclose(rot, want.numpy(), atol=1e-4, rtol=1e-4)
