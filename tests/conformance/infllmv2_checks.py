"""InfLLM v2 conformance checks (docs/infllmv2.md §6), as plain functions.

Each `check_*` takes an implementation (`Infllmv2Impl`) and raises AssertionError with a readable
message when the implementation breaks an invariant; the pytest files only choose the cases.
Keeping them plain functions lets tests/conformance/test_infllmv2_catches_bugs.py prove that
deliberately wrong implementations fail them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from arkinfer.ops.infllmv2 import (
    CompressedKeys,
    SparseConfig,
    compress_keys,
    dense_attention,
)
from arkinfer.ops.infllmv2 import reference as ref

# Output tolerance per dtype, one table for every comparison: (atol, rtol). bf16 outputs are
# rounded to 8 mantissa bits after fp32 accumulation, so two correct backends may differ by 1 ulp.
TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (2e-5, 1e-4),
    torch.bfloat16: (1e-2, 1.6e-2),
    torch.float16: (2e-3, 2e-3),
}
# Block scores are fp32 in every backend; blocks whose scores agree to this relative tolerance are
# a genuine tie up to summation order, and either choice is conformant.
SCORE_RTOL = 1e-4

SMALL = SparseConfig(kernel_size=8, kernel_stride=4, block_size=16, init_blocks=1, window_size=32,
                     topk=4, dense_len=-1)
"""A miniature of MiniCPM4.1's config (budget 6 blocks of 16 = 96 keys) that keeps tests fast."""


@dataclass(frozen=True)
class Infllmv2Impl:
    """One implementation under test: `attention` has the signature of
    `arkinfer.ops.infllmv2.infllmv2_attention`. `tracks_memory`: its tensors are torch tensors
    whose allocations a TorchDispatchMode sees (needed by the no-L^2 check)."""

    name: str
    attention: Callable[..., tuple[Tensor, CompressedKeys | None, Tensor | None]]
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
    tracks_memory: bool = True
    sparse_is_fast: bool = True   # False for the reference: O(T * S) by design
    is_reference: bool = False    # the yardstick itself: cross-implementation checks are moot
    # Optional: stage 2 alone, `block_sparse_attention(q, k, v, idx, *, config, scale,
    # cache_len)`, checked against the reference on hand-made idx (holes in the window etc.).
    stage2: Callable[..., Tensor] | None = None
    heavy: bool = True            # also run the heavy (32K) tests; False for minor variants
    # True: below dense_len the output is bit-identical to torch's dense attention (it calls
    # the same kernel). Runtimes with their own dense kernel (onnxruntime) compare with tolerance.
    exact_dense: bool = True


