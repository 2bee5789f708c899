"""The arkinfer custom ops against independent formulas, their gradients, and torch.export."""

from __future__ import annotations

import math

import torch

import arkinfer.ops.attention  # noqa: F401
import arkinfer.ops.norm  # noqa: F401
from arkinfer.ops.rope import default_inv_freq

ops = torch.ops.arkinfer


def test_rms_norm_formula_and_grad():
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True)
    expected = w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(ops.rms_norm(x, w, 1e-6), expected.float().double(), atol=1e-6)
    assert torch.autograd.gradcheck(lambda a, b: ops.rms_norm(a, b, 1e-6), (x, w))


def test_rope_rotates_pairs_i_and_i_plus_half():
    d = 8
    x = torch.randn(1, 2, 5, d)
    pos = torch.arange(5)
    inv = default_inv_freq(d, 10000.0)
    out = ops.rope(x, pos, inv, 1.0)
    for t in range(5):
        for j in range(d // 2):
            a = t * inv[j].item()
            c, s = math.cos(a), math.sin(a)
            x1, x2 = x[0, :, t, j], x[0, :, t, j + d // 2]
            assert torch.allclose(out[0, :, t, j], x1 * c - x2 * s, atol=1e-5)
            assert torch.allclose(out[0, :, t, j + d // 2], x2 * c + x1 * s, atol=1e-5)


def _naive_attention(q, k, v, scale):
    b, hq, t, d = q.shape
    s, group = k.shape[2], hq // k.shape[1]
    out = torch.zeros_like(q)
    for h in range(hq):
        for i in range(t):
            pos = s - t + i
            scores = (k[:, h // group, : pos + 1] @ q[:, h, i, :, None])[..., 0] * scale
            out[:, h, i] = (scores.softmax(-1)[:, :, None] * v[:, h // group, : pos + 1]).sum(1)
    return out


def test_attention_causal_gqa_with_cache():
    q = torch.randn(2, 4, 3, 8)
    k, v = torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    for t in (1, 3):
        got = ops.attention(q[:, :, :t], k, v, 0.3)
        assert torch.allclose(got, _naive_attention(q[:, :, :t], k, v, 0.3), atol=1e-5)
    full = ops.attention(q, k[:, :, :3], v[:, :, :3], 0.3)
    assert torch.allclose(full, _naive_attention(q, k[:, :, :3], v[:, :, :3], 0.3), atol=1e-5)


def test_ops_are_single_nodes_under_export():
    class M(torch.nn.Module):
        def forward(self, x, w, k, v):
            return ops.attention(ops.rms_norm(x, w, 1e-6), k, v, 0.5)

    args = (torch.randn(1, 2, 4, 8), torch.ones(8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8))
    graph = torch.export.export(M(), args).graph
    targets = [str(n.target) for n in graph.nodes if n.op == "call_function"]
    assert targets == ["arkinfer.rms_norm.default", "arkinfer.attention.default"]
