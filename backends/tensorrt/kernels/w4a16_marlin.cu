// W4A16 GEMM/GEMV over Marlin-packed weights: y[m, n] = sum_k x[m, k] * (code[k, n] - 8) * s[g(k), n].
//
// x fp16 [m, k] row-major (1 <= m <= 16), B int32 [k/16, 2n] and s fp16 [groups, n] exactly as
// quant/formats/marlin.py writes them (layout: marlin_layout.cuh), y fp16 [m, n]; fp32 accumulation.
// Not Marlin's tensor-core algorithm: a bandwidth-bound CUDA-core kernel for decode-size batches.
//
// Grid: (n / 64 column chunks, k splits); a CTA of 16 warps per (chunk, split). A warp reads one
// 16-row tile of its chunk with one 16-byte load per lane (the tile's 128 words = 512 contiguous
// bytes), so lane l holds words 4l..4l+3: by marlin_layout.cuh the 4 tiles j of the chunk, columns
// 16j + l/4 and 16j + l/4 + 8, k-rows {0, 1, 8, 9} + 2 (l % 4) of the tile. Warps take every 16th
// tile of the split, several loads in flight each; lanes sharing l/4 are summed by shuffles, warps
// in shared memory, splits (only when n is too narrow to fill the GPU) with fp32 atomics into a
// stream-ordered workspace that is then rounded to fp16. Measured on an H200: see the README.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "arkinfer_kernels.h"
#include "marlin_layout.cuh"

namespace {

constexpr int kMaxM = 16;

// Warps per CTA and k-tiles each warp loads ahead. Large m needs MT x 8 fp32 sums per thread
// (128 registers at m = 16): fewer warps per CTA leave each thread up to 255 registers.
template <int MT> __host__ __device__ constexpr int warps() { return MT >= 8 ? 4 : 16; }
template <int MT> __host__ __device__ constexpr int unroll() { return MT >= 8 ? 2 : 4; }

// (code at bit `shift`) - 8 as fp32 without I2F (a quarter-rate instruction that bounded the kernel):
// 0x4B000000 | c is the float 2^23 + c exactly, and 2^23 + 8 is exact too.
__device__ __forceinline__ float code_minus_8(uint32_t word, int shift) {
  return __uint_as_float(0x4B000000u | ((word >> shift) & 15u)) - 8388616.f;
}

template <int MT>
__global__ void __launch_bounds__(32 * warps<MT>())
marlin_gemm_kernel(const half* __restrict__ x, const int* __restrict__ B,
                   const half* __restrict__ s, float* __restrict__ out,
                   half* __restrict__ y, int m, int n, int k, int group_size,
                   int tiles_per_split) {
  constexpr int U = unroll<MT>(), kWarps = warps<MT>(), kThreads = 32 * kWarps;
  __shared__ float red[MT][64];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int chunk = blockIdx.x;
  const int tiles = k / 16;
  const int t0 = blockIdx.y * tiles_per_split;
  const int t1 = min(tiles, t0 + tiles_per_split);
  const bool grouped = group_size > 0 && group_size < k;
  const int w0 = 4 * lane;                                 // first of the lane's 4 words
  const int r0 = arkinfer::marlin_code_row(w0, 0);                 // rows r0, r0+1, r0+8, r0+9
  // the lane's 8 columns, code pairs (0,1,4,5) -> col[2j], (2,3,6,7) -> col[2j + 1]
  int col[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    col[2 * j] = chunk * 64 + arkinfer::marlin_code_col(w0 + j, 0);
    col[2 * j + 1] = chunk * 64 + arkinfer::marlin_code_col(w0 + j, 2);
  }
  for (int i = threadIdx.x; i < MT * 64; i += kThreads) red[i / 64][i % 64] = 0.f;

  float acc[MT][8];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[i][c] = 0.f;

  float sc[8];
  int group = -1;
  const uint4* bp = reinterpret_cast<const uint4*>(B + (long long)chunk * 128) + lane;
  const long long row_vecs = 2LL * n / 4;                  // uint4 per B row
  // each warp a contiguous run of tiles, so its scales change once per group, not every tile
  const int per_warp = (t1 - t0 + kWarps - 1) / kWarps;
  const int wt0 = t0 + warp * per_warp, wt1 = min(t1, wt0 + per_warp);
  for (int tb = wt0; tb < wt1; tb += U) {
    uint4 words[U];
#pragma unroll
    for (int u = 0; u < U; ++u)                             // issue every load first
      words[u] = tb + u < wt1 ? __ldg(bp + (tb + u) * row_vecs) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int t = tb + u;
      if (t >= wt1) break;
      const int g = grouped ? (t * 16) / group_size : 0;
      if (g != group) {
        group = g;
        if (grouped) {
          // SCALE_PERM puts the lane's 8 columns (col[] order) in 8 consecutive halves
          const uint4 raw = __ldg(reinterpret_cast<const uint4*>(
              s + (long long)g * n + chunk * 64 + (lane / 4) * 8));
          const half2* h2 = reinterpret_cast<const half2*>(&raw);
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const float2 f = __half22float2(h2[c]);
            sc[2 * c] = f.x;
            sc[2 * c + 1] = f.y;
          }
        } else {
#pragma unroll
          for (int c = 0; c < 8; ++c)
            sc[c] = __half2float(s[arkinfer::marlin_scale_index(0, col[c], n, false)]);
        }
      }
      const uint32_t wd[4] = {words[u].x, words[u].y, words[u].z, words[u].w};
      const half* xr = x + t * 16;
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        if (i < m) {
          const half* xi = xr + (long long)i * k;
          // rows r0, r0 + 1 and r0 + 8, r0 + 9 are adjacent pairs
          const float2 xa = __half22float2(*reinterpret_cast<const half2*>(xi + r0));
          const float2 xb = __half22float2(*reinterpret_cast<const half2*>(xi + r0 + 8));
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint32_t wv = wd[j];
            // code u sits at (row, col): 0 (r0, a) 1 (r0+8, a) 2 (r0, b) 3 (r0+8, b)
            // 4 (r0+1, a) 5 (r0+9, a) 6 (r0+1, b) 7 (r0+9, b)
            const float q0 = code_minus_8(wv, 0), q1 = code_minus_8(wv, 4);
            const float q2 = code_minus_8(wv, 8), q3 = code_minus_8(wv, 12);
            const float q4 = code_minus_8(wv, 16), q5 = code_minus_8(wv, 20);
            const float q6 = code_minus_8(wv, 24), q7 = code_minus_8(wv, 28);
            acc[i][2 * j] += sc[2 * j] * (q0 * xa.x + q1 * xb.x + q4 * xa.y + q5 * xb.y);
            acc[i][2 * j + 1] += sc[2 * j + 1] * (q2 * xa.x + q3 * xb.x + q6 * xa.y + q7 * xb.y);
          }
        }
      }
    }
  }
  // lanes 4a..4a+3 hold the same 8 columns for different k-rows
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      acc[i][c] += __shfl_xor_sync(0xffffffffu, acc[i][c], 1);
      acc[i][c] += __shfl_xor_sync(0xffffffffu, acc[i][c], 2);
    }
  __syncthreads();
  if (lane % 4 == 0) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
      if (i < m)