def random_qkv(hq: int, hkv: int, d: int, length: int, dtype: torch.dtype = torch.float32,
               batch: int = 1, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """q [B, Hq, L, D], k/v [B, Hkv, L, D] of a whole sequence, N(0, 1), in dtype."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, hq, length, d, generator=g)
    k = torch.randn(batch, hkv, length, d, generator=g)
    v = torch.randn(batch, hkv, length, d, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def assert_close(actual: Tensor, expected: Tensor, what: str) -> None:
    atol, rtol = TOLERANCE[expected.dtype]
    a, e = actual.float(), expected.float()
    err = (a - e).abs()
    bad = err > atol + rtol * e.abs()
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.numel()} values outside "
                             f"atol={atol}, rtol={rtol} for {expected.dtype}; max error "
                             f"{float(err.max()):.3g}, first at {where}")


def assert_same_selection(actual: Tensor, expected: Tensor, scores: Tensor, what: str,
                          max_tie_rows: float = 0.01) -> None:
    """idx [B, Hkv, T, budget] equal, except rows where the differing blocks' reference scores
    (scores [B, Hkv, T, n_blocks]) tie to SCORE_RTOL — at most `max_tie_rows` of the rows."""
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: idx shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    rows = (actual != expected).any(-1).nonzero().tolist()
    if len(rows) > max(1, max_tie_rows * expected[..., 0].numel()):
        raise AssertionError(f"{what}: {len(rows)} of {expected[..., 0].numel()} query rows "
                             f"select different blocks, e.g. at {tuple(rows[0])}: "
                             f"{actual[tuple(rows[0])].tolist()} vs "
                             f"{expected[tuple(rows[0])].tolist()}")
    for r in rows:
        a, e = set(actual[tuple(r)].tolist()), set(expected[tuple(r)].tolist())
        diff = sorted((a ^ e) - {-1})
        row_scores = scores[tuple(r)]
        vals = row_scores[diff] if diff and max(diff) < row_scores.numel() else None
        tie = (vals is not None and torch.isfinite(vals).all()
               and float(vals.max() - vals.min()) <= SCORE_RTOL * float(vals.abs().max()) + 1e-30)
        if not tie or len(a) != len(e):
            raise AssertionError(f"{what}: query row {tuple(r)} selects {sorted(a)} but the "
                                 f"reference selects {sorted(e)}, and the differing blocks "
                                 f"{diff} are not tied in score")


def _ref_scores(q: Tensor, k: Tensor, config: SparseConfig, scale: float, cache_len: int
                ) -> Tensor:
    """The reference's ranking scores: forced blocks +inf (so never a tie), future blocks -inf."""
    scores = ref.block_scores(q, compress_keys(k, config), config=config, scale=scale,
                              cache_len=cache_len)
    return ref.ranking_scores(scores, config, cache_len)


def _run(impl: Infllmv2Impl, q, k, v, config, cache_len=0, state=None):
    return impl.attention(q, k, v, config=config, scale=q.shape[-1] ** -0.5,
                          cache_len=cache_len, state=state)


# -- §6.5 cross-implementation agreement --------------------------------------------------------
def check_matches_reference(impl: Infllmv2Impl, q: Tensor, k: Tensor, v: Tensor,
                            config: SparseConfig, cache_len: int = 0) -> None:
    """Same idx (up to score ties) and outputs within TOLERANCE as the reference, for one call."""
    scale = q.shape[-1] ** -0.5
    out, _, idx = _run(impl, q, k, v, config, cache_len)
    r_out, _, r_idx = ref.infllmv2_attention(q, k, v, config=config, scale=scale,
                                             cache_len=cache_len)
    if r_idx is None:
        if idx is not None:
            raise AssertionError(f"{impl.name}: returned block indices for a dense call "
                                 f"(total {k.shape[2]} < dense_len {config.dense_len})")
        assert_close(out, r_out, f"{impl.name} dense output")
        return
    if idx is None:
        raise AssertionError(f"{impl.name}: ran dense although total {k.shape[2]} >= "
                             f"dense_len {config.dense_len}")
    assert_same_selection(idx, r_idx, _ref_scores(q, k, config, scale, cache_len),
                          f"{impl.name} block selection")
    # Stage 2 judged on the implementation's own idx, so a tie resolved the other way is fine.
    expected = r_out if torch.equal(idx, r_idx) else ref.block_sparse_attention(
        q, k, v, idx, config=config, scale=scale, cache_len=cache_len)
    assert_close(out, expected, f"{impl.name} sparse output")
    if out.dtype != q.dtype or out.shape != q.shape:
        raise AssertionError(f"{impl.name}: output {out.dtype} {tuple(out.shape)}, expected "
                             f"{q.dtype} {tuple(q.shape)}")


# -- §6.1 positions < budget * block_size see everything -------------------------------------
def check_short_positions_dense(impl: Infllmv2Impl, q: Tensor, k: Tensor, v: Tensor,
                                config: SparseConfig) -> None:
    """Always-sparse prefill: rows below budget*block_size equal dense attention and select
    blocks 0..qb."""
    config = replace(config, dense_len=-1)
    n = config.full_visibility_len
    out, _, idx = _run(impl, q, k, v, config)
    dense = dense_attention(q[:, :, :n], k[:, :, :n], v[:, :, :n], q.shape[-1] ** -0.5, 0)
    assert_close(out[:, :, :n], dense, f"{impl.name}: positions < {n} vs dense attention")
    qb = torch.arange(n) // config.block_size
    slots = torch.arange(config.budget)
    want = torch.where(slots <= qb[:, None], slots, -1).expand_as(idx[:, :, :n])
    if not torch.equal(idx[:, :, :n], want):
        raise AssertionError(f"{impl.name}: positions < {n} must select every block 0..qb")


# -- §6.2 dense_len above the length: exactly dense ------------------------------------------
def check_dense_len_exact(impl: Infllmv2Impl, q: Tensor, k: Tensor, v: Tensor,
                          config: SparseConfig) -> None:
    """total < dense_len: bit-identical to dense attention, no idx; total == dense_len: sparse."""
    total = k.shape[2]
    out, _, idx = _run(impl, q, k, v, replace(config, dense_len=total + 1))
    if idx is not None:
        raise AssertionError(f"{impl.name}: dense_len={total + 1} > {total} must run dense")
    dense = dense_attention(q, k, v, q.shape[-1] ** -0.5, 0)
    if not impl.exact_dense:
        torch.testing.assert_close(out, dense, msg=lambda m: f"{impl.name}: dense_len above the "
                                   f"length must equal dense attention: {m}")
    elif not torch.equal(out, dense):
        raise AssertionError(f"{impl.name}: dense_len above the length must equal dense "
                             "attention exactly")
    _, _, idx = _run(impl, q, k, v, replace(config, dense_len=total))
    if idx is None:
        raise AssertionError(f"{impl.name}: total {total} == dense_len must run sparse")


# -- §6.3 incremental decode and chunked prefill ----------------------------------------------
def check_chunked_prefill(impl: Infllmv2Impl, q: Tensor, k: Tensor, v: Tensor,
                          config: SparseConfig, chunks: list[int]) -> None:
    """Prefill in chunks (absolute positions, state carried) == one-shot prefill, when every
    chunk takes the sparse path (dense_len = -1 or <= the first chunk's length)."""
    total = k.shape[2]
    scale = q.shape[-1] ** -0.5
    one_out, _, one_idx = _run(impl, q, k, v, config)
    outs, idxs, state, start = [], [], None, 0
    for size in chunks + [total - sum(chunks)]:
        end = start + size
        out, state, idx = _run(impl, q[:, :, start:end], k[:, :, :end], v[:, :, :end], config,
                               cache_len=start, state=state)
        outs.append(out)
        idxs.append(idx)
        start = end
    if any(i is None for i in idxs) != (one_idx is None):
        raise AssertionError(f"{impl.name}: chunks and one-shot prefill took different paths")
    if one_idx is not None:
        assert_same_selection(torch.cat(idxs, 2), one_idx, _ref_scores(q, k, config, scale, 0),
                              f"{impl.name} chunked vs one-shot selection")
    assert_close(torch.cat(outs, 2), one_out, f"{impl.name} chunked vs one-shot prefill")
    _check_state(impl, state, k, config)


def check_decode(impl: Infllmv2Impl, q: Tensor, k: Tensor, v: Tensor, config: SparseConfig,
                 prompt: int) -> None:
    """Prefill `prompt` tokens, then decode the rest one token at a time carrying the state:
    every step matches the reference, and the final state equals recompressing the cache.
    With prompt + 1 < dense_len <= length this also crosses dense_len (one-time compression)."""
    total = k.shape[2]
    scale = q.shape[-1] ** -0.5
    _, state, _ = _run(impl, q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt], config)
    for p in range(prompt, total):
        s = p + 1
        args = (q[:, :, p:s], k[:, :, :s], v[:, :, :s])
        out, state, idx = _run(impl, *args, config, cache_len=p, state=state)
        r_out, _, r_idx = ref.infllmv2_attention(*args, config=config, scale=scale, cache_len=p)
        if (idx is None) != (r_idx is None):
            raise AssertionError(f"{impl.name}: decode step at position {p} (total {s}, "
                                 f"dense_len {config.dense_len}) took the wrong path")
        if idx is not None:
            assert_same_selection(idx, r_idx, _ref_scores(args[0], args[1], config, scale, p),
                                  f"{impl.name} decode selection at position {p}")
            if not torch.equal(idx, r_idx):
                r_out = ref.block_sparse_attention(*args, idx, config=config, scale=scale,
                                                   cache_len=p)
        assert_close(out, r_out, f"{impl.name} decode output at position {p}")
    _check_state(impl, state, k, config)


