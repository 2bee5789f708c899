"""Fast decode (one new query per sequence), stages 1 and 2 fused (docs/infllmv2.md §3-§4, §10).

`decode_step` is what a model's decode step runs: with the C kernel of `native.py` (any GQA group,
fp32 / bf16 / fp16 caches, head_dim a multiple of 16) it is one call that selects the blocks and
attends to them for every KV head, on torch's threads, reading the selected KV rows in place.
Otherwise the same arithmetic runs in torch, organised so a step costs few ops and reads each
byte it needs about once:
  * stage 1 scores all KV heads with one batched matmul against the fine compressed keys; the
    coarse normaliser comes from those same logits (a coarse kernel is the mean of the four
    disjoint fine kernels tiling it, so q.Kc2[c] is the mean of four fine logits) instead of a
    second pass over the coarse keys;
  * the forced blocks (init, local window) are known, so top-k runs only over the candidate blocks
    between them, with one exact int64 top-k (score bits, then lower block first);
  * stage 2 copies the selected full blocks, a few at a time, into a small buffer that stays in
    the L2 cache (the copy streams from memory near full bandwidth; matmuls reading scattered
    blocks straight from DRAM run well below it), scores them with one batched matmul per chunk,
    takes one softmax over every selected key, then gathers V alike.
Shapes: B batch, Hkv KV heads, G = Hq / Hkv query heads per KV head, D head_dim, BH = B * Hkv.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from arkinfer.ops.infllmv2.common import CompressedKeys, check_keys_cover
from arkinfer.ops.infllmv2.config import COARSE_FACTOR, SparseConfig
from arkinfer.ops.infllmv2.native import DecodePlan, kernels

__all__ = ["decode_attention", "decode_idx", "decode_is_sparse", "decode_select", "decode_step"]

_CHUNK_BYTES = 512 * 1024      # K (or V) bytes of all BH heads copied per chunk: half of L2
_BLOCK_BITS = 24               # block ids below 2^24 (1G tokens at block_size 64)
_BLOCK_MASK = (1 << _BLOCK_BITS) - 1
_FLT_MAX = torch.finfo(torch.float32).max


def decode_is_sparse(cache_len: int, config: SparseConfig) -> bool:
    """True when the query at position cache_len has more past blocks than the budget, so the
    selection drops some (below that it sees every block: plain dense attention)."""
    return cache_len // config.block_size + 1 > config.budget


def decode_step(q: Tensor, k: Tensor, v: Tensor, keys: CompressedKeys, *, config: SparseConfig,
                scale: float, cache_len: int, q_sel: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """A whole sparse decode step (decode_is_sparse must hold): q [B, Hq, 1, D] attends to
    k / v [B, Hkv, cache_len + 1, D] (rows of D contiguous), the blocks chosen with q_sel (default
    q) and the compressed keys of the whole cache -> (out [B, Hq, 1, D] in q.dtype,
    idx int64 [B, Hkv, 1, budget]). With the C kernel, the call's fixed arguments are built once
    per layer (a `DecodePlan` kept on the state's `KernelRoom`): a step is one C call."""
    sel = q if q_sel is None else q_sel
    check_keys_cover(keys, cache_len + 1)
    room = keys.room          # a decode state's buffers: the layer's DecodePlan lives there
    plan = getattr(room, "plan", None)
    if plan is not None and plan.fits(sel, q, keys, k, v, config, scale):
        return plan.run(sel, q, keys, k, v, config, scale, cache_len)
    native = kernels()
    if (native is not None and k.dtype == v.dtype
            and native.supports(q.shape[3], q, sel, k, v, keys.fine, keys.coarse)):
        plan = DecodePlan(native, sel, q, keys, k, v, config, scale)
        if room is not None:
            room.plan = plan
        return plan.run(sel, q, keys, k, v, config, scale, cache_len)
    far = decode_select(sel, keys, config=config, scale=scale, cache_len=cache_len)
    out = decode_attention(q, k, v, far, config=config, scale=scale, cache_len=cache_len)
    return out, decode_idx(far, config, cache_len, q.shape[0])


def decode_select(q: Tensor, keys: CompressedKeys, *, config: SparseConfig, scale: float,
                  cache_len: int) -> Tensor:
    """Stage 1 for one query per sequence at position cache_len (decode_is_sparse must hold).

    q [B, Hq, 1, D] -> far [BH, topk - 1] int64: the selected blocks outside the local window,
    ascending (the init blocks, then the top-scoring candidates). The full idx row is far followed
    by the window blocks qb - local_blocks .. qb (see `decode_idx`)."""
    b, hq, _, d = q.shape
    check_keys_cover(keys, cache_len + 1)
    hkv = keys.fine.shape[1]
    bh, group = b * hkv, hq // hkv
    native = kernels()
    if native is not None and native.supports(d, q, keys.fine, keys.coarse):
        idx = torch.empty(bh, config.budget, dtype=torch.int64)
        native.decode(q, None, keys, None, None, config=config, scale=scale,
                      cache_len=cache_len, idx=idx, out=None)
        return idx[:, :config.topk - 1]
    qf = q.reshape(bh, group, d).float().mul(scale)
    fine = keys.fine.reshape(bh, -1, d)
    # keys as the tall left operand: ~1.3x faster than q @ K^T with G rows
    logits = torch.bmm(fine, qf.transpose(1, 2)).transpose(1, 2)
    lse = _coarse_lse(logits, qf, keys, config)                                 # [BH, G]
    # p_h[j] = exp(logit - lse_h); a NaN (inf - inf) counts as 0 *per head*, before the group
    # sum, as the reference does (one overflowing head must not wipe the others' scores).
    p = torch.nan_to_num_(logits.sub_(lse[..., None]).exp_(), nan=0.0, posinf=float("inf"))
    s = p.sum(1)                                                                # [BH, n1]
    return _top_candidates(s, config, cache_len)


def decode_idx(far: Tensor, config: SparseConfig, cache_len: int, b: int) -> Tensor:
    """far [BH, topk - 1] -> the idx row layout [B, Hkv, 1, budget]: far, then the window."""
    qb = cache_len // config.block_size
    window = torch.arange(qb - config.local_blocks, qb + 1).expand(far.shape[0], -1)
    return torch.cat([far, window], 1).view(b, -1, 1, config.budget)


def decode_attention(q: Tensor, k: Tensor, v: Tensor, far: Tensor, *, config: SparseConfig,
                     scale: float, cache_len: int) -> Tensor:
    """Stage 2 for one query per sequence: q [B, Hq, 1, D], k/v [B, Hkv, cache_len + 1, D] (any
    strides with rows of D contiguous), far from `decode_select` -> [B, Hq, 1, D] in q.dtype.
    The query attends to the far blocks and to every key from the window's first block on."""
    b, hq, _, d = q.shape
    hkv = k.shape[1]
    bh, group, bs = b * hkv, hq // hkv, config.block_size
    end = cache_len + 1
    n_full = end // bs                                  # blocks wholly in the cache
    first = cache_len // bs - config.local_blocks       # the window's first block
    rows = torch.cat([far, torch.arange(first, n_full).expand(bh, -1)], 1)  # [BH, n_sel]
    qf = q.reshape(bh, group, d).float().mul(scale)
    k_blocks = _block_rows(k, n_full, bs)
    v_blocks = _block_rows(v, n_full, bs)
    chunk = max(1, _CHUNK_BYTES // (bh * bs * d * k.element_size()))
    buf = torch.empty(bh, min(chunk, rows.shape[1]), bs * d, dtype=k.dtype)
    spans = [(lo, min(rows.shape[1], lo + chunk)) for lo in range(0, rows.shape[1], chunk)]

    scores = [torch.bmm(qf, _gather(k_blocks, rows, lo, hi, buf, d).transpose(1, 2))
              for lo, hi in spans]                                              # [BH, G, n]
    k_tail = k[:, :, n_full * bs:end].reshape(bh, -1, d).float()                # < 1 block
    scores.append(torch.bmm(qf, k_tail.transpose(1, 2)))
    probs = torch.softmax(torch.cat(scores, 2), dim=-1)                         # [BH, G, N]

    n_blk = rows.shape[1] * bs
    v_tail = v[:, :, n_full * bs:end].reshape(bh, -1, d).float()
    out = torch.bmm(probs[:, :, n_blk:], v_tail)                                # [BH, G, D]
    for lo, hi in spans:
        out.baddbmm_(probs[:, :, lo * bs:hi * bs], _gather(v_blocks, rows, lo, hi, buf, d))
    return out.view(b, hq, 1, d).to(q.dtype)


def _coarse_lse(logits: Tensor, qf: Tensor, keys: CompressedKeys, config: SparseConfig
                ) -> Tensor:
    """logits [BH, G, n1] -> logsumexp over the coarse kernels of scale * q . Kc2, [BH, G].

    Coarse kernel c covers keys [4sc, 4sc + 4k) (k, s the fine kernel and stride): when s divides
    k these are the fine kernels 4c + m*k/s, m = 0..3, so its logit is the mean of theirs."""
    n2 = keys.coarse.shape[2]
    k, s = config.kernel_size, config.kernel_stride
    if k % s:
        coarse = keys.coarse.reshape(logits.shape[0], n2, -1)
        return torch.logsumexp(torch.bmm(coarse, qf.transpose(1, 2)), dim=1)
    if n2 == 0:       # no complete coarse kernel: logsumexp of nothing
        return logits.new_full(logits.shape[:2], float("-inf"))
    step = k // s
    # Fine kernels 4c + m*step for c = 0 .. n2-1: the slice starting at m*step with stride 4.
    sums = logits[..., :COARSE_FACTOR * (n2 - 1) + 1:COARSE_FACTOR].clone()
    for m in range(1, COARSE_FACTOR):
        sums += logits[..., m * step:m * step + COARSE_FACTOR * (n2 - 1) + 1:COARSE_FACTOR]
    return torch.logsumexp(sums.mul_(1.0 / COARSE_FACTOR), dim=2)


def _top_candidates(s: Tensor, config: SparseConfig, cache_len: int) -> Tensor:
    """Kernel scores s [BH, n1] -> far [BH, topk - 1]: the init blocks and the best candidates
    init_blocks .. first - 1 (first = the window's first block), ascending.

    Block blk pools kernels [r*blk - 1, r*blk + r - 1] (r = kernels per block), so the candidates
    need kernels below r * first only. Ties go to the lower block: the key is (score bits << 24)
    | (2^24 - 1 - blk), and a non-negative float's bits order like the float."""
    init, r = config.init_blocks, config.kernels_per_block
    first = cache_len // config.block_size - config.local_blocks
    width = r * first
    s = s[:, :width] if s.shape[1] >= width else F.pad(s, (0, width - s.shape[1]))
    pooled = F.max_pool1d(s[:, None], r + 1, r, padding=1)[:, 0, init:first]   # [BH, cand]
    bits = pooled.clamp_(0.0, _FLT_MAX).view(torch.int32).to(torch.int64)
    key = (bits << _BLOCK_BITS) | (_BLOCK_MASK - torch.arange(init, first))
    n_free = config.topk - init - 1        # budget - init - (local_blocks + 1)
    top = key.topk(n_free, dim=-1, sorted=False).values
    free = (_BLOCK_MASK - (top & _BLOCK_MASK)).sort(-1).values
    return torch.cat([torch.arange(init).expand(s.shape[0], -1), free], 1)


def _block_rows(x: Tensor, n_full: int, bs: int) -> list[Tensor]:
    """x [B, Hkv, S, D] -> per (batch, head) a [n_full, bs * D] view of its full blocks (a copy
    only if a head's rows are not contiguous)."""
    return [x[i, h, :n_full * bs].reshape(n_full, bs * x.shape[3])
            for i in range(x.shape[0]) for h in range(x.shape[1])]


def _gather(blocks: list[Tensor], rows: Tensor, lo: int, hi: int, buf: Tensor, d: int
            ) -> Tensor:
    """Copy blocks rows[:, lo:hi] of every head into buf -> fp32 [BH, (hi - lo) * bs, D]."""
    out = buf[:, :hi - lo]
    for i, head in enumerate(blocks):
        torch.index_select(head, 0, rows[i, lo:hi], out=out[i])
    return out.view(out.shape[0], -1, d).float()
