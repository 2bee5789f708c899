"""The C decode step (arkinfer/ops/infllmv2/decode_kernel.c) against the literal reference
(arkinfer/ops/infllmv2/reference.py) and the pure-torch decode path: every GQA group size, fp32 /
bf16 / fp16 caches, strided tensors, separate selection queries, 1 to 3 threads. Skipped, with the
reason, where the kernel cannot be built (the conformance suite covers the torch path there)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from arkinfer.ops.infllmv2 import SparseConfig, compress_keys, infllmv2_attention
from arkinfer.ops.infllmv2 import reference as ref
from arkinfer.ops.infllmv2.decode import decode_select, decode_step
from arkinfer.ops.infllmv2.native import kernels, torch_only

native = kernels()
needs_native = pytest.mark.skipif(native is None, reason="no C compiler or no AVX2/FMA CPU: the "
                                  "decode path runs pure torch (tests/conformance covers it)")

SMALL = SparseConfig(kernel_size=8, kernel_stride=4, block_size=16, init_blocks=1, window_size=32,
                     topk=4, dense_len=-1)
# Output tolerance per dtype (atol, rtol), as tests/conformance/infllmv2_checks.py.
TOL = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (1e-2, 1.6e-2), torch.float16: (2e-3, 2e-3)}


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _case(group: int, hkv: int, batch: int, d: int, length: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, group * hkv, 1, d, generator=g).to(dtype)
    k = torch.randn(batch, hkv, length, d, generator=g).to(dtype)
    v = torch.randn(batch, hkv, length, d, generator=g).to(dtype)
    return q, k, v


def _check_against_reference(q, k, v, config, q_sel=None, k_sel=None):
    """One native decode step == the reference: same idx, output within the dtype's tolerance."""
    cache_len = k.shape[2] - 1
    scale = q.shape[-1] ** -0.5
    keys = compress_keys(k if k_sel is None else k_sel, config)
    out, idx = decode_step(q, k, v, keys, config=config, scale=scale, cache_len=cache_len,
                           q_sel=q_sel)
    r_config = replace(config, use_nope=q_sel is not None)
    _, _, r_idx = ref.infllmv2_attention(q, k, v, config=r_config, scale=scale,
                                         cache_len=cache_len, q_sel=q_sel, k_sel=k_sel)
    assert torch.equal(idx, r_idx)
    want = ref.block_sparse_attention(q, k, v, idx, config=config, scale=scale,
                                      cache_len=cache_len)
    atol, rtol = TOL[q.dtype]
    assert out.dtype == q.dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), want.float(), atol=atol, rtol=rtol)
    return out, idx


@needs_native
@pytest.mark.parametrize("group,hkv,batch,d,dtype,threads", [
    (1, 2, 1, 64, torch.float32, 1), (2, 2, 2, 128, torch.bfloat16, 2),
    (3, 1, 1, 64, torch.float16, 2), (4, 2, 1, 128, torch.float32, 3),
    (5, 1, 2, 64, torch.bfloat16, 1), (8, 2, 1, 64, torch.float16, 3),
    (12, 1, 1, 128, torch.float32, 2), (16, 1, 1, 128, torch.bfloat16, 3),
    (16, 2, 1, 64, torch.float32, 2), (24, 1, 1, 64, torch.float32, 1)])
def test_decode_step_matches_reference(group, hkv, batch, d, dtype, threads):
    """Group sizes with and without a full tile of 8 / 16 heads, all dtypes, threads splitting
    whole heads (heads % threads == 0) or every phase (otherwise)."""
    torch.set_num_threads(threads)
    for length in (300, 305, 320):     # partial last block, and none
        q, k, v = _case(group, hkv, batch, d, length, dtype, seed=group * 10 + length)
        _check_against_reference(q, k, v, SMALL)


@needs_native
@pytest.mark.parametrize("group,dtype", [(16, torch.bfloat16), (2, torch.float32)])
def test_minicpm_config_and_thread_counts_agree_bitwise(group, dtype):
    """MiniCPM4.1's config past 8K (its group of 16, and the memory-bound group 2 whose scores
    are dot products); the split over threads does not change a single bit."""
    cfg = replace(SparseConfig(), dense_len=-1)
    q, k, v = _case(group, 2, 1, 128, 8192 + 77, dtype, seed=1)
    results = []
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        results.append(_check_against_reference(q, k, v, cfg))
    for out, idx in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(idx, results[0][1])