def _check_state(impl: Infllmv2Impl, state: CompressedKeys | None, k: Tensor,
                 config: SparseConfig) -> None:
    if config.is_dense(k.shape[2]):
        return
    full = compress_keys(k, config)
    if state is None or state.length != full.length:
        raise AssertionError(f"{impl.name}: final state covers "
                             f"{None if state is None else state.length} keys, not {full.length}")
    for name in ("fine", "coarse"):
        got, want = getattr(state, name), getattr(full, name)
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-6, atol=1e-6):
            raise AssertionError(f"{impl.name}: incremental {name} compressed keys "
                                 f"{tuple(got.shape)} differ from recompressing the whole cache "
                                 f"{tuple(want.shape)}")


# -- §6.4 needle ---------------------------------------------------------------------------------
def needle_qkv(config: SparseConfig, length: int, needle_block: int, hq: int = 4, hkv: int = 1,
               d: int = 64, queries: int = 4, strength: float = 8.0
               ) -> tuple[Tensor, Tensor, Tensor]:
    """Random q/k/v with key block `needle_block` set to strength * u, its values to 5, and the
    last `queries` queries set to strength * u (u a unit vector): logits strength^2 / sqrt(d)."""
    q, k, v = random_qkv(hq, hkv, d, length, seed=7)
    if (length - 1) // config.block_size - needle_block <= config.local_blocks:
        raise ValueError("the needle must lie behind the local window")
    u = torch.nn.functional.normalize(torch.randn(d, generator=torch.Generator().manual_seed(3)),
                                      dim=0)
    lo, hi = needle_block * config.block_size, (needle_block + 1) * config.block_size
    k[:, :, lo:hi] = strength * u
    v[:, :, lo:hi] = 5.0
    q[:, :, -queries:] = strength * u
    return q, k, v


