/* C ABI of ArkInfer's CUDA kernels (libarkinfer_kernels.so; see README.md).
 *
 * Every entry point is asynchronous on `stream` and returns a cudaError_t as int (0 = success;
 * cudaErrorInvalidValue = 1 for shapes outside the documented limits). Pointers are device
 * pointers unless the name says _host. Layouts are row-major, innermost last.
 */
#ifndef ARKINFER_KERNELS_H_
#define ARKINFER_KERNELS_H_

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- W4A16 over Marlin's bytes (w4a16_marlin.cu) -------------------------------------------
 * x fp16 [m, k], B int32 [k/16, 2n], s fp16 [groups, n] (quant/formats/marlin.py), y fp16 [m, n].
 * 1 <= m <= 16, k % 128 == 0, n % 64 == 0; group_size -1 (or >= k) = per channel, else a
 * multiple of 16 dividing k. fp32 accumulation. Uses a stream-ordered fp32 workspace
 * (cudaMallocAsync on the default pool, whose release threshold it raises so the memory
 * stays mapped between calls) of m * n floats when it splits k. */
int arkinfer_marlin_gemm(const half* x, const int* B, const half* s, half* y, int m, int n, int k,
                         int group_size, cudaStream_t stream);

/* Host-side dequantisation of the same bytes (the kernel's index math, for layout checks):
 * B, s (fp16 bit patterns) host pointers -> w fp32 [k, n] = (code - 8) * scale. */
int arkinfer_marlin_dequant_host(const int* B, const uint16_t* s, float* w, int n, int k,
                                 int group_size);

/* ---- InfLLM v2 decode (infllmv2.cu), docs/infllmv2.md ----------------------------------------
 * One sequence, one new query token. dtype: 0 = fp16, 1 = bf16, 2 = fp32 (q, k, v, out).
 * q [hq, d]; k, v [hkv, cap, d] (head stride kv_head_stride elements, rows of d), the first
 * `length` rows valid (length includes the new token); hq % hkv == 0, hq / hkv <= 16,
 * d % 32 == 0, d <= 128. Compressed keys fp32 [hkv, n_cap, d] with head stride *_head_stride. */
#define ARKINFER_FP16 0
#define ARKINFER_BF16 1
#define ARKINFER_FP32 2

/* Mean-pool kernels j in [n(old_len), n(new_len)) with n(L) = (L - kernel) / stride + 1 (0 if
 * L < kernel): out[g, j, :] = mean(k[g, stride*j : stride*j + kernel, :]) in fp32. Incremental
 * decode calls it with old_len = length - 1 (fine: kernel/stride; coarse: 4x both). */
int arkinfer_infllmv2_compress(const void* k, int dtype, int hkv, int d, long long kv_head_stride,
                               int old_len, int new_len, int kernel_size, int kernel_stride,
                               float* out, long long out_head_stride, cudaStream_t stream);

/* Bytes of device workspace select + sparse_decode need for these sizes. */
size_t arkinfer_infllmv2_workspace_bytes(int hq, int hkv, int d, int length, int kernel_size,
                                         int kernel_stride, int block_size, int budget);

/* Stage 1: coarse lse, fine scores with the group sum, block max-pool, forced init/local blocks,
 * top-k (ties to the lower block) -> idx int32 [hkv, budget]: selected blocks ascending, then -1.
 * budget = topk + window_size / block_size; local_blocks = window_size / block_size;
 * block_size % kernel_stride == 0; ceil(length / block_size) <= 12000. */
int arkinfer_infllmv2_select(const void* q, int dtype, const float* fine, long long fine_head_stride,
                             const float* coarse, long long coarse_head_stride, int hq, int hkv,
                             int d, int length, int kernel_size, int kernel_stride, int block_size,
                             int init_blocks, int local_blocks, int budget, float scale, int* idx,
                             void* workspace, cudaStream_t stream);

/* Stage 2: attention of the query over the blocks in idx [hkv, budget] (-1 = unused), keys
 * t < length only; out like q. Split over blocks, combined with a log-sum-exp merge. */
int arkinfer_infllmv2_sparse_decode(const void* q, const void* k, const void* v, int dtype,
                                    long long kv_head_stride, const int* idx, int hq, int hkv,
                                    int d, int length, int block_size, int budget, float scale,
                                    void* out, void* workspace, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* ARKINFER_KERNELS_H_ */
