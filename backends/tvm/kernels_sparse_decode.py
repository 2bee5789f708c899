"""InfLLM v2 stage 2 for one decode query on the host build (llvm CPUs): attention over the
selected blocks only, a block gather, instead of the portable module's masked dense softmax.

The portable module (what the OpenCL builds compile) computes stage 2 as a softmax over all L
keys with unselected blocks masked out, O(L) per query whatever the budget. For decode (T = 1)
the host module calls this PrimFunc instead; it visits a block's keys only when the block is
selected, so a sparse step reads `budget` blocks of K and V (plus the O(L / block) ranks).

    sparse_decode_attention(hq, hkv, dim, block, budget, scale, dense_len)
        -> PrimFunc(q [B, Hq, 1, D], k [B, Hkv, L, D], v [B, Hkv, L, D],
                    rank int32 [B, Hkv, 1, NB], L int64, dense_len int64, out [B, Hkv, G, 1, D])
    rank: kernels_infllmv2.block_rank (block c is selected iff rank < budget; NB = ceil(L /
    block)). The call is dense when `not sparse_switch(L, dense_len)` (every block visited).
    L and dense_len are int64 arguments (relax PrimValues: the key count's shape variable, and
    dense_len's variable or constant).

Per query head (B * Hq in parallel; head h = query head // G): pass 1 takes the maximum score
over the visited keys, pass 2 sums exp(score - max) and exp(score - max) * v, then divides: the
masked softmax's arithmetic over the same keys (the decode query sits at position L - 1, so
every key j < L is causal). Dot products run as 8 fp32 lanes (vectorised) summed at the end,
so results differ from the masked dense path by fp32 summation order only (checked against it
and against the reference model in tests/backends/tvm/test_tvm_infllmv2.py).
"""

from __future__ import annotations

from tvm.script import tirx as T

LANES = 8  # fp32 lanes of one AVX2 register: a dot product's partial sums


def supported(dim: int) -> bool:
    """True for a head_dim this kernel takes (whole 8-lane chunks)."""
    return dim % LANES == 0


def sparse_decode_attention(hq: int, hkv: int, dim: int, block: int, budget: int, scale: float):
    """The PrimFunc of the module doc for these sizes (dim a multiple of LANES)."""
    if not supported(dim):
        raise ValueError(f"head_dim {dim} is not a multiple of {LANES}")
    group, chunks = hq // hkv, dim // LANES

    @T.prim_func(private=True)
    def func(q_h: T.handle, k_h: T.handle, v_h: T.handle, rank_h: T.handle, length: T.int64,
             dense_len: T.int64, out_h: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})
        batch, blocks = T.int64(), T.int64()
        q = T.match_buffer(q_h, (batch, hq, 1, dim), "float32")
        k = T.match_buffer(k_h, (batch, hkv, length, dim), "float32")
        v = T.match_buffer(v_h, (batch, hkv, length, dim), "float32")
        rank = T.match_buffer(rank_h, (batch, hkv, 1, blocks), "int32")
        out = T.match_buffer(out_h, (batch, hkv, group, 1, dim), "float32")
        for row in T.parallel(batch * hq):
            lanes = T.alloc_local((LANES,), "float32")
            acc = T.alloc_local((dim,), "float32")
            top = T.alloc_local((1,), "float32")
            total = T.alloc_local((1,), "float32")
            b = row // hq
            head = row % hq
            kv = head // group
            # infllmv2.sparse_switch's rule (the spec's §5 switch), written out for TVMScript
            sparse = T.Or(dense_len < T.int64(0), length >= dense_len)
            top[0] = T.min_value("float32")
            total[0] = T.float32(0)
            for d in range(dim):
                acc[d] = T.float32(0)
            for step in range(2):   # 0: the maximum score; 1: the weighted sums
                for c in range(blocks):
                    if T.Or(T.Not(sparse), rank[b, kv, 0, c] < budget):
                        for r in range(block):
                            j = c * block + r
                            if j < length:
                                for i in T.vectorized(LANES):
                                    lanes[i] = T.float32(0)
                                for o in range(chunks):
                                    for i in T.vectorized(LANES):
                                        lanes[i] = lanes[i] + q[b, head, 0, o * LANES + i] * \
                                            k[b, kv, j, o * LANES + i]
                                score = T.float32(scale) * (
                                    ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
                                    + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])))
                                if step == 0:
                                    top[0] = T.max(top[0], score)
                                else:
                                    p = T.exp(score - top[0])
                                    total[0] = total[0] + p
                                    for o in range(chunks):
                                        for i in T.vectorized(LANES):
                                            acc[o * LANES + i] = acc[o * LANES + i] + \
                                                p * v[b, kv, j, o * LANES + i]
            for d in range(dim):
                out[b, kv, head % group, 0, d] = acc[d] / total[0]

    return func
