// W4A16 GEMM/GEMV over Marlin-packed weights: y[m, n] = sum_k x[m, k] * (code[k, n] - 8) * s[g(k), n].
//
// x fp16 [m, k] row-major (1 <= m <= 16), B int32 [k/16, 2n] and s fp16 [groups, n] exactly as
// quant/formats/marlin.py writes them (layout: marlin_layout.cuh), y fp16 [m, n]; fp32 accumulation.
// Not Marlin's tensor-core algorithm: a bandwidth-bound CUDA-core kernel for decode-size batches.
//
// Grid: (n / 64 column chunks, k splits). A CTA of 128 threads walks its k-tiles; thread w reads
// word w of the chunk in each 16-row tile (one coalesced 512-byte row segment per tile), i.e. 2
// columns x 4 k-rows, and keeps m x 2 fp32 partial sums. Partials are reduced in shared memory,
// then across k splits with fp32 atomics into a stream-ordered workspace, then rounded to fp16.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "arkinfer_kernels.h"
#include "marlin_layout.cuh"

namespace {

constexpr int kThreads = 128;     // one thread per word of a 64-column chunk
constexpr int kMaxM = 16;

template <int MT>
__global__ void marlin_gemm_kernel(const half* __restrict__ x, const int* __restrict__ B,
                                   const half* __restrict__ s, float* __restrict__ out,
                                   half* __restrict__ y, int m, int n, int k, int group_size,
                                   int tiles_per_split) {
  using arkinfer::marlin_code_col;
  using arkinfer::marlin_code_row;
  __shared__ float red[MT][64];
  const int w = threadIdx.x;
  const int chunk = blockIdx.x;
  const int tiles = k / 16;
  const int t0 = blockIdx.y * tiles_per_split;
  const int t1 = min(tiles, t0 + tiles_per_split);
  const bool grouped = group_size > 0 && group_size < k;
  const int c0 = chunk * 64 + marlin_code_col(w, 0);   // codes 0,1,4,5
  const int c1 = c0 + 8;                               // codes 2,3,6,7
  const int r0 = marlin_code_row(w, 0), r1 = marlin_code_row(w, 1);
  const int r2 = marlin_code_row(w, 4), r3 = marlin_code_row(w, 5);

  for (int i = w; i < MT * 64; i += kThreads) red[i / 64][i % 64] = 0.f;

  float acc0[MT], acc1[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc0[i] = acc1[i] = 0.f;

  const int* bp = B + (long long)chunk * 128 + w;
  const long long row_words = 2LL * n;
#pragma unroll 4
  for (int t = t0; t < t1; ++t) {
    const uint32_t word = (uint32_t)__ldg(bp + t * row_words);
    const int g = grouped ? (t * 16) / group_size : 0;
    const float sc0 = __half2float(s[arkinfer::marlin_scale_index(g, c0, n, grouped)]);
    const float sc1 = __half2float(s[arkinfer::marlin_scale_index(g, c1, n, grouped)]);
    // codes (u): 0 -> (r0,c0) 1 -> (r1,c0) 2 -> (r0,c1) 3 -> (r1,c1) 4 -> (r2,c0) 5 -> (r3,c0) ...
    const float q0 = (float)((word >> 0) & 15) - 8.f, q1 = (float)((word >> 4) & 15) - 8.f;
    const float q2 = (float)((word >> 8) & 15) - 8.f, q3 = (float)((word >> 12) & 15) - 8.f;
    const float q4 = (float)((word >> 16) & 15) - 8.f, q5 = (float)((word >> 20) & 15) - 8.f;
    const float q6 = (float)((word >> 24) & 15) - 8.f, q7 = (float)((word >> 28) & 15) - 8.f;
    const half* xr = x + t * 16;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if (i < m) {
        const half* xi = xr + (long long)i * k;
        const float x0 = __half2float(xi[r0]), x1 = __half2float(xi[r1]);
        const float x2 = __half2float(xi[r2]), x3 = __half2float(xi[r3]);
        acc0[i] += sc0 * (q0 * x0 + q1 * x1 + q4 * x2 + q5 * x3);
        acc1[i] += sc1 * (q2 * x0 + q3 * x1 + q6 * x2 + q7 * x3);
      }
    }
  }
  __syncthreads();
  const int l0 = c0 - chunk * 64, l1 = l0 + 8;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    if (i < m) {
      atomicAdd(&red[i][l0], acc0[i]);
      atomicAdd(&red[i][l1], acc1[i]);
    }
  }
  __syncthreads();
  for (int i = w; i < m * 64; i += kThreads) {
    const long long o = (long long)(i / 64) * n + chunk * 64 + (i % 64);
    if (out != nullptr) {
      atomicAdd(out + o, red[i / 64][i % 64]);
    } else {
      y[o] = __float2half_rn(red[i / 64][i % 64]);
    }
  }
}