@needs_native
def test_strided_tensors_and_separate_selection_queries():
    """q as a transposed [B, T, Hq, D] buffer, a KV cache with spare capacity (head stride >
    S * D), and use_nope-style selection queries / keys that differ from the attention ones."""
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(5)
    b, hq, hkv, d, length = 2, 8, 2, 64, 290
    q = torch.randn(b, 1, hq, d, generator=g).transpose(1, 2)            # non-contiguous
    cache = torch.randn(2, b, hkv, length + 40, d, generator=g)[:, :, :, :length]
    k, v = cache[0], cache[1]
    q_sel = torch.randn(b, hq, 1, d, generator=g)
    k_sel = torch.randn(b, hkv, length, d, generator=g)
    _check_against_reference(q, k, v, SMALL)
    _check_against_reference(q, k, v, replace(SMALL, use_nope=True), q_sel=q_sel, k_sel=k_sel)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_native_and_torch_paths_agree(dtype):
    """The C step and the pure-torch step: same blocks, outputs within the dtype's tolerance;
    the selection-only entry (select.py's decode) gives the same blocks too."""
    q, k, v = _case(4, 2, 1, 64, 333, dtype, seed=3)
    keys = compress_keys(k[:, :, :332], SMALL)
    out, _, idx = infllmv2_attention(q, k, v, config=SMALL, scale=0.125, cache_len=332,
                                     state=keys)
    with torch_only():
        t_out, _, t_idx = infllmv2_attention(q, k, v, config=SMALL, scale=0.125, cache_len=332,
                                             state=keys)
    assert torch.equal(idx, t_idx)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), t_out.float(), atol=atol, rtol=rtol)
    far = decode_select(q, compress_keys(k, SMALL), config=SMALL, scale=0.125, cache_len=332)
    assert torch.equal(far, idx[:, :, 0, :SMALL.topk - 1].reshape(far.shape))


@needs_native
def test_extreme_logits_keep_the_reference_semantics():
    """Logits far past exp's fp32 range (a needle of strength 40: 200 nats) select the needle and
    attend to its values without inf/NaN; a key component of 1e22 against one head's query
    component of 1e20 overflows that head only (NaN counts as 0 per head, docs/infllmv2.md §9)."""
    q, k, v = _case(4, 1, 1, 64, 400, torch.float32, seed=7)
    u = torch.nn.functional.normalize(torch.randn(64, generator=torch.Generator().manual_seed(3)),
                                      dim=0)
    k[:, :, 48:64] = 40 * u
    v[:, :, 48:64] = 5.0
    q[:, :, 0] = 40 * u
    out, idx = _check_against_reference(q, k, v, SMALL)
    assert (idx == 3).any() and bool((out > 4.0).all())
    k[:, 0, 48:64, 0] = 1e22
    q[:, :, 0, 0] = 0.0
    q[:, 0, 0, 0] = 1e20
    keys = compress_keys(k, SMALL)
    _, idx = decode_step(q, k, v, keys, config=SMALL, scale=0.125, cache_len=399)
    _, _, r_idx = ref.infllmv2_attention(q, k, v, config=SMALL, scale=0.125, cache_len=399)
    assert torch.equal(idx, r_idx) and (idx == 3).any()


def test_unsupported_head_dim_runs_torch():
    """head_dim 72 (not a multiple of 16): the torch path, still exact."""
    q, k, v = _case(4, 1, 1, 72, 300, torch.float32, seed=9)
    _check_against_reference(q, k, v, SMALL)
    if native is not None:
        assert not native.supports(72, q) and native.supports(64, q[..., :64])
    with torch_only():
        assert kernels() is None
    assert kernels() is native


_FALLBACK = """
import warnings, torch
from dataclasses import replace
from arkinfer.ops.infllmv2 import SparseConfig, infllmv2_attention
from arkinfer.ops.infllmv2 import reference
from arkinfer.ops.infllmv2.native import kernels
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert kernels() is None
if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):  # else no build is tried
    assert any("torch path" in str(w.message) for w in caught), [str(w.message) for w in caught]
cfg = replace(SparseConfig(kernel_size=8, kernel_stride=4, block_size=16, window_size=32, topk=4),
              dense_len=-1)
g = torch.Generator().manual_seed(0)
q = torch.randn(1, 16, 1, 64, generator=g)
k, v = torch.randn(2, 1, 1, 300, 64, generator=g)
out, _, idx = infllmv2_attention(q, k, v, config=cfg, scale=0.125, cache_len=299)
r_out, _, r_idx = reference.infllmv2_attention(q, k, v, config=cfg, scale=0.125, cache_len=299)
assert torch.equal(idx, r_idx) and torch.allclose(out, r_out, atol=1e-5)
"""


def test_a_failed_build_falls_back_to_torch(tmp_path):
    """No working compiler (CC=false) on a fresh cache: a warning, then the torch path, correct."""
    env = {**os.environ, "CC": "false", "XDG_CACHE_HOME": str(tmp_path), "ARKINFER_NATIVE": "1"}
    result = subprocess.run([sys.executable, "-c", _FALLBACK], env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("kernel", "stride"), [(32, 16), (128, 64), (12, 5)])
