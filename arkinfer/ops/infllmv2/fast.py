"""InfLLM v2 attention, fast CPU implementation (torch): the entry point a model calls per layer.

Stages: `compress.update_compressed` (incremental: only kernels completed by new keys are
computed), `select.select_blocks` (chunked scoring, exact int64 top-k) and
`sparse_attention.block_sparse_attention` (gathers only selected blocks); a sparse decode step
(one query) runs `decode.py`, both stages fused. Same results as `reference.py`: identical block
indices (up to float near-ties) and outputs within tolerance.
"""

from __future__ import annotations

from torch import Tensor

from arkinfer.ops.infllmv2.common import (
    AttentionResult,
    CompressedKeys,
    check_inputs,
    run_infllmv2,
)
from arkinfer.ops.infllmv2.compress import update_compressed
from arkinfer.ops.infllmv2.config import SparseConfig
from arkinfer.ops.infllmv2.decode import decode_is_sparse, decode_step
from arkinfer.ops.infllmv2.select import select_blocks
from arkinfer.ops.infllmv2.sparse_attention import block_sparse_attention

__all__ = ["block_sparse_attention", "infllmv2_attention", "select_blocks", "update_compressed"]


def infllmv2_attention(q: Tensor, k: Tensor, v: Tensor, *, config: SparseConfig, scale: float,
                       cache_len: int, state: CompressedKeys | None = None,
                       q_sel: Tensor | None = None, k_sel: Tensor | None = None
                       ) -> AttentionResult:
    """InfLLM v2 attention for one layer, functional (state in, state out).

    q [B, Hq, T, D]: the T new queries, at absolute positions cache_len .. cache_len + T - 1.
    k, v [B, Hkv, cache_len + T, D]: the whole cache *including* this call's keys.
    scale: softmax scale (1/sqrt(D) for MiniCPM4); also the stage-1 scale.
    state: the CompressedKeys returned by this layer's previous call, or None to compress the whole
        cache (first call, or the first sparse step after crossing dense_len).
    q_sel, k_sel: pre-RoPE queries / keys (same shapes as q / k) used for block selection when
        config.use_nope; required then, rejected otherwise.

    Returns (out [B, Hq, T, D] in q.dtype, state, idx): when cache_len + T < dense_len the call is
    plain dense causal attention, state is passed through unchanged and idx is None; otherwise
    state is the CompressedKeys of the whole cache and idx int64 [B, Hkv, T, budget] holds each
    query's selected blocks in ascending order followed by -1 padding.
    """
    if q.shape[2] == 1 and not config.is_dense(k.shape[2]) and decode_is_sparse(cache_len, config):
        plan = getattr(getattr(state, "room", None), "plan", None)   # the layer's DecodePlan
        if plan is not None and q_sel is None:
            step = plan.step(q, k, v, state, config, scale, cache_len)    # None: not as planned
            if step is not None:
                return step
        check_inputs(q, k, v, cache_len, config, state, q_sel, k_sel)
        keys = update_compressed(k if k_sel is None else k_sel, config, state)
        out, idx = decode_step(q, k, v, keys, config=config, scale=scale, cache_len=cache_len,
                               q_sel=q_sel)
        return out, keys, idx
    return run_infllmv2(q, k, v, config=config, scale=scale, cache_len=cache_len, state=state,
                        q_sel=q_sel, k_sel=k_sel, compress=update_compressed,
                        select=select_blocks, attend=block_sparse_attention)