__global__ void round_to_half(const float* __restrict__ src, half* __restrict__ dst, long long count) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count;
       i += (long long)gridDim.x * blockDim.x) {
    dst[i] = __float2half_rn(src[i]);
  }
}

int sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 108;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 108;
  return sms;
}

// Keep the default pool's memory between calls: with the default release threshold (0) every
// stream synchronisation hands the workspace back to the driver and the next call maps it again.
void keep_pool_memory() {
  static bool done[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64 || done[dev]) return;
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
    uint64_t keep = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  done[dev] = true;
}

template <int MT>
cudaError_t launch(const half* x, const int* B, const half* s, float* out, half* y, int m, int n,
                   int k, int group_size, int splits, int tiles_per_split, cudaStream_t stream) {
  dim3 grid(n / 64, splits);
  marlin_gemm_kernel<MT><<<grid, kThreads, 0, stream>>>(x, B, s, out, y, m, n, k, group_size,
                                                        tiles_per_split);
  return cudaGetLastError();
}

cudaError_t dispatch(const half* x, const int* B, const half* s, float* out, half* y, int m, int n,
                     int k, int group_size, int splits, int tiles_per_split, cudaStream_t stream) {
  if (m <= 1) return launch<1>(x, B, s, out, y, m, n, k, group_size, splits, tiles_per_split, stream);
  if (m <= 2) return launch<2>(x, B, s, out, y, m, n, k, group_size, splits, tiles_per_split, stream);
  if (m <= 4) return launch<4>(x, B, s, out, y, m, n, k, group_size, splits, tiles_per_split, stream);
  if (m <= 8) return launch<8>(x, B, s, out, y, m, n, k, group_size, splits, tiles_per_split, stream);
  return launch<16>(x, B, s, out, y, m, n, k, group_size, splits, tiles_per_split, stream);
}

}  // namespace

extern "C" int arkinfer_marlin_gemm(const half* x, const int* B, const half* s, half* y, int m,
                                    int n, int k, int group_size, cudaStream_t stream) {
  if (m < 1 || m > kMaxM || n <= 0 || k <= 0 || n % 64 != 0 || k % 128 != 0) {
    return (int)cudaErrorInvalidValue;
  }
  if (group_size > 0 && group_size < k && (group_size % 16 != 0 || k % group_size != 0)) {
    return (int)cudaErrorInvalidValue;
  }
  const int tiles = k / 16;
  const int chunks = n / 64;
  // About 16 CTAs of 128 threads per SM (full occupancy keeps enough loads in flight for a
  // bandwidth-bound GEMV), at least 8 tiles per split.
  int splits = (16 * sm_count() + chunks - 1) / chunks;
  splits = max(1, min(splits, tiles / 8));
  const int tiles_per_split = (tiles + splits - 1) / splits;
  splits = (tiles + tiles_per_split - 1) / tiles_per_split;
  if (splits == 1) {
    return (int)dispatch(x, B, s, nullptr, y, m, n, k, group_size, 1, tiles_per_split, stream);
  }
  const long long count = (long long)m * n;
  keep_pool_memory();
  float* out = nullptr;
  cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&out), count * sizeof(float), stream);
  if (err != cudaSuccess) return (int)err;
  err = cudaMemsetAsync(out, 0, count * sizeof(float), stream);
  if (err == cudaSuccess) {
    err = dispatch(x, B, s, out, y, m, n, k, group_size, splits, tiles_per_split, stream);
  }
  if (err == cudaSuccess) {
    const int blocks = (int)((count + 255) / 256 < 4096 ? (count + 255) / 256 : 4096);
    round_to_half<<<blocks, 256, 0, stream>>>(out, y, count);
    err = cudaGetLastError();
  }
  const cudaError_t freed = cudaFreeAsync(out, stream);
  return (int)(err != cudaSuccess ? err : freed);
}

extern "C" int arkinfer_marlin_dequant_host(const int* B, const uint16_t* s, float* w, int n, int k,
                                            int group_size) {
  if (n <= 0 || k <= 0 || n % 64 != 0 || k % 128 != 0) return (int)cudaErrorInvalidValue;
  const bool grouped = group_size > 0 && group_size < k;
  for (int t = 0; t < k / 16; ++t) {
    for (int chunk = 0; chunk < n / 64; ++chunk) {
      for (int wi = 0; wi < 128; ++wi) {
        const uint32_t word = (uint32_t)B[(long long)t * 2 * n + chunk * 128 + wi];
        for (int u = 0; u < 8; ++u) {
          const int row = t * 16 + arkinfer::marlin_code_row(wi, u);
          const int col = chunk * 64 + arkinfer::marlin_code_col(wi, u);
          const int g = grouped ? row / group_size : 0;
          __half_raw raw;
          raw.x = s[arkinfer::marlin_scale_index(g, col, n, grouped)];
          const float scale = __half2float(__half(raw));
          w[(long long)row * n + col] = ((float)((word >> (4 * u)) & 15) - 8.f) * scale;
        }
      }
    }
  }
  return (int)cudaSuccess;
}
