"""The verifier rejects broken graphs with every problem named, and runs after every pass."""

from __future__ import annotations

import pytest
import torch

from arkinfer import ir
from arkinfer.ir import passes


def small_program() -> ir.Program:
    """tokens [1,T] -> embed -> linear -> logits, valid."""
    emb, head = torch.randn(16, 8), torch.randn(16, 8)
    store = ir.WeightStore({"emb": ir.Weight("emb", ir.TensorType.of(emb), data=emb),
                            "head": ir.Weight("head", ir.TensorType.of(head), data=head)})
    f32 = ir.DType.F32
    nodes = [ir.Node("h", ir.Op.EMBED, ["tokens"], {"weight": "emb"}, ir.TensorType(f32, (1, "T", 8))),
             ir.Node("y", ir.Op.LINEAR, ["h"], {"weight": "head"}, ir.TensorType(f32, (1, "T", 16)))]
    graph = ir.Graph("prefill", [ir.Input("tokens", ir.TensorType(ir.DType.I64, (1, "T")))], nodes,
                     {"logits": "y"}, {"T": (1, 32)}, [("T", 32)])
    return ir.Program({"prefill": graph}, store)


def problems_of(edit) -> str:
    program = small_program()
    edit(program.entry("prefill"), program)
    with pytest.raises(ir.IRVerifyError) as err:
        ir.verify(program)
    return str(err.value)


def test_valid_program_passes_and_runs():
    program = ir.verify(small_program())
    out = ir.interpret(program, "prefill", {"tokens": torch.tensor([[1, 2, 3]])})
    assert out["logits"].shape == (1, 3, 16)


@pytest.mark.parametrize("edit, expected", [
    (lambda g, p: g.nodes.reverse(), "before definition"),
    (lambda g, p: g.nodes[1].attrs.update(weight="nope"), "names weight 'nope', which is not in the store"),
    (lambda g, p: g.nodes[1].inputs.append("h"), "takes 1 operands"),
    (lambda g, p: g.nodes[1].attrs.update(colour="red"), "unknown attribute 'colour'"),
    (lambda g, p: g.nodes[0].attrs.clear(), "missing attribute 'weight'"),
    (lambda g, p: setattr(g.nodes[1], "type", ir.TensorType(ir.DType.F32, (1, "T", 15))),
     "declared f32[1,T,15] but the operands give f32[1,T,16]"),
    (lambda g, p: setattr(g.nodes[0], "type", ir.TensorType(ir.DType.F32, (1, "Q", 8))),
     "undeclared dims"),
    (lambda g, p: setattr(g.nodes[1], "name", "h"), "defined twice"),
    (lambda g, p: g.outputs.update(extra="ghost"), "undefined value 'ghost'"),
    (lambda g, p: setattr(g.nodes[1], "op", "matmul"), "unknown op"),
    (lambda g, p: g.constraints.append(("T+Z", 4)), "undeclared ['Z']"),
    (lambda g, p: p.meta.update(cache=[["cache.0.k", "cache.0.v"]]), "must be both input and output"),
])
def test_verifier_names_the_problem(edit, expected):
    message = problems_of(edit)
    assert expected in message and "prefill" in message


def test_all_problems_are_reported_together():
    def edit(g, p):
        g.nodes[1].attrs.update(weight="nope", colour="red")
    message = problems_of(edit)
    assert "nope" in message and "colour" in message and "2 problem(s)" in message


def test_partial_longrope_attributes_are_rejected():
    inv = torch.ones(4)
    store = ir.WeightStore({"f": ir.Weight("f", ir.TensorType.of(inv), data=inv)})
    x = ir.Input("x", ir.TensorType(ir.DType.F32, (1, 2, 3, 8)))
    pos = ir.Input("p", ir.TensorType(ir.DType.I64, (3,)))
    node = ir.Node("y", ir.Op.ROPE, ["x", "p"], {"inv_freq": "f", "scale": 1.0, "long_after": 4},
                   x.type)
    with pytest.raises(ir.IRVerifyError, match="LongRoPE needs all of"):
        ir.verify(ir.Program({"prefill": ir.Graph("prefill", [x, pos], [node], {"y": "y"})}, store))


def test_a_broken_pass_is_named(monkeypatch):
    def breaks(program):
        out = program.copy()
        out.entry("prefill").nodes[1].attrs["weight"] = "lost"
        return out

    monkeypatch.setitem(passes.PASSES, "breaks", breaks)
    with pytest.raises(ir.IRVerifyError) as err:
        ir.run_passes(small_program(), ["dce", "breaks"])
    assert "after pass 'breaks'" in str(err.value) and "bug in 'breaks'" in str(err.value)


def test_unknown_pass_lists_the_known_ones():
    with pytest.raises(ir.IRError, match="fuse_qkv"):
        ir.run_passes(small_program(), ["fuse_everything"])


def test_interpreter_checks_inputs_and_constraints():
    program = small_program()
    with pytest.raises(ir.InterpretError, match="missing inputs"):
        ir.interpret(program, "prefill", {})
    with pytest.raises(ir.InterpretError, match="must be i64"):
        ir.interpret(program, "prefill", {"tokens": torch.zeros(1, 3)})
    with pytest.raises(ir.InterpretError, match="outside"):
        ir.interpret(program, "prefill", {"tokens": torch.zeros(1, 40, dtype=torch.long)})
    with pytest.raises(ir.IRError, match="no entry point 'decode'"):
        ir.interpret(program, "decode", {})