#pragma unroll
        for (int c = 0; c < 8; ++c) atomicAdd(&red[i][col[c] - chunk * 64], acc[i][c]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < m * 64; i += kThreads) {
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

// Splits of k over CTAs: one CTA per 64-column chunk fills the GPU once n / 64 >= the SM count
// (n >= 8448 on an H200); narrower weights split k over about one CTA per SM, every warp of a
// CTA still getting a tile or more. Splits > 1 sum in an fp32 workspace, then round to fp16.
template <int MT>
cudaError_t launch(const half* x, const int* B, const half* s, half* y, int m, int n, int k,
                   int group_size, cudaStream_t stream) {
  const int tiles = k / 16, chunks = n / 64;
  int splits = (sm_count() + chunks - 1) / chunks;
  splits = max(1, min(splits, tiles / warps<MT>()));
  const int tiles_per_split = (tiles + splits - 1) / splits;
  splits = (tiles + tiles_per_split - 1) / tiles_per_split;
  const dim3 grid(chunks, splits), block(32 * warps<MT>());
  if (splits == 1) {
    marlin_gemm_kernel<MT><<<grid, block, 0, stream>>>(x, B, s, nullptr, y, m, n, k, group_size,
                                                       tiles_per_split);
    return cudaGetLastError();
  }
  const long long count = (long long)m * n;
  keep_pool_memory();
  float* out = nullptr;
  cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&out), count * sizeof(float), stream);
  if (err != cudaSuccess) return err;
  err = cudaMemsetAsync(out, 0, count * sizeof(float), stream);
  if (err == cudaSuccess) {
    marlin_gemm_kernel<MT><<<grid, block, 0, stream>>>(x, B, s, out, y, m, n, k, group_size,
                                                       tiles_per_split);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    const int blocks = (int)((count + 255) / 256 < 4096 ? (count + 255) / 256 : 4096);
    round_to_half<<<blocks, 256, 0, stream>>>(out, y, count);
    err = cudaGetLastError();
  }
  const cudaError_t freed = cudaFreeAsync(out, stream);
  return err != cudaSuccess ? err : freed;
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
  if (m <= 1) return (int)launch<1>(x, B, s, y, m, n, k, group_size, stream);
  if (m <= 2) return (int)launch<2>(x, B, s, y, m, n, k, group_size, stream);
  if (m <= 4) return (int)launch<4>(x, B, s, y, m, n, k, group_size, stream);
  if (m <= 8) return (int)launch<8>(x, B, s, y, m, n, k, group_size, stream);
  return (int)launch<16>(x, B, s, y, m, n, k, group_size, stream);
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
