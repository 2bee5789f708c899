"""InfLLM v2 block-sparse decode (stage 2 of docs/infllmv2.md §4, one query) as a Metal kernel,
`mx.fast.metal_kernel`. UNTESTED ON METAL: this machine has no Metal; see README.md.

    if metal_available():
        out = block_sparse_decode(q, k, v, idx, scale=s, block_size=64, cache_len=c)

q [B, Hq, 1, D]; k, v [B, Hkv, S, D] (S = cache_len + 1); idx int32 [B, Hkv, 1, W] (selected
blocks, -1 unused) -> fp32 [B, Hq, 1, D]. One SIMD group (32 threads) per query head: lane l
visits keys l, l + 32, ... of every selected block, up to the query's position, keeping an
online softmax (running max m, normaliser l, accumulator acc[D]) in fp32; the lanes then merge
with simd_max / simd_sum. Only the selected blocks' K and V are read: 2 * W * block_size * D
elements per KV head, the decode cost of docs/infllmv2.md §8, instead of 2 * S * D.

The capability check is `metal_available()`: mx.metal.is_available() (False with mlx[cpu]) and
ARKINFER_MLX_METAL_KERNEL != "0" (to force the MLX-ops path on a Mac, e.g. to compare). Without
Metal, `infllmv2.block_sparse_attention` runs the same stage with MLX ops (`_gather_decode`),
which the conformance suite checks. On Linux `kernel()` builds the kernel object (checked by
tests/backends/mlx/test_mlx_runtime.py); calling it raises MLX's "No Metal back-end".
"""

from __future__ import annotations

import functools
import os

import mlx.core as mx

__all__ = ["SOURCE", "block_sparse_decode", "kernel", "metal_available"]

SIMD_WIDTH = 32

# Inputs: q, k, v, idx (int32), params (int32 [cache_len, S]), scale (fp32 [1]).
# Template: T (element type of q/k/v), D (head_dim), BS (block_size), W (idx width),
# GROUP (query heads per KV head), HQ, HKV.
SOURCE = """
    uint lane = thread_index_in_simdgroup;
    uint row = threadgroup_position_in_grid.x;          // b * HQ + h
    uint h = row % HQ;
    uint bb = row / HQ;
    uint kv = bb * HKV + h / GROUP;
    int pos = params[0];                                // the query's absolute position
    int seq = params[1];                                // S, keys in the cache
    const device T* kp = k + (size_t)kv * seq * D;
    const device T* vp = v + (size_t)kv * seq * D;
    const device int* ip = idx + kv * W;

    float qv[D];
    for (int d = 0; d < D; ++d) qv[d] = float(q[row * D + d]) * scale[0];
    float m = -INFINITY;
    float l = 0.0f;
    float acc[D];
    for (int d = 0; d < D; ++d) acc[d] = 0.0f;

    for (int w = 0; w < W; ++w) {
        int blk = ip[w];
        if (blk < 0) continue;
        int end = min((blk + 1) * BS, pos + 1);
        for (int t = blk * BS + (int)lane; t < end; t += 32) {
            float s = 0.0f;
            for (int d = 0; d < D; ++d) s += qv[d] * float(kp[(size_t)t * D + d]);
            float m_new = max(m, s);
            float corr = exp(m - m_new);
            float p = exp(s - m_new);
            l = l * corr + p;
            for (int d = 0; d < D; ++d) acc[d] = acc[d] * corr + p * float(vp[(size_t)t * D + d]);
            m = m_new;
        }
    }
    float m_all = simd_max(m);
    float c = (m == -INFINITY) ? 0.0f : exp(m - m_all);
    float l_all = simd_sum(l * c);
    for (int d = 0; d < D; ++d) {
        float a = simd_sum(acc[d] * c);
        if (lane == (uint)(d % 32)) out[row * D + d] = a / l_all;
    }
"""


def metal_available() -> bool:
    """True when MLX has a Metal device and the kernel is not switched off."""
    if os.environ.get("ARKINFER_MLX_METAL_KERNEL", "1") == "0":
        return False
    return bool(mx.metal.is_available())


@functools.cache
def kernel():
    """The `mx.fast.metal_kernel` object (built once; building needs no Metal device)."""
    return mx.fast.metal_kernel(name="arkinfer_infllmv2_block_sparse_decode",
                                input_names=["q", "k", "v", "idx", "params", "scale"],
                                output_names=["out"], source=SOURCE)


def block_sparse_decode(q: mx.array, k: mx.array, v: mx.array, idx: mx.array, *, scale: float,
                        block_size: int, cache_len: int) -> mx.array:
    """Stage 2 for one query per row (module docstring) on Metal -> fp32 [B, Hq, 1, D]."""
    b, hq, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    if t != 1:
        raise ValueError(f"the Metal decode kernel takes one query per row, got T={t}")
    w = idx.shape[-1]
    (out,) = kernel()(
        inputs=[q, k, v, idx.astype(mx.int32), mx.array([cache_len, s], dtype=mx.int32),
                mx.array([scale], dtype=mx.float32)],
        template=[("T", q.dtype), ("D", d), ("BS", block_size), ("W", w),
                  ("GROUP", hq // hkv), ("HQ", hq), ("HKV", hkv)],
        grid=(b * hq * SIMD_WIDTH, 1, 1), threadgroup=(SIMD_WIDTH, 1, 1),
        output_shapes=[(b, hq, 1, d)], output_dtypes=[mx.float32])
    return out