def test_c_kernel_means_are_the_torch_bits(dtype, kernel, stride):
    """The kernels a decode step completes, computed in C, equal compress.kernel_means bit for
    bit (same summation order, same final multiply), on a strided cache."""
    from arkinfer.ops.infllmv2.compress import kernel_means
    big = torch.randn(2, 3, 400, 48, generator=torch.Generator().manual_seed(kernel)) * 7
    k = big.to(dtype)[:, :, :, :32]            # rows contiguous, the cache wider than head_dim
    first, count = 3, (400 - kernel) // stride - 2
    out = torch.full((2, 3, count + 5, 32), float("nan"))[:, :, 1:count + 1]
    assert native.kernel_means_into(k, kernel, stride, first, out)
    assert torch.equal(out, kernel_means(k, kernel, stride, first, count))


@needs_native
@pytest.mark.skipif(native is None or not native.use_avx512(),
                    reason="this CPU has no AVX-512F: only the AVX2 tiles run")
@pytest.mark.parametrize("group,d,dtype", [(1, 128, torch.float32), (2, 64, torch.bfloat16),
                                           (3, 64, torch.float32), (5, 128, torch.float32),
                                           (8, 64, torch.bfloat16), (12, 128, torch.float32),
                                           (16, 128, torch.float32), (16, 64, torch.float16),
                                           (20, 128, torch.float32), (32, 128, torch.bfloat16)])
def test_avx512_tiles_give_the_avx2_bits(group, d, dtype):
    """The AVX-512 score and weighted-sum tiles (groups > 4 heads; weighted sums from 3) do each
    lane's multiply-adds in the AVX2 tiles' order, and the 16-lane exponential phases (coarse
    means and log-sum-exp, group sum, chunk softmax; every group) add in the AVX2 loops' order:
    same idx, same output bits, and both match the reference."""
    torch.set_num_threads(2)
    q, k, v = _case(group, 2, 1, d, 8192 + 33, dtype, seed=group)
    cfg = replace(SparseConfig(), dense_len=-1)
    amx = native.use_amx()
    try:
        native.use_amx(False)            # bf16: the AVX tiles, not AMX (its own test below)
        native.use_avx512(False)
        assert not native.use_avx512()
        narrow = _check_against_reference(q, k, v, cfg)
        native.use_avx512(True)
        assert native.use_avx512()
        wide = _check_against_reference(q, k, v, cfg)
    finally:
        native.use_avx512(True)
        native.use_amx(amx)
    assert torch.equal(wide[1], narrow[1]) and torch.equal(wide[0], narrow[0])


def _within_one_bf16_ulp(a: torch.Tensor, b: torch.Tensor) -> bool:
    """|a - b| <= one bf16 step (2^-7 relative) of the larger magnitude, elementwise, or 1e-5
    (outputs near zero are sums that cancel: fp32 rounding of O(1) terms, not a bf16 step)."""
    a, b = a.float(), b.float()
    return bool(((a - b).abs() <= 2.0 ** -7 * torch.maximum(a.abs(), b.abs()) + 1e-5).all())


@needs_native
@pytest.mark.skipif(native is None or not native.use_amx(),
                    reason="this CPU (or its OS) gives no AMX-BF16: bf16 stage 2 runs AVX tiles")
@pytest.mark.parametrize("group,hkv,batch,d,length,threads", [
    (1, 2, 1, 128, 8192 + 33, 2), (3, 1, 2, 64, 8192 + 47, 1), (8, 2, 1, 128, 8192 + 1, 2),
    (16, 2, 1, 128, 8192 + 77, 2), (16, 1, 1, 96, 8192 + 50, 3), (20, 1, 1, 64, 8192 + 15, 2),
    (32, 2, 1, 128, 8192 + 64, 2)])
def test_amx_stage2_matches_the_avx_path(group, hkv, batch, d, length, threads):
    """bf16 stage 2 on AMX tiles (decode_amx.h): the same blocks as the AVX path (stage 1 does
    not change), outputs within one bf16 step of it and within tolerance of the reference, for
    groups below, at and above one 16-head tile, head_dim 64 / 96 / 128 and row runs whose last
    tile is short (lengths not a multiple of 16)."""
    torch.set_num_threads(threads)
    q, k, v = _case(group, hkv, batch, d, length, torch.bfloat16, seed=group + length)
    cfg = replace(SparseConfig(), dense_len=-1)
    assert native.use_amx()
    tiles = _check_against_reference(q, k, v, cfg)
    try:
        native.use_amx(False)
        avx = _check_against_reference(q, k, v, cfg)
    finally:
        native.use_amx(True)
    assert torch.equal(tiles[1], avx[1])
    assert _within_one_bf16_ulp(tiles[0], avx[0])


