"""The staged true-sequential capture (quant/calib/sequential.py) gives exactly what re-running the
block for every group gives: the same Hessians after the same weight changes, the same outputs."""

from __future__ import annotations

import pytest
import torch
from arkinfer.quant.calib import BlockRunner
from arkinfer.quant.calib.block import SEQUENTIAL_GROUPS
from arkinfer.quant.calib.sequential import SequentialForward

from arkinfer.frontend.checkpoint import load_model, open_checkpoint


def block_runner(folder, calib, batch=4):
    model = load_model(open_checkpoint(folder, with_tokenizer=False))
    cfg = model.config
    with torch.no_grad():
        x = model.model.embed_tokens(calib.ids) * cfg.embedding_scale
    return BlockRunner(model.model.layers[0], "model.layers.0.", x, calib.mask,
                       cfg.inv_freq(calib.seq_len), batch)


def perturb(runner, names, seed):
    """A stand-in for quantisation: every linear of the group gets a changed weight."""
    gen = torch.Generator().manual_seed(seed)
    for n in names:
        w = runner.weight(n)
        runner.set_weight(n, w + 0.05 * w.abs().mean() * torch.randn(w.shape, generator=gen))


@pytest.mark.parametrize("model_type,keep_bytes,report", [("llama", 1 << 30, 8),
                                                          ("minicpm", 1 << 30, 8), ("llama", 0, 2)])
def test_staged_capture_equals_rerunning_the_block(tiny_checkpoint, calib_ids, model_type,
                                                   keep_bytes, report):
    folder = tiny_checkpoint(model_type, num_hidden_layers=1)
    calib = calib_ids(6, 24)
    staged, generic = block_runner(folder, calib), block_runner(folder, calib)
    seq = SequentialForward(staged, keep_bytes=keep_bytes, report_sequences=report)
    keep = calib.mask.to(torch.bool)
    for i, names in enumerate(SEQUENTIAL_GROUPS):
        got = seq.hessians([names[0]], keep)[names[0]].hessian()
        want = generic.hessians([names[0]], keep)[names[0]].hessian()
        assert torch.equal(got, want), names
        perturb(staged, names, i)
        perturb(generic, names, i)
    assert torch.equal(seq.output(), generic.run())
    # the float reference covers the batches holding the first `report` sequences (batch 4)
    n = min(6, 4 * -(-report // 4))
    assert staged.reference.shape[0] == n
    assert torch.equal(staged.reference, generic.reference[:n])


def test_groups_out_of_order_are_refused(tiny_checkpoint, calib_ids):
    runner = block_runner(tiny_checkpoint("llama", num_hidden_layers=1), calib_ids(2, 8))
    seq = SequentialForward(runner)
    with pytest.raises(RuntimeError, match="in order"):
        seq.hessians(["self_attn.o_proj"], runner.mask)
