"""InfLLM v2 conformance (docs/infllmv2.md §6) for every implementation in impls/.

Small sparse configs (kernel 8/4, block 16, window 32, topk 4: budget 96 keys) exercise the
semantics quickly; a few cases use MiniCPM4.1's real config at lengths just past 6144 / 8192.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import pytest
import torch
from infllmv2_checks import (
    SMALL,
    check_chunked_prefill,
    check_decode,
    check_dense_len_exact,
    check_matches_reference,
    check_needle,
    check_overflowing_head,
    check_no_quadratic_allocation,
    check_short_positions_dense,
    check_stage2_any_idx,
    check_ties,
    needle_qkv,
    random_qkv,
)

from arkinfer.ops.infllmv2 import SparseConfig

DEFAULT = SparseConfig()
F32, BF16 = torch.float32, torch.bfloat16


def _need(impl, dtype=F32):
    if dtype not in impl.dtypes:
        pytest.skip(f"{impl.name} does not support {dtype}")


def _not_reference(impl, dtype=F32):
    if impl.is_reference:
        pytest.skip("the reference is the yardstick of cross-implementation checks")
    _need(impl, dtype)


# §6.5: every GQA group size x head_dim x dtype once; lengths multiple of 64 / of 16 only /
# neither; dense_len -1, 0 and above the length, in rotation.
LENGTHS = (256, 208, 333, 300)
CROSS = [
    pytest.param(group, d, dtype, LENGTHS[i % 4], (-1, 0, None, 250)[i % 4],
                 id=f"g{group}-d{d}-{str(dtype)[6:]}-L{LENGTHS[i % 4]}")
    for i, (group, d, dtype) in enumerate(product((1, 2, 8, 16), (64, 128), (F32, BF16)))
]


@pytest.mark.parametrize("group,d,dtype,length,dense_len", CROSS)
def test_matches_reference_small_config(impl, group, d, dtype, length, dense_len):
    _not_reference(impl, dtype)
    hkv = 2 if group <= 8 else 1
    dense_len = length + 10 if dense_len is None else dense_len
    q, k, v = random_qkv(group * hkv, hkv, d, length, dtype, batch=1 + (group == 2), seed=group)
    check_matches_reference(impl, q, k, v, replace(SMALL, dense_len=dense_len))


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_matches_reference_minicpm_config(impl, dtype):
    _not_reference(impl, dtype)
    q, k, v = random_qkv(4, 2, 64, 8192 + 37, dtype, seed=5)
    check_matches_reference(impl, q, k, v, DEFAULT)


def test_matches_reference_mid_sequence_chunk(impl):
    _not_reference(impl)
    q, k, v = random_qkv(4, 1, 64, 301, seed=6)
    check_matches_reference(impl, q[:, :, 190:], k, v, SMALL, cache_len=190)


@pytest.mark.parametrize("length", [200, 208])
def test_short_positions_equal_dense_small(impl, length):
    q, k, v = random_qkv(4, 2, 64, length, seed=2)
    check_short_positions_dense(impl, q, k, v, SMALL)


def test_short_positions_equal_dense_minicpm(impl):
    q, k, v = random_qkv(2, 1, 64, 6144 + 100, seed=3)
    check_short_positions_dense(impl, q, k, v, DEFAULT)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_dense_len_above_length_is_exactly_dense(impl, dtype):
    _need(impl, dtype)
    q, k, v = random_qkv(8, 2, 64, 150, dtype, seed=4)
    check_dense_len_exact(impl, q, k, v, SMALL)


@pytest.mark.parametrize("dense_len", [-1, 30])
def test_chunked_prefill_equals_one_shot(impl, dense_len):
    q, k, v = random_qkv(8, 2, 64, 300, seed=8)
    check_chunked_prefill(impl, q, k, v, replace(SMALL, dense_len=dense_len), [37, 64, 100])


def test_chunked_prefill_equals_one_shot_minicpm(impl):
    q, k, v = random_qkv(2, 1, 64, 7000, seed=9)
    check_chunked_prefill(impl, q, k, v, replace(DEFAULT, dense_len=-1), [3000, 3500])


@pytest.mark.parametrize("dense_len", [-1, 170])
def test_decode_incremental_state(impl, dense_len):
    # dense_len=170: steps below 170 run dense with no state; step 170 compresses once.
    q, k, v = random_qkv(4, 2, 64, 200, seed=10)
    check_decode(impl, q, k, v, replace(SMALL, dense_len=dense_len), prompt=150)


# Decode (one query per call, state carried) for every group size x head_dim x dtype: the fast
# path's decode kernels specialise on these (C kernels for groups 8 and 16, torch otherwise).
# Lengths 190..207 cross a block boundary, so steps with and without a partial last block occur.
@pytest.mark.parametrize("group,d,dtype", [
    pytest.param(group, d, dtype, id=f"g{group}-d{d}-{str(dtype)[6:]}")
    for group, d, dtype in product((1, 2, 8, 16), (64, 128), (F32, BF16))])
def test_decode_matches_reference_every_group(impl, group, d, dtype):
    _not_reference(impl, dtype)
    hkv = 2 if group <= 8 else 1
    q, k, v = random_qkv(group * hkv, hkv, d, 208, dtype, batch=1 + (group == 8), seed=30 + group)
    check_decode(impl, q, k, v, SMALL, prompt=190)


def test_decode_crossing_minicpm_dense_len(impl):
    q, k, v = random_qkv(4, 2, 64, 8192 + 8, seed=12)
    check_decode(impl, q, k, v, DEFAULT, prompt=8189)


def test_needle_small(impl):
    check_needle(impl, SMALL, 400, needle_block=3)


def test_needle_minicpm(impl):
    check_needle(impl, DEFAULT, 8192 + 64, needle_block=20)


def test_overwhelming_needle_matches_reference(impl):
    # Logits of 40^2 / 8 = 200 nats: exp overflows fp32, so stage 1 clamps and stage 2 must not
    # produce inf/NaN (the fast path falls back to its rescaling softmax here).
    check_needle(impl, SMALL, 400, needle_block=3, strength=40.0)
    if not impl.is_reference:
        q, k, v = needle_qkv(SMALL, 400, 3, strength=40.0)
        check_matches_reference(impl, q, k, v, SMALL)


def test_one_overflowing_head_does_not_wipe_the_group(impl):
    _need(impl)
    check_overflowing_head(impl, SMALL)


@pytest.mark.parametrize("config,length", [(SMALL, 333), (DEFAULT, 6144 + 700)],
                         ids=["small", "minicpm"])
def test_ties_go_to_the_lower_block(impl, config, length):
    _not_reference(impl)
    check_ties(impl, config, length)


@pytest.mark.parametrize("queries", [1, 5, 150])
def test_stage2_on_hand_made_idx(impl, queries):
    if impl.stage2 is None:
        pytest.skip(f"{impl.name} does not expose stage 2 alone")
    check_stage2_any_idx(impl, queries)


def _memory_impl(impl):
    if not (impl.tracks_memory and impl.sparse_is_fast):
        pytest.skip(f"{impl.name}: not a fast path with torch-visible allocations")


def test_no_quadratic_allocation(impl):
    _memory_impl(impl)
    check_no_quadratic_allocation(impl, 8192, DEFAULT)


@pytest.mark.heavy
def test_no_quadratic_allocation_32k(impl):
    _memory_impl(impl)
    if not impl.heavy:
        pytest.skip(f"{impl.name}: heavy tests run for the main variant only")
    # One full GQA group (16 query heads per KV head) at head_dim 64: the allocation pattern of
    # MiniCPM4.1-8B at a quarter of the arithmetic.
    check_no_quadratic_allocation(impl, 32768, DEFAULT, hq=16, hkv=1, d=64)