def check_needle(impl: Infllmv2Impl, config: SparseConfig, length: int, needle_block: int,
                 queries: int = 4, strength: float = 8.0) -> None:
    """Plant one key block aligned with the last `queries` queries far behind the window: it
    must be selected, and attention must land on its values. A large `strength` (logits far
    beyond exp's fp32 range) also exercises overflow handling."""
    config = replace(config, dense_len=-1)
    q, k, v = needle_qkv(config, length, needle_block, queries=queries, strength=strength)
    out, _, idx = _run(impl, q, k, v, config)
    for t in range(length - queries, length):
        if not bool((idx[:, :, t] == needle_block).any(-1).all()):
            raise AssertionError(f"{impl.name}: needle block {needle_block} not selected by the "
                                 f"query at position {t}: {idx[0, 0, t].tolist()}")
    if not bool((out[:, :, -queries:].float() > 4.0).all()):
        raise AssertionError(f"{impl.name}: attention of the needle queries does not land on the "
                             "needle's values")


def check_overflowing_head(impl: Infllmv2Impl, config: SparseConfig, length: int = 400,
                           needle_block: int = 3, queries: int = 4) -> None:
    """One head's fp32 stage-1 scores overflow (q 1e20 . k 1e22 = inf; inf - lse inf = NaN) at
    the needle's kernels. NaN counts as 0 *per head, before the group sum* (docs/infllmv2.md §9):
    the group's other heads still select the needle block, exactly as the reference does — in
    prefill and in a decode step. Zeroing NaN after the sum loses the needle instead."""
    config = replace(config, dense_len=-1)
    q, k, v = needle_qkv(config, length, needle_block, queries=queries)
    lo = needle_block * config.block_size
    k[:, 0, lo:lo + config.block_size, 0] = 1e22
    q[:, :, -queries:, 0] = 0.0      # the other heads never touch the huge component ...
    q[:, 0, -queries:, 0] = 1e20     # ... head 0 overflows on it
    scale = q.shape[-1] ** -0.5
    _, _, r_idx = ref.infllmv2_attention(q, k, v, config=config, scale=scale, cache_len=0)
    if not bool((r_idx[:, :, -queries:] == needle_block).any(-1).all()):
        raise AssertionError("test premise: the reference should still select the needle")
    _, _, idx = _run(impl, q, k, v, config)
    if not torch.equal(idx[:, :, -queries:], r_idx[:, :, -queries:]):
        raise AssertionError(f"{impl.name}: with one head's scores overflowing, prefill selects "
                             f"{idx[0, 0, -1].tolist()}, the reference {r_idx[0, 0, -1].tolist()}"
                             " (NaN must count as 0 per head, before the group sum)")
    p = length - 1
    _, state, _ = _run(impl, q[:, :, :p], k[:, :, :p], v[:, :, :p], config)
    _, _, d_idx = _run(impl, q[:, :, p:], k, v, config, cache_len=p, state=state)
    if not torch.equal(d_idx[:, :, -1], r_idx[:, :, -1]):
        raise AssertionError(f"{impl.name}: with one head's scores overflowing, a decode step "
                             f"selects {d_idx[0, 0, -1].tolist()}, the reference "
                             f"{r_idx[0, 0, -1].tolist()}")


