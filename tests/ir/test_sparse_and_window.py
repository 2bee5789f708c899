"""Length-dependent behaviour kept out of Python guards: InfLLM v2's dense_len switch on the
attention op, and a sliding window as a graph constraint."""

from __future__ import annotations


import pytest
import torch
from ir_helpers import check_parity

from arkinfer import ir
from arkinfer.errors import ArkError
from arkinfer.frontend.checkpoint import load_model, open_checkpoint
from arkinfer.models.configs import SPARSE_CONFIG_4_1

SPARSE = {**SPARSE_CONFIG_4_1, "dense_len": 24}


@pytest.fixture(scope="module")
def sparse_model(tiny_checkpoint):
    folder = tiny_checkpoint("minicpm", sparse_config=SPARSE)
    return load_model(open_checkpoint(folder, with_tokenizer=False)), ir.trace(folder)


def test_attention_nodes_carry_sparse_config(sparse_model):
    _, program = sparse_model
    for graph in program.entries.values():
        attn = [n for n in graph.nodes if n.op == ir.Op.ATTENTION]
        assert attn and all(n.attrs["sparse_config"] == SPARSE for n in attn)
    assert program.meta["sparse_config"] == SPARSE
    dense = ir.trace(program.meta["config"], dense=True)
    assert all("sparse_config" not in n.attrs for n in dense.entry("decode").nodes)


def test_below_dense_len_runs_dense_like_eager(sparse_model):
    model, program = sparse_model
    check_parity(model, program, 7, steps=8)  # total 15 < dense_len 24


def test_sparse_path_runs_infllmv2(sparse_model, monkeypatch):
    """Spec invariant 1: below budget * block_size (6144 here) every block is selected, so the
    sparse path (taken from total 24 on) equals dense attention."""
    from arkinfer.ops import infllmv2

    calls = []
    real = infllmv2.infllmv2_attention
    monkeypatch.setattr(infllmv2, "infllmv2_attention",
                        lambda *a, **k: calls.append(k["cache_len"]) or real(*a, **k))
    _, program = sparse_model
    dense = ir.trace(program.meta["config"], dense=True)
    dense.weights = program.weights  # same weights, dense attention
    ids = torch.randint(0, 512, (1, 40), generator=torch.Generator().manual_seed(1))
    sparse_out, sparse_cache = ir.step(program, "prefill", ids[:, :30], torch.arange(30),
                                       ir.empty_cache(program))
    dense_out, dense_cache = ir.step(dense, "prefill", ids[:, :30], torch.arange(30),
                                     ir.empty_cache(dense))
    assert (sparse_out - dense_out).abs().max() <= 1e-5 * dense_out.abs().max()
    for i in range(30, 33):
        sparse_out, sparse_cache = ir.step(program, "decode", ids[:, i:i + 1],
                                           torch.arange(i, i + 1), sparse_cache)
        dense_out, dense_cache = ir.step(dense, "decode", ids[:, i:i + 1], torch.arange(i, i + 1),
                                         dense_cache)
        assert (sparse_out - dense_out).abs().max() <= 1e-5 * dense_out.abs().max()
    layers = program.num_layers
    assert calls == [0] * layers + [30] * layers + [31] * layers + [32] * layers


@pytest.fixture(scope="module")
def window_model(tiny_checkpoint):
    folder = tiny_checkpoint("mistral", sliding_window=16)
    return load_model(open_checkpoint(folder, with_tokenizer=False)), ir.trace(folder)


def test_sliding_window_becomes_a_constraint(window_model):
    model, program = window_model
    assert program.entry("prefill").constraints == [("P+T", 16)]
    assert program.entry("decode").constraints == [("S+1", 16)]
    check_parity(model, program, 7, steps=8)  # total 15 <= 16
    ids = torch.zeros(1, 17, dtype=torch.long)
    _, cache = ir.step(program, "prefill", ids[:, :10], torch.arange(10), ir.empty_cache(program))
    with pytest.raises(ir.InterpretError, match="P\\+T=17 exceeds 16"):  # chunked prefill
        ir.step(program, "prefill", ids[:, 10:], torch.arange(10, 17), cache)
    with pytest.raises(ArkError):  # the reference refuses too
        model(ids, torch.arange(17), model.empty_cache(1))