@needs_native
@pytest.mark.skipif(native is None or not native.use_amx(),
                    reason="this CPU (or its OS) gives no AMX-BF16: bf16 stage 2 runs AVX tiles")
def test_amx_stage2_with_strided_queries_and_small_blocks():
    """A transposed bf16 query buffer and a padded cache on AMX tiles, with the small test config
    (16-row blocks: every run is one short tile)."""
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(8)
    b, hq, hkv, d, length = 2, 8, 2, 64, 290
    q = torch.randn(b, 1, hq, d, generator=g).transpose(1, 2).to(torch.bfloat16)
    cache = torch.randn(2, b, hkv, length + 40, d, generator=g).to(torch.bfloat16)[:, :, :, :length]
    _check_against_reference(q, cache[0], cache[1], SMALL)


@needs_native
def test_decode_plan_is_rebuilt_when_the_cache_moves():
    """Consecutive steps reuse the layer's DecodePlan (kept on the state's KernelRoom); steps on
    a cache that moved (regrown by concatenation) or with other threads get a fresh one. Every
    step equals a plan-free call on the same tensors."""
    from arkinfer.ops.infllmv2 import reserve_room
    torch.set_num_threads(2)
    q, k, v = _case(4, 2, 1, 64, 340, torch.float32, seed=9)
    scale = 64 ** -0.5
    state = reserve_room(compress_keys(k[:, :, :300], SMALL))
    plans: list = []                          # kept alive: distinct objects, not reused ids
    for p in range(300, 340):
        kk, vv = k[:, :, :p + 1], v[:, :, :p + 1]
        if p % 10 == 5:                       # the cache moves: a new buffer
            kk, vv = kk.clone(), vv.clone()
        if p == 330:
            torch.set_num_threads(1)
        out, state, idx = infllmv2_attention(q, kk, vv, config=SMALL, scale=scale,
                                             cache_len=p, state=state)
        if not any(state.room.plan is seen for seen in plans):
            plans.append(state.room.plan)
        plain = compress_keys(kk, SMALL)      # no room: no plan kept
        want, want_idx = decode_step(q, kk, vv, plain, config=SMALL, scale=scale, cache_len=p)
        assert plain.room is None
        assert torch.equal(idx, want_idx) and torch.equal(out, want)
    # the first; two per one-step move (305, 315, 325, 335: to the copy and back); threads (330)
    assert len(plans) == 10


@needs_native
def test_planned_step_gives_the_general_paths_results(monkeypatch):
    """infllmv2_attention's planned step (`DecodePlan.step`: a few comparisons, then the one C
    call) returns what the general path returns, bit for bit, state included; a step that is not
    as planned (a kernel to emit, a moved cache, other threads, an older state) goes the general
    way. The same steps run twice: as shipped, and with the planned step switched off."""
    from arkinfer.ops.infllmv2 import native as native_module
    from arkinfer.ops.infllmv2 import reserve_room
    q, k, v = _case(8, 2, 1, 64, 340, torch.bfloat16, seed=11)
    scale = 64 ** -0.5
    planned = native_module.DecodePlan.step
    taken = {"planned": 0, "general": 0}

    def counting(self, *args):
        result = planned(self, *args)
        taken["planned" if result is not None else "general"] += 1
        return result

    def run_steps() -> list:
        torch.set_num_threads(2)
        state = reserve_room(compress_keys(k[:, :, :300], SMALL))
        saved, results = None, []
        for p in range(300, 340):
            kk, vv = k[:, :, :p + 1], v[:, :, :p + 1]
            if p % 10 == 5:                     # the cache moves
                kk, vv = kk.clone(), vv.clone()
            if p == 310:
                saved = state
            if p == 320:                        # a rewind: decode again from an older state
                state = saved
            if p == 330:
                torch.set_num_threads(1)
            cfg = replace(SMALL) if p >= 335 else SMALL   # equal, not the same object
            out, state, idx = infllmv2_attention(q, kk, vv, config=cfg, scale=scale,
                                                 cache_len=p, state=state)
            results.append((out, idx, state.fine.clone(), state.coarse.clone(), state.length))
        return results

    monkeypatch.setattr(native_module.DecodePlan, "step", counting)
    fast = run_steps()
    assert taken["planned"] > 10 and taken["general"] > 5
    monkeypatch.setattr(native_module.DecodePlan, "step", lambda self, *args: None)
    general = run_steps()
    for (o1, i1, f1, c1, n1), (o2, i2, f2, c2, n2) in zip(fast, general, strict=True):
        assert torch.equal(o1, o2) and torch.equal(i1, i2)
        assert torch.equal(f1, f2) and torch.equal(c1, c2) and n1 == n2