# -- §4 stage 2 on any idx ------------------------------------------------------------------------
def check_stage2_any_idx(impl: Infllmv2Impl, queries: int, seed: int = 0) -> None:
    """Stage 2 alone on random idx rows (random subsets of blocks <= qb: holes in the local window,
    no own block, empty rows excluded) for the last `queries` positions, against the reference."""
    cfg = SMALL
    g = torch.Generator().manual_seed(seed)
    q, k, v = random_qkv(8, 2, 64, 300, seed=seed)
    cache_len = 300 - queries
    q = q[:, :, cache_len:]
    idx = torch.full((1, 2, queries, cfg.budget), -1)
    for h in range(2):
        for t in range(queries):
            qb = (cache_len + t) // cfg.block_size
            blocks = torch.randperm(qb + 1, generator=g)[:cfg.budget].sort().values
            keep = blocks[torch.rand(blocks.numel(), generator=g) < 0.7]
            keep = keep if keep.numel() else blocks[:1]
            idx[0, h, t, :keep.numel()] = keep
    kw = {"config": cfg, "scale": 0.125, "cache_len": cache_len}
    assert_close(impl.stage2(q, k, v, idx, **kw), ref.block_sparse_attention(q, k, v, idx, **kw),
                 f"{impl.name} stage 2 on hand-made idx ({queries} queries)")


# -- §3.6 deterministic tie-break ---------------------------------------------------------------
def check_ties(impl: Infllmv2Impl, config: SparseConfig, length: int, hq: int = 4, hkv: int = 2,
               d: int = 64) -> None:
    """Every key identical, so every candidate block scores the same: the selection must be the
    reference's exactly (lower block index wins), e.g. init + blocks 1, 2, ... + the window."""
    config = replace(config, dense_len=-1)
    q, _, v = random_qkv(hq, hkv, d, length, seed=13)
    k = torch.randn(1, hkv, 1, d, generator=torch.Generator().manual_seed(14))
    k = k.expand(1, hkv, length, d).contiguous()
    _, _, idx = _run(impl, q, k, v, config)
    _, _, r_idx = ref.infllmv2_attention(q, k, v, config=config, scale=d ** -0.5, cache_len=0)
    if not torch.equal(idx, r_idx):
        rows = (idx != r_idx).any(-1).nonzero()
        r = tuple(rows[0].tolist())
        raise AssertionError(f"{impl.name}: tied scores must go to the lower block index; "
                             f"{len(rows)} rows differ, e.g. {r}: {idx[r].tolist()} vs "
                             f"{r_idx[r].tolist()}")


# -- §6.6 no L x L allocation ------------------------------------------------------------------
class LargestAllocation(TorchDispatchMode):
    """Records the largest tensor storage any aten op creates (views of inputs excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.numel, self.op = 0, ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, Tensor) and t.untyped_storage().data_ptr() not in inputs:
                n = t.untyped_storage().nbytes() // max(1, t.element_size())
                if n > self.numel:
                    self.numel, self.op = n, str(func)
        return out


def check_no_quadratic_allocation(impl: Infllmv2Impl, length: int, config: SparseConfig,
                                  hq: int = 2, hkv: int = 1, d: int = 64) -> None:
    """Sparse prefill of `length` tokens never creates a tensor of length^2 elements or more."""
    q, k, v = random_qkv(hq, hkv, d, length, seed=11)
    with LargestAllocation() as seen:
        _run(impl, q, k, v, replace(config, dense_len=-1))
    if seen.numel >= length * length:
        raise AssertionError(f"{impl.name}: prefill of {length} tokens allocated {seen.numel} "
                             f"elements in {seen.op} (>= L^2 = {length * length})")


# -- a quick pass over every invariant (for the bug-catching tests and new backends) -----------
def quick_suite(impl: Infllmv2Impl) -> dict[str, str]:
    """Run every check once on small cases; return {check name: failure message} (empty: pass)."""
    cfg = SMALL
    q, k, v = random_qkv(8, 2, 64, 300, seed=1)
    checks: dict[str, Callable[[], None]] = {
        "matches_reference": lambda: check_matches_reference(impl, q, k, v, cfg),
        "short_positions_dense": lambda: check_short_positions_dense(impl, q, k, v, cfg),
        "dense_len_exact": lambda: check_dense_len_exact(impl, q, k, v, cfg),
        "chunked_prefill": lambda: check_chunked_prefill(impl, q, k, v, cfg, [37, 64, 100]),
        "decode": lambda: check_decode(impl, q[:, :, :180], k[:, :, :180], v[:, :, :180],
                                       replace(cfg, dense_len=170), prompt=150),
        "needle": lambda: check_needle(impl, cfg, 400, needle_block=3),
        "ties": lambda: check_ties(impl, cfg, 333),
    }
    if impl.tracks_memory and impl.sparse_is_fast:
        checks["no_quadratic_allocation"] = lambda: check_no_quadratic_allocation(impl, 1024, cfg)
    failures = {}
    for name, check in checks.items():
        try:
            check()
        except AssertionError as e:
            failures[name] = str(e)
    return failures
