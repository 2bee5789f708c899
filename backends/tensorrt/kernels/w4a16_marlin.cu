// W4A16 GEMM/GEMV over Marlin-packed weights: y[m, n] = sum_k x[m, k] * (code[k, n] - 8) * s[g(k), n].
//
// x fp16 [m, k] row-major (1 <= m <= 16), B int32 [k/16, 2n] and s fp16 [groups, n] exactly as
// quant/formats/marlin.py writes them (layout: marlin_layout.cuh), y fp16 [m, n]; fp32 accumulation.
//
// Tensor cores, as Marlin: Marlin's layout is made for mma.m16n8k16. Lane l of a warp loads the 4
// words 4l..4l+3 of a 16-row tile of a 64-column chunk (the tile's 128 words are 512 contiguous
// bytes: one 16-byte load per lane). Word j holds, for column 16j + l/4 (codes 0,1,4,5) and
// 16j + l/4 + 8 (codes 2,3,6,7), k-rows 2(l%4), +1, +8, +9: exactly the B fragments of lane l for
// the mma n-tiles 2j and 2j + 1 (n-tile nt = columns 8nt .. 8nt + 7 of the chunk). Each fragment is
// made with two lop3 and one fp16 op per pair of codes ((code - 8) is exact in fp16), x is the A
// fragment (rows >= m are zeros: one mma serves every m <= 16), products are exact and summed in
// fp32 by the tensor core. Scales are applied in fp32: each group's sums are kept apart and
// multiplied by the group's scales when the group ends (per channel: once, at the end).
//
// Grid: (n / 64 column chunks, k splits); a CTA of kWarps warps per (chunk, split); each warp a
// contiguous run of the split's tiles, kAhead 16-byte loads in flight per lane. The warps' sums
// meet in shared memory; splits (only when n is too narrow to fill the GPU) add with fp32 atomics
// into a stream-ordered workspace that is then rounded to fp16. Measured: see the README.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "arkinfer_kernels.h"
#include "marlin_layout.cuh"

namespace {

constexpr int kMaxM = 16;
constexpr int kWarps = 8;   // warps per CTA (~110 registers per thread: two CTAs per SM)
constexpr int kAhead = 4;   // k-tiles a warp loads before it uses them

__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t mask, uint32_t bits) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(a), "r"(mask), "r"(bits));  // (a & m) | b
  return r;
}

__device__ __forceinline__ half2 as_half2(uint32_t u) {
  half2 h;
  memcpy(&h, &u, 4);
  return h;
}

__device__ __forceinline__ uint32_t as_u32(half2 h) {
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}

// B fragment of one n-tile from the codes at bits 0-3 / 16-19 (k-rows 2t, 2t + 1) and 4-7 / 20-23
// (2t + 8, 2t + 9) of q: (code - 8) as fp16 pairs. 0x6400 | c is the half 1024 + c, 0x6400 | 16c
// is 1024 + 16c; both are exact, and so is what is subtracted or fused (Marlin's constants).
__device__ __forceinline__ void dequant(uint32_t q, uint32_t b[2]) {
  const uint32_t lo = and_or(q, 0x000f000fu, 0x64006400u);
  const uint32_t hi = and_or(q, 0x00f000f0u, 0x64006400u);
  b[0] = as_u32(__hsub2(as_half2(lo), as_half2(0x64086408u)));                    // - 1032
  b[1] = as_u32(__hfma2(as_half2(hi), as_half2(0x2c002c00u), as_half2(0xd480d480u)));  // / 16 - 72
}

// c[4] += A (16 x 16 fp16, row-major fragments) x B (16 x 8 fp16) on the tensor cores, fp32 sums.
__device__ __forceinline__ void mma_16816(const uint32_t a[4], const uint32_t b[2], float c[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t load_x2(const half* p, bool valid) {
  return valid ? __ldg(reinterpret_cast<const unsigned int*>(p)) : 0u;
}

// acc += part * scale, per C-fragment element: lane (g, t) holds columns 8nt + 2t + e (e = 0, 1)
// of rows g (part[nt][e]) and g + 8 (part[nt][2 + e]). Grouped scales sit, by SCALE_PERM, at
// (2t + e) * 8 + nt of the chunk's run of 64: one 16-byte load per e.
__device__ __forceinline__ void fold(float acc[8][4], float part[8][4], const half* s, int n,
                                     int chunk, int group, bool grouped, int t) {
  float sc[2][8];
  if (grouped) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(
          s + (long long)group * n + chunk * 64 + (2 * t + e) * 8));
      const half2* h2 = reinterpret_cast<const half2*>(&raw);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float2 f = __half22float2(h2[c]);
        sc[e][2 * c] = f.x;
        sc[e][2 * c + 1] = f.y;
      }
    }
  } else {
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
        sc[e][nt] = __half2float(
            s[arkinfer::marlin_scale_index(0, chunk * 64 + 8 * nt + 2 * t + e, n, false)]);
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      acc[nt][r] += part[nt][r] * sc[r & 1][nt];
      part[nt][r] = 0.f;
    }
}

