"""The conformance checks are not vacuous: deliberately wrong InfLLM v2 implementations fail them.

Each variant is the reference with one stage replaced, assembled through the same
`run_infllmv2` driver a real implementation uses.
"""

from __future__ import annotations

import pytest
import torch
from infllmv2_checks import Infllmv2Impl, quick_suite

from arkinfer.ops.infllmv2 import compress_keys
from arkinfer.ops.infllmv2 import reference as ref
from arkinfer.ops.infllmv2.common import run_infllmv2


def _impl(name, select):
    def attention(q, k, v, *, config, scale, cache_len, state=None, q_sel=None, k_sel=None):
        return run_infllmv2(q, k, v, config=config, scale=scale, cache_len=cache_len,
                            state=state, q_sel=q_sel, k_sel=k_sel,
                            compress=lambda kk, cfg, st: compress_keys(kk, cfg), select=select,
                            attend=ref.block_sparse_attention)
    return Infllmv2Impl(name, attention, tracks_memory=False)


def _group_view(x, hkv):
    b, hq, t, n = x.shape
    return x.view(b, hkv, hq // hkv, t, n)


def select_mean_of_group_queries(q, keys, *, config, scale, cache_len):
    """Bug: average the group's query heads (i.e. their logits) before the exp, instead of
    summing the per-head probabilities."""
    hkv = keys.fine.shape[1]
    qm = _group_view(q.float(), hkv).mean(2, keepdim=True).expand_as(_group_view(q, hkv))
    return ref.select_blocks(qm.reshape(q.shape), keys, config=config, scale=scale,
                             cache_len=cache_len)


def select_mean_of_group_probs(q, keys, *, config, scale, cache_len):
    """Average the per-head probabilities instead of summing them: a positive constant factor."""
    p = ref.head_kernel_scores(q, keys, config=config, scale=scale, cache_len=cache_len)
    s = _group_view(p, keys.fine.shape[1]).mean(2)
    n_blocks = -(-keys.length // config.block_size)
    return ref.topk_blocks(ref.pool_blocks(s, config, n_blocks), config, cache_len)


def select_without_local_window(q, keys, *, config, scale, cache_len):
    """Bug: only the init blocks are forced; the local window has to win on score."""
    scores = ref.block_scores(q, keys, config=config, scale=scale, cache_len=cache_len)
    t, n_blocks = scores.shape[-2:]
    qb = (cache_len + torch.arange(t)) // config.block_size
    blk = torch.arange(n_blocks)
    ranked = torch.where(blk < config.init_blocks, float("inf"), scores)
    ranked = torch.where(blk[None, :] > qb[:, None], float("-inf"), ranked)
    chosen = torch.sort(ranked, dim=-1, descending=True, stable=True).indices[..., :config.budget]
    chosen = torch.where(chosen > qb[:, None], n_blocks, chosen).sort(-1).values
    idx = torch.full((*scores.shape[:-1], config.budget), -1)
    idx[..., :chosen.shape[-1]] = torch.where(chosen == n_blocks, -1, chosen)
    return idx


@pytest.mark.parametrize("select,must_fail", [
    (select_mean_of_group_queries, {"matches_reference", "decode"}),
    (select_without_local_window, {"matches_reference", "decode"}),
], ids=["mean_of_group_queries", "no_local_window"])
def test_suite_rejects_broken_implementation(select, must_fail):
    failures = quick_suite(_impl(select.__name__, select))
    assert must_fail <= set(failures), f"expected {must_fail} to fail, got {sorted(failures)}"


def test_mean_of_group_probabilities_is_indistinguishable():
    """Averaging instead of summing the group's probabilities multiplies every block score of a
    (query, KV head) row by the same 1/G, so top-k picks the same blocks: idx and outputs are
    identical and no black-box suite can (or should) reject it. Documented here on purpose."""
    assert quick_suite(_impl("mean_of_group_probs", select_mean_of_group_probs)) == {}


def test_reference_and_fast_pass_quick_suite():
    from arkinfer.ops.infllmv2 import infllmv2_attention
    assert quick_suite(Infllmv2Impl("fast_cpu", infllmv2_attention)) == {}
