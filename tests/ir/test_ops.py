"""Every IR op against an independent torch formula, one case per op (tinygrad style).

Each case builds a one-node program with static shapes, verifies it and runs the interpreter.
`test_every_op_has_a_case` keeps the table complete when an op is added.
"""

from __future__ import annotations

import pytest
import torch

from arkinfer import ir
from arkinfer.ir.infer import infer_type
from arkinfer.ir.interpret import KERNELS

g = torch.Generator().manual_seed(0)


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


def run_op(op: ir.Op, inputs: list[torch.Tensor], attrs: dict, weights: dict | None = None):
    store = ir.WeightStore({n: ir.Weight(n, ir.TensorType.of(t), data=t)
                            for n, t in (weights or {}).items()})
    ins = [ir.Input(f"x{i}", ir.TensorType.of(t)) for i, t in enumerate(inputs)]
    out_type = infer_type(op, [i.type for i in ins], attrs, lambda n: store[n].type)
    graph = ir.Graph("prefill", ins, [ir.Node("y", op, [i.name for i in ins], attrs, out_type)],
                     {"y": "y"})
    program = ir.verify(ir.Program({"prefill": graph}, store))
    return ir.interpret(program, "prefill", {f"x{i}": t for i, t in enumerate(inputs)})["y"]


def rope_formula(x, pos, inv):
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def attention_formula(q, k, v, scale):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    t, s = q.shape[2], k.shape[2]
    scores = (q @ k.transpose(-1, -2)) * scale
    mask = torch.arange(s)[None, :] <= torch.arange(s - t, s)[:, None]
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


X, W, B, IDS = rand(2, 3, 8), rand(5, 8), rand(5), torch.tensor([[1, 4, 0]])
Q, K, V, POS, INV = rand(1, 4, 3, 8), rand(1, 2, 6, 8), rand(1, 2, 6, 8), torch.arange(3, 6), \
    1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8)
TABLE = torch.cat([(torch.arange(16).float()[:, None] * INV).cos(),
                   (torch.arange(16).float()[:, None] * INV).sin()], -1)
NW = rand(8)

CASES = {  # op: (inputs, attrs, weights, expected)
    ir.Op.EMBED: ([IDS], {"weight": "w"}, {"w": W}, W[IDS]),
    ir.Op.LINEAR: ([X], {"weight": "w", "bias": "b"}, {"w": W, "b": B}, X @ W.T + B),
    ir.Op.RMS_NORM: ([X], {"weight": "w", "eps": 1e-6}, {"w": NW},
                     NW * X / torch.sqrt((X * X).mean(-1, keepdim=True) + 1e-6)),
    ir.Op.ROPE: ([Q, POS], {"inv_freq": "f", "scale": 1.0}, {"f": INV}, rope_formula(Q, POS, INV)),
    ir.Op.ROPE_TABLE: ([Q, POS], {"table": "t"}, {"t": TABLE}, rope_formula(Q, POS, INV)),
    ir.Op.ATTENTION: ([Q, K, V], {"scale": 0.3}, {}, attention_formula(Q, K, V, 0.3)),
    ir.Op.ADD: ([X, X[0]], {}, {}, X + X[0]),
    ir.Op.MUL: ([X, NW], {}, {}, X * NW),
    ir.Op.MUL_SCALAR: ([X], {"value": 12.0}, {}, X * 12),
    ir.Op.DIV_SCALAR: ([X], {"value": 16.0}, {}, X / 16),
    ir.Op.SILU: ([X], {}, {}, X * torch.sigmoid(X)),
    ir.Op.CAST: ([X], {"dtype": "bf16"}, {}, X.to(torch.bfloat16)),
    ir.Op.RESHAPE: ([X], {"shape": [2, 3, 2, 4]}, {}, X.view(2, 3, 2, 4)),
    ir.Op.TRANSPOSE: ([X], {"dim0": 0, "dim1": 2}, {}, X.permute(2, 1, 0)),
    ir.Op.CONCAT: ([X, X[:, :1]], {"dim": 1}, {}, torch.cat([X, X[:, :1]], 1)),
    ir.Op.SLICE: ([X], {"dim": 2, "start": 2, "end": 5}, {}, X[:, :, 2:5]),
}


@pytest.mark.parametrize("op", list(CASES), ids=lambda op: op.value)
def test_op_matches_formula(op):
    inputs, attrs, weights, expected = CASES[op]
    got = run_op(op, inputs, attrs, weights)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.allclose(got.float(), expected.float(), atol=1e-5), (got - expected).abs().max()


def test_every_op_has_a_spec_kernel_and_case():
    assert set(ir.Op) == set(ir.SPECS) == set(KERNELS) == set(CASES)
    assert {op for group in ir.OpGroup for op in ir.ops_in(group)} == set(ir.Op)


def test_longrope_attributes_pick_the_table_by_total_length():
    short, long = INV, INV / 4
    attrs = {"inv_freq": "s", "inv_freq_long": "l", "scale": 1.0, "long_after": 5, "length": "P+T"}
    x = ir.Input("x", ir.TensorType(ir.DType.F32, (1, 4, "T", 8)))
    pos = ir.Input("pos", ir.TensorType(ir.DType.I64, ("T",)))
    cache = ir.Input("c", ir.TensorType(ir.DType.F32, (1, 1, "P", 8)))
    store = ir.WeightStore({"s": ir.Weight("s", ir.TensorType.of(short), data=short),
                            "l": ir.Weight("l", ir.TensorType.of(long), data=long)})
    node = ir.Node("y", ir.Op.ROPE, ["x", "pos"], attrs, x.type)
    graph = ir.Graph("prefill", [x, pos, cache], [node], {"y": "y"}, {"T": (1, 99), "P": (0, 99)})
    program = ir.verify(ir.Program({"prefill": graph}, store))
    for past, table in ((2, short), (3, long)):  # total 5 -> short, 6 -> long
        out = ir.interpret(program, "prefill", {"x": Q, "pos": torch.arange(past, past + 3),
                                                "c": torch.zeros(1, 1, past, 8)})["y"]
        assert torch.allclose(out, rope_formula(Q, torch.arange(past, past + 3), table), atol=1e-5)

