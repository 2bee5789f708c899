"""InfLLM v2 (docs/infllmv2.md) as a composition of MIL ops over the fixed-size KV state.

    out = infllmv2_attention(q, k, v, pos, start, t, config, scale, act)

q [1, Hq, T, D] (queries at absolute positions pos = start .. start + T - 1), k, v the whole
states [1, Hkv, Smax, D] (valid up to start + T; Smax a multiple of block_size). Steps, with the
reference's semantics (arkinfer/ops/infllmv2/reference.py) and its precision rules (§9):

1. compression (§2): fine / coarse keys = `avg_pool` over the cache with the kernel and stride
   -> fp32 [1, Hkv, n1max | n2max, D]. Kernels over invalid positions exist but are never
   visible (visibility is `stride*j + kernel - 1 <= pos`, which also makes decode see every
   complete kernel), so recompressing the state equals the reference's recompression.
2. scoring (§3.1-3.4), fp32: coarse log-sum-exp over visible coarse kernels, fine probabilities
   `exp(τ q·Kc1 - lse)`, 0 where invisible, NaN zeroed per head, summed over the group's heads,
   then max-pooled into blocks (window of r + 1 kernels from r*blk - 1; scores are >= 0, so the
   zero padding never changes a max).
3. selection (§3.5-3.6): ranking scores (+inf forced, -inf future, +inf score -> fp32 max, NaN
   -> 0); a block is selected iff fewer than `budget` blocks rank above it, counting equal scores
   at lower indices as above (the reference's stable sort: ties go to the lower block). That
   comparison count is exact for ties, where `topk`'s tie order is unspecified.
4. gather (§4): the selected blocks' K and V ([Hkv, T, k*block, D]) with `gather(batch_dims=1)`.
5. attention (§4) over the gathered keys: key t is used iff its block is selected and t <= pos.
6. dense / sparse switch (§5): `start + T < dense_len` selects the dense result (both are
   computed: a static graph has no branch the Neural Engine runs).
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import Var

from arkinfer.ops.infllmv2.config import SparseConfig

from .composites import MASKED, as_dtype, attention, group_queries

F32_MAX = float(np.finfo(np.float32).max)


def n_kernels(length: int, kernel: int, stride: int) -> int:
    return 0 if length < kernel else (length - kernel) // stride + 1


def compress(k: Var, kernel: int, stride: int) -> Var:
    """k [1, Hkv, Smax, D] -> fp32 [1, Hkv, n(Smax), D]: mean of k[stride*j : stride*j + kernel].

    When the kernel is a multiple of the stride (MiniCPM4: 32 / 16 and 128 / 64) the cache is
    summed per stride (reshape + reduce_sum) and a kernel adds kernel/stride neighbouring sums;
    otherwise `kernel` strided slices are added, offset by offset, like the reference."""
    hkv, smax, d = k.shape[1], k.shape[2], k.shape[3]
    n = n_kernels(smax, kernel, stride)
    kf = as_dtype(k, "fp32")
    if kernel % stride == 0 and smax % stride == 0:
        sums = mb.reduce_sum(x=mb.reshape(x=kf, shape=[1, hkv, smax // stride, stride, d]),
                             axes=[3])                                        # [1,Hkv,S/st,D]
        parts = [mb.slice_by_index(x=sums, begin=[0, 0, u, 0], end=[1, hkv, u + n, d])
                 for u in range(kernel // stride)]
    else:
        span = stride * (n - 1) + 1
        parts = [mb.slice_by_index(x=kf, begin=[0, 0, off, 0], end=[1, hkv, off + span, d],
                                   stride=[1, 1, stride, 1]) for off in range(kernel)]
    acc = parts[0]
    for part in parts[1:]:
        acc = mb.add(x=acc, y=part)
    return mb.mul(x=acc, y=np.float32(1.0 / kernel))


def _visible(pos: Var, n: int, kernel: int, stride: int) -> Var:
    """bool [T, n]: kernel j is visible to position pos[i] iff stride*j + kernel - 1 <= pos[i]."""
    ends = (stride * np.arange(n, dtype=np.int32) + kernel - 1)[None, :]
    return mb.less_equal(x=ends, y=mb.expand_dims(x=pos, axes=[1]))


def kernel_scores(q: Var, k: Var, pos: Var, config: SparseConfig, scale: float) -> Var:
    """Stage 1 steps 1-3: fp32 [1, Hkv, T, n1max] group scores s[g, i, j] (0 where invisible)."""
    _, hq, _, d = q.shape
    hkv, smax = k.shape[1], k.shape[2]
    group = hq // hkv
    ks, st = config.kernel_size, config.kernel_stride
    cks, cst = config.coarse_kernel_size, config.coarse_kernel_stride
    n1, n2 = n_kernels(smax, ks, st), n_kernels(smax, cks, cst)
    qg = mb.mul(x=as_dtype(group_queries(q, hkv, group, -1, d), "fp32"), y=np.float32(scale))
    fine, coarse = compress(k, ks, st), compress(k, cks, cst)
    coarse_logits = mb.reshape(x=mb.matmul(x=qg, y=coarse, transpose_y=True),
                               shape=[1, hkv, group, -1, n2])                  # [1,Hkv,G,T,n2]
    coarse_vis = _visible(pos, n2, cks, cst)                                   # [T, n2]
    masked = mb.select(cond=coarse_vis, a=coarse_logits, b=np.float32(-np.inf))
    # logsumexp with the max taken out; a row without any visible coarse kernel stays -inf
    # (the reference's logsumexp of nothing), which makes its fine probabilities +inf.
    top = mb.reduce_max(x=masked, axes=[-1], keep_dims=True)
    any_vis = mb.greater_equal(x=mb.expand_dims(x=pos, axes=[1]), y=np.int32(cks - 1))  # [T,1]
    top = mb.select(cond=any_vis, a=top, b=np.float32(0.0))
    lse = mb.add(x=top, y=mb.log(x=mb.reduce_sum(x=mb.exp(x=mb.sub(x=masked, y=top)),
                                                    axes=[-1], keep_dims=True)))
    fine_logits = mb.reshape(x=mb.matmul(x=qg, y=fine, transpose_y=True),
                             shape=[1, hkv, group, -1, n1])                    # [1,Hkv,G,T,n1]
    p = mb.exp(x=mb.sub(x=fine_logits, y=lse))
    p = mb.select(cond=_visible(pos, n1, ks, st), a=p, b=np.float32(0.0))
    p = mb.select(cond=mb.not_equal(x=p, y=p), a=np.float32(0.0), b=p)         # NaN -> 0, per head
    return mb.reduce_sum(x=p, axes=[2], keep_dims=False)                       # [1,Hkv,T,n1]


def block_scores(s: Var, n_blocks: int, config: SparseConfig) -> Var:
    """Stage 1 step 4: fp32 [1, Hkv, T, n1] -> [1, Hkv, T, n_blocks], b[blk] = max of s over the
    kernels r*blk - 1 .. r*blk + r - 1 that exist (r = kernels_per_block): with one zero in front
    (scores are >= 0, so zeros never change a max), block blk covers padded[r*blk : r*blk + r]
    (a reshape to [.., n_blocks, r]) plus padded[r*blk + r]."""
    r = config.kernels_per_block
    hkv, n1 = s.shape[1], s.shape[-1]
    length = r * n_blocks + 1
    tail = length - 1 - n1
    if tail >= 0:
        padded = mb.pad(x=s, pad=[0, 0, 0, 0, 0, 0, 1, tail], mode="constant",
                        constant_val=np.float32(0.0))
    else:
        padded = mb.pad(x=mb.slice_by_index(x=s, begin=[0, 0, 0, 0], end=[1, hkv, 0, n1 + tail],
                                            end_mask=[False, False, True, False]),
                        pad=[0, 0, 0, 0, 0, 0, 1, 0], mode="constant", constant_val=np.float32(0.0))
    head = mb.slice_by_index(x=padded, begin=[0, 0, 0, 0], end=[1, hkv, 0, r * n_blocks],
                             end_mask=[False, False, True, False])
    head = mb.reduce_max(x=mb.reshape(x=head, shape=[1, hkv, -1, n_blocks, r]), axes=[-1])
    nxt = mb.slice_by_index(x=padded, begin=[0, 0, 0, r], end=[1, hkv, 0, length],
                            stride=[1, 1, 1, r], end_mask=[False, False, True, False])
    return mb.maximum(x=head, y=nxt)


def select_blocks(scores: Var, pos: Var, config: SparseConfig) -> tuple[Var, Var]:
    """Stage 1 steps 5-6: block scores [1, Hkv, T, nb] -> (idx int32 [1, Hkv, T, k], valid bool
    [1, Hkv, T, k]) with k = min(budget, nb): the selected blocks <= qb in ascending order, then
    padding (valid False, idx 0). Ties go to the lower block (see the module docstring)."""
    nb = scores.shape[-1]
    blk = np.arange(nb, dtype=np.int32)
    qb = mb.expand_dims(x=mb.floor_div(x=pos, y=np.int32(config.block_size)), axes=[1])  # [T,1]
    forced = mb.logical_or(
        x=mb.less(x=blk[None, :], y=np.int32(config.init_blocks)),
        y=mb.logical_and(x=mb.greater_equal(x=blk[None, :],
                                            y=mb.sub(x=qb, y=np.int32(config.local_blocks))),
                         y=mb.less_equal(x=blk[None, :], y=qb)))               # [T, nb]
    future = mb.greater(x=blk[None, :], y=qb)
    ranked = mb.select(cond=mb.not_equal(x=scores, y=scores), a=np.float32(0.0), b=scores)
    ranked = mb.minimum(x=ranked, y=np.float32(F32_MAX))
    ranked = mb.select(cond=forced, a=np.float32(np.inf), b=ranked)
    ranked = mb.select(cond=future, a=np.float32(-np.inf), b=ranked)          # [1,Hkv,T,nb]
    # above[.., b, c]: block c ranks above block b (higher score, or equal score and lower index)
    rb = mb.expand_dims(x=ranked, axes=[-1])                                  # [..,nb,1]
    rc = mb.expand_dims(x=ranked, axes=[-2])                                  # [..,1,nb]
    lower = (blk[None, :] < blk[:, None])                                     # [nb(b), nb(c)]
    above = mb.logical_or(x=mb.greater(x=rc, y=rb),
                          y=mb.logical_and(x=mb.equal(x=rc, y=rb), y=lower))
    rank = mb.reduce_sum(x=mb.cast(x=above, dtype="int32"), axes=[-1])        # [1,Hkv,T,nb]
    chosen = mb.logical_and(x=mb.less(x=rank, y=np.int32(config.budget)),
                            y=mb.logical_not(x=future))
    # ascending block order: top-k of -blk among the chosen (distinct keys, no ties)
    # (MIL's select takes its shape from a and b, so a carries the full shape)
    neg_blk = mb.sub(x=mb.mul(x=mb.cast(x=rank, dtype="fp32"), y=np.float32(0.0)),
                     y=blk.astype(np.float32))
    key = mb.select(cond=chosen, a=neg_blk, b=np.float32(MASKED))
    k = min(config.budget, nb)
    values, idx = mb.topk(x=key, k=k, axis=-1, ascending=False)
    valid = mb.greater(x=values, y=np.float32(MASKED / 2))
    return mb.select(cond=valid, a=idx, b=np.int32(0)), valid


def gather_blocks(x: Var, idx: Var, block_size: int) -> Var:
    """x [1, Hkv, Smax, D], idx int32 [1, Hkv, T, k] -> [Hkv, T, k*block, D]: the selected
    blocks of every query, in idx order."""
    hkv, smax, d = x.shape[1], x.shape[2], x.shape[3]
    blocks = mb.reshape(x=x, shape=[hkv, smax // block_size, block_size * d])
    flat_idx = mb.reshape(x=idx, shape=[hkv, -1])                             # [Hkv, T*k]
    got = mb.gather(x=blocks, indices=flat_idx, axis=1, batch_dims=1)         # [Hkv,T*k,B*D]
    k = idx.shape[-1]
    return mb.reshape(x=got, shape=[hkv, -1, k * block_size, d])


def sparse_attention(q: Var, k: Var, v: Var, pos: Var, idx: Var, valid: Var,
                     config: SparseConfig, scale: float) -> Var:
    """Stage 2 on gathered blocks: fp32 [1, Hq, T, D]."""
    _, hq, _, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    bs, kk = config.block_size, idx.shape[-1]
    kg = as_dtype(gather_blocks(k, idx, bs), "fp32")                          # [Hkv,T,kB,D]
    vg = as_dtype(gather_blocks(v, idx, bs), "fp32")
    qt = mb.reshape(x=as_dtype(q, "fp32"), shape=[hkv, group, -1, d])         # [Hkv,G,T,D]
    qt = mb.transpose(x=qt, perm=[0, 2, 1, 3])                                # [Hkv,T,G,D]
    logits = mb.matmul(x=mb.mul(x=qt, y=np.float32(scale)), y=kg, transpose_y=True)  # [Hkv,T,G,kB]
    offs = np.arange(bs, dtype=np.int32)
    key_pos = mb.add(x=mb.expand_dims(x=mb.mul(x=mb.squeeze(x=idx, axes=[0]), y=np.int32(bs)),
                                      axes=[-1]), y=offs)                     # [Hkv,T,k,B]
    ok = mb.logical_and(x=mb.expand_dims(x=mb.squeeze(x=valid, axes=[0]), axes=[-1]),
                        y=mb.less_equal(x=key_pos, y=mb.reshape(x=pos, shape=[1, -1, 1, 1])))
    ok = mb.expand_dims(x=mb.reshape(x=ok, shape=[hkv, -1, kk * bs]), axes=[2])  # [Hkv,T,1,kB]
    probs = mb.softmax(x=mb.select(cond=ok, a=logits, b=np.float32(MASKED)), axis=-1)
    out = mb.matmul(x=probs, y=vg)                                            # [Hkv,T,G,D]
    out = mb.transpose(x=out, perm=[0, 2, 1, 3])                              # [Hkv,G,T,D]
    return mb.reshape(x=out, shape=[1, hq, -1, d])


def infllmv2_attention(q: Var, k: Var, v: Var, pos: Var, start: Var, t: Var | int,
                       config: SparseConfig, scale: float, act: str) -> Var:
    """InfLLM v2 attention (module docstring); -> [1, Hq, T, D] in `act`."""
    smax = k.shape[2]
    n_blocks = smax // config.block_size
    s = kernel_scores(q, k, pos, config, scale)
    idx, valid = select_blocks(block_scores(s, n_blocks, config), pos, config)
    sparse = as_dtype(sparse_attention(q, k, v, pos, idx, valid, config, scale), act)
    if config.dense_len < 0:
        return sparse
    dense = attention(q, k, v, pos, scale, act)
    total = mb.add(x=start, y=t)                                              # [1]
    is_dense = mb.less(x=total, y=np.int32(config.dense_len))
    return mb.select(cond=mb.reshape(x=is_dense, shape=[1, 1, 1, 1]), a=dense, b=sparse)


def selection(q: Var, k: Var, pos: Var, config: SparseConfig, scale: float) -> Var:
    """The selected blocks as the reference returns them: int32 [1, Hkv, T, budget], ascending,
    -1 for unused entries (for tests and `verify.py`)."""
    n_blocks = k.shape[2] // config.block_size
    idx, valid = select_blocks(block_scores(kernel_scores(q, k, pos, config, scale), n_blocks,
                                            config), pos, config)
    idx = mb.select(cond=valid, a=idx, b=np.int32(-1))
    pad = config.budget - idx.shape[-1]
    if pad > 0:  # fewer blocks than the budget: -1 columns (MIL's pad takes floats only)
        filler = mb.fill(shape=mb.concat(values=[mb.slice_by_index(x=mb.shape(x=idx), begin=[0],
                                                                   end=[3]), np.array([pad], np.int32)],
                                         axis=0), value=-1.0)
        idx = mb.concat(values=[idx, mb.cast(x=filler, dtype="int32")], axis=-1)
    return idx
