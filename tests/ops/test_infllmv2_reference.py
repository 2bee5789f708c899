"""InfLLM v2 reference pieces against hand-computed cases (docs/infllmv2.md §1-§5)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from arkinfer.errors import ConfigError
from arkinfer.ops.infllmv2 import (
    CompressedKeys,
    SparseConfig,
    compress_keys,
    dense_attention,
    n_kernels,
    update_compressed,
)
from arkinfer.ops.infllmv2 import reference as ref

SMALL = SparseConfig(kernel_size=8, kernel_stride=4, block_size=16, init_blocks=1, window_size=32,
                     topk=4, dense_len=-1)


pytestmark = pytest.mark.usefixtures("one_thread")


# -- config ------------------------------------------------------------------------------------
def test_defaults_are_minicpm41_and_derived_sizes():
    c = SparseConfig()
    assert c.to_dict() == {"kernel_size": 32, "kernel_stride": 16, "block_size": 64,
                           "init_blocks": 1, "window_size": 2048, "topk": 64,
                           "use_nope": False, "dense_len": 8192}
    assert (c.local_blocks, c.budget, c.kernels_per_block) == (32, 96, 4)
    assert (c.coarse_kernel_size, c.coarse_kernel_stride) == (128, 64)
    assert c.full_visibility_len == 6144
    assert SparseConfig.from_dict(c.to_dict()) == c
    assert SparseConfig.from_dict({"dense_len": -1}).dense_len == -1


def test_dense_len_switch():
    c = SparseConfig()
    assert c.is_dense(8191) and not c.is_dense(8192)
    assert not replace(c, dense_len=-1).is_dense(1)
    assert not replace(c, dense_len=0).is_dense(0)


@pytest.mark.parametrize("raw,words", [
    ({"kernel_size": 32, "blok_size": 64, "sparse": 1}, ["unknown keys", "blok_size", "sparse"]),
    ({"block_size": 0}, ["'block_size' must be positive"]),
    ({"kernel_stride": -16}, ["'kernel_stride' must be positive"]),
    ({"block_size": 72}, ["block_size=72 must be a multiple of kernel_stride=16"]),
    ({"window_size": 100}, ["window_size=100 must be a multiple of block_size=64"]),
    ({"topk": 1, "init_blocks": 1}, ["topk=1 must be >= init_blocks + 1"]),
    ({"use_nope": 1}, ["'use_nope' must be bool"]),
    ({"topk": True}, ["'topk' must be int"]),
    ({"dense_len": -2}, ["'dense_len' must be >= 0 or -1"]),
])
def test_from_dict_rejects_with_clear_message(raw, words):
    with pytest.raises(ConfigError) as e:
        SparseConfig.from_dict(raw)
    for w in words:
        assert w in str(e.value)
    assert e.value.hint


def test_direct_construction_is_validated_too():
    with pytest.raises(ConfigError, match="block_size=40"):
        SparseConfig(block_size=40)


# -- §2 compression ----------------------------------------------------------------------------
@pytest.mark.parametrize("length,n1,n2", [(0, 0, 0), (31, 0, 0), (32, 1, 0), (47, 1, 0),
                                          (48, 2, 0), (127, 6, 0), (128, 7, 1), (191, 10, 1),
                                          (192, 11, 2), (8192, 511, 127)])
def test_kernel_counts(length, n1, n2):
    assert ref.expected_kernel_count(length, SparseConfig()) == (n1, n2)
    assert n_kernels(length, 32, 16) == n1


def test_compressed_keys_are_kernel_means_in_fp32():
    s = 300
    k = torch.arange(s, dtype=torch.float32)[None, None, :, None].expand(1, 2, s, 3).bfloat16()
    c = compress_keys(k, SparseConfig())
    assert c.fine.dtype == torch.float32 and c.length == s
    assert c.fine.shape == (1, 2, 17, 3) and c.coarse.shape == (1, 2, 3, 3)
    kb = k.float()[0, 0, :, 0]
    for j in range(17):   # mean(K[16j : 16j+32]) of bf16-rounded positions
        assert c.fine[0, 0, j, 0].item() == pytest.approx(kb[16 * j:16 * j + 32].mean().item())
    for j in range(3):
        assert c.coarse[0, 1, j, 2].item() == pytest.approx(kb[64 * j:64 * j + 128].mean().item())


def test_incremental_compression_is_bit_identical_and_copy_free():
    k = torch.randn(2, 3, 260, 16)
    state = None
    for s in range(261):
        new = update_compressed(k[:, :, :s], SMALL, state)
        full = compress_keys(k[:, :, :s], SMALL)
        assert torch.equal(new.fine, full.fine) and torch.equal(new.coarse, full.coarse)
        if state is not None and n_kernels(s, 8, 4) == n_kernels(s - 1, 8, 4):
            assert new.fine is state.fine     # nothing completed: no copy of the state
        state = new


def test_stale_or_foreign_state_is_rejected():
    k = torch.randn(1, 2, 100, 16)
    state = compress_keys(k, SMALL)
    with pytest.raises(ValueError, match="another sparse_config"):
        update_compressed(k, replace(SMALL, kernel_size=12), state)
    with pytest.raises(ValueError, match="covers 100 keys"):
        update_compressed(k[:, :, :50], SMALL, state)


# -- §3 stage 1 --------------------------------------------------------------------------------
def test_fine_kernel_visibility_is_causal():
    cfg = SparseConfig()
    k = torch.randn(1, 1, 300, 8)
    keys = compress_keys(k, cfg)
    q = torch.randn(1, 2, 300, 8)
    p = ref.head_kernel_scores(q, keys, config=cfg, scale=0.3, cache_len=0)
    for i in (30, 31, 46, 47, 127, 200, 299):
        visible = (p[0, :, i] > 0).any(0)
        n_vis = int(visible.sum())
        assert n_vis == n_kernels(i + 1, 32, 16)            # 16j + 31 <= i
        assert bool(visible[:n_vis].all())


def test_fine_scores_use_the_coarse_normaliser():
    cfg = SparseConfig()
    q, k = torch.randn(1, 1, 200, 8), torch.randn(1, 1, 200, 8)
    keys = compress_keys(k, cfg)
    p = ref.head_kernel_scores(q, keys, config=cfg, scale=0.5, cache_len=0)
    i = 150                                   # sees coarse kernel 0 only (64 + 127 > 150)
    lse = 0.5 * q[0, 0, i] @ keys.coarse[0, 0, 0]
    j = 3
    expect = math.exp(float(0.5 * q[0, 0, i] @ keys.fine[0, 0, j] - lse))
    assert p[0, 0, i, j].item() == pytest.approx(expect, rel=1e-5)


def test_group_scores_sum_over_query_heads():
    p = torch.arange(2 * 4 * 1 * 3, dtype=torch.float32).view(1, 8, 1, 3)
    s = ref.group_kernel_scores(p, hkv=2)
    assert torch.equal(s[0, 0, 0], p[0, :4, 0].sum(0)) and torch.equal(s[0, 1, 0],
                                                                      p[0, 4:, 0].sum(0))


def test_pool_takes_the_five_overlapping_kernels():
    cfg = SparseConfig()
    s = torch.zeros(12)
    s[3] = 5.0     # kernel 3 covers keys 48..79: blocks 0 and 1
    s[8] = 2.0     # kernel 8 covers keys 128..159: block 2 only (window [7, 11])
    s[11] = 1.0    # kernel 11 covers keys 176..207: blocks 2 and 3 (window of block 3 is [11, 15])
    b = ref.pool_blocks(s, cfg, 4)
    assert b.tolist() == [5.0, 5.0, 2.0, 1.0]


def test_tie_break_prefers_lower_blocks_and_pads_with_minus_one():
    cfg = SMALL   # budget 6 = topk 4 + local 2; block 16
    scores = torch.zeros(1, 1, 2, 13)
    idx = ref.topk_blocks(scores, cfg, cache_len=0)[..., :, :]
    # position 0: only block 0 exists; position 1: same block
    assert idx[0, 0, 0].tolist() == [0, -1, -1, -1, -1, -1]
    scores = torch.zeros(1, 1, 1, 13)          # a query at position 200: qb = 12
    idx = ref.topk_blocks(scores, cfg, cache_len=200)
    assert idx[0, 0, 0].tolist() == [0, 1, 2, 10, 11, 12]   # forced {0, 10, 11, 12} + ties 1, 2
    scores[..., 7] = 1.0
    scores[..., 5] = 1.0
    idx = ref.topk_blocks(scores, cfg, cache_len=200)
    assert idx[0, 0, 0].tolist() == [0, 5, 7, 10, 11, 12]


def test_forced_blocks_beat_overflowed_and_nan_scores():
    scores = torch.full((1, 1, 1, 13), float("inf"))
    scores[..., 3] = float("nan")
    ranked = ref.ranking_scores(scores, SMALL, cache_len=200)
    assert ranked[0, 0, 0, 3] == 0 and ranked[0, 0, 0, 4] == torch.finfo(torch.float32).max
    idx = ref.topk_blocks(scores, SMALL, cache_len=200)
    assert idx[0, 0, 0].tolist() == [0, 1, 2, 10, 11, 12]


# -- §4 stage 2 --------------------------------------------------------------------------------
def test_block_sparse_attention_sees_only_selected_past_keys():
    cfg = SMALL
    q, k, v = torch.randn(1, 4, 40, 8), torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8)
    idx = torch.full((1, 2, 40, 6), -1)
    idx[0, 0, :, 0] = 0                               # group 0: block 0 only
    idx[0, 1, :, 0], idx[0, 1, :, 1] = 0, 2           # group 1: blocks 0 and 2
    out = ref.block_sparse_attention(q, k, v, idx, config=cfg, scale=0.5, cache_len=0)
    for h in range(4):
        g = h // 2
        for i in (3, 15, 20, 33, 39):
            allowed = [t for t in range(i + 1) if t // 16 in idx[0, g, i].tolist()]
            w = torch.softmax(0.5 * k[0, g, allowed] @ q[0, h, i], 0)
            assert torch.allclose(out[0, h, i], w @ v[0, g, allowed], atol=1e-6)


def test_dense_attention_aligns_queries_at_absolute_positions():
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 8)
    out = dense_attention(q, k, v, 0.4, cache_len=7)
    for h in range(4):
        for t in range(5):
            n = 7 + t + 1
            w = torch.softmax(0.4 * k[0, h // 2, :n] @ q[0, h, t], 0)
            assert torch.allclose(out[0, h, t], w @ v[0, h // 2, :n], atol=1e-6)


# -- §5 the switch, use_nope and argument checks ----------------------------------------------
def test_dense_below_dense_len_and_always_sparse_with_minus_one():
    q, k, v = torch.randn(1, 2, 10, 8), torch.randn(1, 1, 10, 8), torch.randn(1, 1, 10, 8)
    out, state, idx = ref.infllmv2_attention(q, k, v, config=replace(SMALL, dense_len=11),
                                             scale=0.3, cache_len=0)
    assert idx is None and state is None
    assert torch.equal(out, dense_attention(q, k, v, 0.3, 0))
    _, state, idx = ref.infllmv2_attention(q, k, v, config=SMALL, scale=0.3, cache_len=0)
    assert idx.shape == (1, 1, 10, 6) and isinstance(state, CompressedKeys)


def test_use_nope_selects_with_pre_rope_inputs():
    cfg = replace(SMALL, use_nope=True)
    q, k, v = torch.randn(1, 2, 300, 16), torch.randn(1, 1, 300, 16), torch.randn(1, 1, 300, 16)
    q_sel, k_sel = q.clone(), k.clone()
    u = torch.nn.functional.normalize(torch.ones(16), dim=0)
    k_sel[:, :, 48:64] = 8 * u                       # needle only in the selection keys
    q_sel[:, :, -1] = 8 * u
    _, _, idx = ref.infllmv2_attention(q, k, v, config=cfg, scale=0.25, cache_len=0,
                                       q_sel=q_sel, k_sel=k_sel)
    assert 3 in idx[0, 0, -1].tolist()
    with pytest.raises(ValueError, match="use_nope=True"):
        ref.infllmv2_attention(q, k, v, config=cfg, scale=0.25, cache_len=0)
    with pytest.raises(ValueError, match="only used with use_nope=True"):
        ref.infllmv2_attention(q, k, v, config=SMALL, scale=0.25, cache_len=0, q_sel=q_sel,
                               k_sel=k_sel)


@pytest.mark.parametrize("kwargs,match", [
    ({"cache_len": 3}, "cache_len=3"),
    ({"k": torch.randn(1, 4, 10, 8)}, "multiple of KV heads"),
    ({"q": torch.randn(1, 2, 10)}, "must be 4-D"),
])
def test_bad_arguments_raise_clear_errors(kwargs, match):
    args = {"q": torch.randn(1, 6, 10, 8), "k": torch.randn(1, 2, 10, 8),
            "v": torch.randn(1, 2, 10, 8), "cache_len": 0}
    args.update(kwargs)
    if "k" in kwargs:
        args["v"] = args["k"]
    with pytest.raises(ValueError, match=match):
        ref.infllmv2_attention(args["q"], args["k"], args["v"], config=SMALL, scale=0.3,
                               cache_len=args["cache_len"])


def test_selection_needs_keys_of_the_whole_cache():
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 1, 100, 8)
    stale = compress_keys(k[:, :, :90], SMALL)
    with pytest.raises(ValueError, match="cover 90 keys"):
        ref.select_blocks(q, stale, config=SMALL, scale=0.3, cache_len=99)


def test_in_place_append_never_changes_an_older_state():
    """Decode appends completed kernels into spare room behind the state; updating an older state
    again (a branch, a rewind) must copy, so both branches keep their own kernels."""
    k1, k2 = torch.randn(1, 2, 400, 16), torch.randn(1, 2, 400, 16)
    k2[:, :, :200] = k1[:, :, :200]
    base = update_compressed(k1[:, :, :200], SMALL, compress_keys(k1[:, :, :199], SMALL))
    one = update_compressed(k1[:, :, :260], SMALL, base)
    snapshot = one.fine.clone(), one.coarse.clone()
    two = update_compressed(k2[:, :, :300], SMALL, base)       # branch from base: must not
    assert torch.equal(one.fine, snapshot[0]) and torch.equal(one.coarse, snapshot[1])
    full2 = compress_keys(k2[:, :, :300], SMALL)
    assert torch.equal(two.fine, full2.fine) and torch.equal(two.coarse, full2.coarse)
    again = update_compressed(k1[:, :, :400], SMALL, one)       # the first branch goes on
    full1 = compress_keys(k1[:, :, :400], SMALL)
    assert torch.equal(again.fine, full1.fine) and torch.equal(again.coarse, full1.coarse)
    grown = update_compressed(k1[:, :, :270], SMALL, one)        # one is now behind: copies
    assert grown.room is not again.room