__global__ void __launch_bounds__(32 * kWarps)
marlin_gemm_kernel(const half* __restrict__ x, const int* __restrict__ B,
                   const half* __restrict__ s, float* __restrict__ out,
                   half* __restrict__ y, int m, int n, int k, int group_size,
                   int tiles_per_split) {
  __shared__ float red[kMaxM][64];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;                   // fragment row and column pair
  const int chunk = blockIdx.x;
  const int tiles = k / 16;
  const int t0 = blockIdx.y * tiles_per_split;
  const int t1 = min(tiles, t0 + tiles_per_split);
  const bool grouped = group_size > 0 && group_size < k;
  const int tiles_per_group = grouped ? group_size / 16 : tiles;
  for (int i = threadIdx.x; i < kMaxM * 64; i += blockDim.x) red[i / 64][i % 64] = 0.f;

  float acc[8][4], part[8][4];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[nt][r] = part[nt][r] = 0.f;

  const bool row_a = g < m, row_b = g + 8 < m;            // A rows g and g + 8 exist
  const half* xa = x + (long long)(row_a ? g : 0) * k + 2 * t;
  const half* xb = x + (long long)(row_b ? g + 8 : 0) * k + 2 * t;
  const uint4* bp = reinterpret_cast<const uint4*>(B + (long long)chunk * 128) + lane;
  const long long row_vecs = 2LL * n / 4;                  // uint4 per B row
  const int per_warp = (t1 - t0 + kWarps - 1) / kWarps;
  const int wt0 = t0 + warp * per_warp, wt1 = min(t1, wt0 + per_warp);
  int group = -1;                                          // the group `part` sums
  for (int tb = wt0; tb < wt1; tb += kAhead) {
    uint4 words[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u)                       // issue every load first
      words[u] = tb + u < wt1 ? __ldg(bp + (tb + u) * row_vecs) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int tile = tb + u;
      if (tile >= wt1) break;
      const int gi = tile / tiles_per_group;
      if (gi != group) {
        if (group >= 0) fold(acc, part, s, n, chunk, group, grouped, t);
        group = gi;
      }
      const int k0 = tile * 16;
      const uint32_t a[4] = {load_x2(xa + k0, row_a), load_x2(xb + k0, row_b),
                             load_x2(xa + k0 + 8, row_a), load_x2(xb + k0 + 8, row_b)};
      const uint32_t wd[4] = {words[u].x, words[u].y, words[u].z, words[u].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t b[2];
        dequant(wd[j], b);                                 // codes 0,1,4,5: n-tile 2j
        mma_16816(a, b, part[2 * j]);
        dequant(wd[j] >> 8, b);                            // codes 2,3,6,7: n-tile 2j + 1
        mma_16816(a, b, part[2 * j + 1]);
      }
    }
  }
  if (group >= 0) fold(acc, part, s, n, chunk, group, grouped, t);
  __syncthreads();
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (row_a) atomicAdd(&red[g][8 * nt + 2 * t + e], acc[nt][e]);
      if (row_b) atomicAdd(&red[g + 8][8 * nt + 2 * t + e], acc[nt][2 + e]);
    }
  __syncthreads();
  for (int i = threadIdx.x; i < m * 64; i += blockDim.x) {
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
// (n >= 8448 on an H100); narrower weights split k over about one CTA per SM, every warp of a
// CTA still getting a tile or more. Splits > 1 sum in an fp32 workspace, then round to fp16.
cudaError_t launch(const half* x, const int* B, const half* s, half* y, int m, int n, int k,
                   int group_size, cudaStream_t stream) {
  const int tiles = k / 16, chunks = n / 64;
  int splits = (sm_count() + chunks - 1) / chunks;
  splits = max(1, min(splits, tiles / kWarps));
  const int tiles_per_split = (tiles + splits - 1) / splits;
  splits = (tiles + tiles_per_split - 1) / tiles_per_split;
  const dim3 grid(chunks, splits), block(32 * kWarps);
  if (splits == 1) {
    marlin_gemm_kernel<<<grid, block, 0, stream>>>(x, B, s, nullptr, y, m, n, k, group_size,
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
    marlin_gemm_kernel<<<grid, block, 0, stream>>>(x, B, s, out, y, m, n, k, group_size,
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
  return (int)launch(x, B, s, y, m, n, k, group_size, stream);
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
