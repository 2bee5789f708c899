// InfLLM v2 decode on CUDA (docs/infllmv2.md §2-§4): one sequence, one new query token, GQA.
// fp16/bf16/fp32 in, fp32 accumulation. The C ABI and layouts are in arkinfer_kernels.h.
//
// compress:  one warp per (KV head, new kernel): fp32 mean of `kernel` key rows.
// select:    (1) per KV head, warp-per-coarse-kernel logits for the group, then lse[hq];
//            (2) per KV head, warp-per-fine-kernel group sum s[g, j] = sum_h exp(tau q_h.Kc1[j] - lse_h)
//                (NaN -> 0); (3) per block, max over the 5 overlapping fine kernels, forced init/local
//                blocks +inf, +inf scores -> FLT_MAX; (4) per KV head, one CTA: radix select of the
//                budget-th largest key, ties to the lower block, ascending compaction -> idx.
// sparse:    grid (KV head, split); a CTA streams its selected blocks 32 keys at a time through
//            shared memory for all query heads of the group (K/V read once per group), keeps an
//            online softmax per head, and writes (max, sum, acc[d]); a second kernel merges splits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "arkinfer_kernels.h"

namespace {

constexpr int kMaxGroup = 16;
constexpr int kMaxD = 128;
constexpr int kTileKeys = 32;
constexpr int kAttnThreads = 128;
constexpr int kTopkThreads = 1024;
constexpr int kMaxBlocks = 12000;  // keys in dynamic shared memory, under the 48 KiB default

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ half from_float<half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

int n_kernels(int length, int kernel, int stride) {
  return length < kernel ? 0 : (length - kernel) / stride + 1;
}

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

int sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 108;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 108;
  return sms;
}

// ---- compression ------------------------------------------------------------------------------

template <typename T>
__global__ void compress_kernel(const T* __restrict__ k, int d, long long kv_head_stride, int first,
                                int count, int kernel, int stride, float* __restrict__ out,
                                long long out_head_stride) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  const int g = blockIdx.y;
  if (warp >= count) return;
  const int j = first + warp;
  const T* rows = k + g * kv_head_stride + (long long)stride * j * d;
  const float inv = 1.f / (float)kernel;
  for (int dd = lane; dd < d; dd += 32) {
    float acc = 0.f;
    for (int r = 0; r < kernel; ++r) acc += to_float(rows[(long long)r * d + dd]);
    out[g * out_head_stride + (long long)j * d + dd] = acc * inv;
  }
}

// ---- stage 1 ----------------------------------------------------------------------------------

// grid (ceil(n2 / 8), hkv), 256 threads, a warp per coarse kernel c (its row read once for the
// whole group): logits[h, c] = scale * q_h . coarse[g, c] for the query heads h of group g.
template <typename T>
__global__ void coarse_logit_kernel(const T* __restrict__ q, const float* __restrict__ coarse,
                                    long long coarse_head_stride, int group, int d, int n2,
                                    float scale, float* __restrict__ logits) {
  __shared__ float qs[kMaxGroup * kMaxD];
  const int g = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < group * d; i += blockDim.x)
    qs[i] = to_float(q[(long long)g * group * d + i]);
  __syncthreads();
  const int c = blockIdx.x * (blockDim.x / 32) + warp;
  if (c >= n2) return;
  const float* row = coarse + g * coarse_head_stride + (long long)c * d;
  float kv[kMaxD / 32];
#pragma unroll
  for (int i = 0; i < kMaxD / 32; ++i) kv[i] = (lane + 32 * i < d) ? row[lane + 32 * i] : 0.f;
  for (int h = 0; h < group; ++h) {
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxD / 32; ++i)
      if (lane + 32 * i < d) dot += qs[h * d + lane + 32 * i] * kv[i];
    dot = warp_sum(dot);
    if (lane == 0) logits[(long long)(g * group + h) * n2 + c] = scale * dot;
  }
}

// Merge two (max, sum of exp(x - max)) pairs.
__device__ __forceinline__ void lse_merge(float& m, float& l, float m2, float l2) {
  const float mm = fmaxf(m, m2);
  if (mm == -INFINITY) return;
  l = (m == -INFINITY ? 0.f : l * __expf(m - mm)) + (m2 == -INFINITY ? 0.f : l2 * __expf(m2 - mm));
  m = mm;
}

// grid hq, 256 threads: lse[h] = logsumexp over logits[h, 0..n2) (-inf when n2 == 0; NaN in,
// NaN out, as torch.logsumexp).
__global__ void lse_kernel(const float* __restrict__ logits, int n2, float* __restrict__ lse) {
  __shared__ float wm[8], wl[8];
  const int h = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* row = logits + (long long)h * n2;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < n2; c += blockDim.x) m = fmaxf(m, row[c]);
  float l = 0.f;
  bool nan = false;
  for (int c = threadIdx.x; c < n2; c += blockDim.x) {
    nan |= isnan(row[c]);
    l += __expf(row[c] - m);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float l2 = __shfl_xor_sync(0xffffffffu, l, o);
    lse_merge(m, l, m2, l2);
  }
  nan = __syncthreads_or(nan);
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float mm = wm[0], ll = wl[0];
    for (int w = 1; w < (int)blockDim.x / 32; ++w) lse_merge(mm, ll, wm[w], wl[w]);
    lse[h] = nan ? NAN : (mm == -INFINITY ? -INFINITY : mm + logf(ll));
  }
}

// grid (ceil(n1 / 8), hkv), 256 threads: s[g, j] = sum over the group of exp(scale q_h.Kc1[j] - lse_h).
template <typename T>
__global__ void fine_score_kernel(const T* __restrict__ q, const float* __restrict__ fine,
                                  long long fine_head_stride, const float* __restrict__ lse,
                                  int group, int d, int n1, float scale, float* __restrict__ s) {
  __shared__ float qs[kMaxGroup * kMaxD];
  const int g = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < group * d; i += blockDim.x)
    qs[i] = to_float(q[(long long)g * group * d + i]);
  __syncthreads();
  const int j = blockIdx.x * (blockDim.x / 32) + warp;
  if (j >= n1) return;
  const float* row = fine + g * fine_head_stride + (long long)j * d;
  float kv[kMaxD / 32];
#pragma unroll
  for (int i = 0; i < kMaxD / 32; ++i) kv[i] = (lane + 32 * i < d) ? row[lane + 32 * i] : 0.f;
  float total = 0.f;
  for (int h = 0; h < group; ++h) {
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxD / 32; ++i)
      if (lane + 32 * i < d) dot += qs[h * d + lane + 32 * i] * kv[i];
    const float p = __expf(scale * warp_sum(dot) - lse[g * group + h]);
    total += isnan(p) ? 0.f : p;
  }
  if (lane == 0) s[(long long)g * n1 + j] = total;
}

// grid (ceil(n_blocks / 256), hkv): ranked[g, blk] per docs/infllmv2.md §3 steps 4-5 (decode: qb = last block).
__global__ void pool_rank_kernel(const float* __restrict__ s, int n1, int n_blocks, int r,
                                 int init_blocks, int local_blocks, float* __restrict__ ranked) {
  const int blk = blockIdx.x * blockDim.x + threadIdx.x, g = blockIdx.y;
  if (blk >= n_blocks) return;
  const int qb = n_blocks - 1;
  float v;
  if (blk < init_blocks || blk >= qb - local_blocks) {
    v = INFINITY;
  } else {
    const int lo = max(r * blk - 1, 0), hi = min(r * blk + r, n1);
    v = 0.f;
    for (int j = lo; j < hi; ++j) v = fmaxf(v, s[(long long)g * n1 + j]);
    if (isnan(v)) v = 0.f;
    if (v == INFINITY) v = FLT_MAX;
  }
  ranked[(long long)g * n_blocks + blk] = v;
}

__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix count of pred over the CTA for the element of this thread in the current tile;
// *carry (shared) holds the count of earlier tiles and is advanced by this tile's total.
__device__ int block_exclusive_count(bool pred, int* warp_counts, int* carry) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned ballot = __ballot_sync(0xffffffffu, pred);
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  int before = *carry + __popc(ballot & ((1u << lane) - 1u));
  for (int w = 0; w < warp; ++w) before += warp_counts[w];
  int total = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < (int)blockDim.x / 32; ++w) total += warp_counts[w];
  __syncthreads();
  if (threadIdx.x == 0) *carry += total;
  __syncthreads();
  return before;
}

// Sum of one int per thread over the CTA (every thread gets it).
__device__ int block_sum(int x, int* slot) {
  if (threadIdx.x == 0) *slot = 0;
  __syncthreads();
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  if (threadIdx.x % 32 == 0 && x != 0) atomicAdd(slot, x);
  __syncthreads();
  const int total = *slot;
  __syncthreads();
  return total;
}

// grid hkv, kTopkThreads threads, n_blocks floats of dynamic shared memory.
__global__ void topk_kernel(const float* __restrict__ ranked, int n_blocks, int budget,
                            int* __restrict__ idx) {
  extern __shared__ uint32_t keys[];
  __shared__ int warp_counts[kTopkThreads / 32];
  __shared__ int carry_eq, carry_sel, sum_slot;
  const int g = blockIdx.x;
  for (int i = threadIdx.x; i < n_blocks; i += blockDim.x)
    keys[i] = order_key(ranked[(long long)g * n_blocks + i]);
  for (int i = threadIdx.x; i < budget; i += blockDim.x) idx[(long long)g * budget + i] = -1;
  __syncthreads();
  const int kk = min(budget, n_blocks);
  // Largest threshold with count(key >= threshold) >= kk: the kk-th largest key.
  uint32_t thr = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t cand = thr | (1u << bit);
    int local = 0;
    for (int i = threadIdx.x; i < n_blocks; i += blockDim.x) local += keys[i] >= cand;
    const int count = block_sum(local, &sum_slot);
    if (count >= kk) thr = cand;
  }
  int gt_local = 0;
  for (int i = threadIdx.x; i < n_blocks; i += blockDim.x) gt_local += keys[i] > thr;
  const int gt = block_sum(gt_local, &sum_slot);
  const int need_eq = kk - gt;   // ties at the threshold taken by the lowest block indices
  if (threadIdx.x == 0) {
    carry_eq = 0;
    carry_sel = 0;
  }
  __syncthreads();
  for (int base = 0; base < n_blocks; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const bool valid = i < n_blocks;
    const uint32_t key = valid ? keys[i] : 0u;
    const bool eq = valid && key == thr;
    const int eq_before = block_exclusive_count(eq, warp_counts, &carry_eq);
    const bool sel = valid && (key > thr || (eq && eq_before < need_eq));
    const int pos = block_exclusive_count(sel, warp_counts, &carry_sel);
    if (sel) idx[(long long)g * budget + pos] = i;
  }
}

// ---- stage 2 ----------------------------------------------------------------------------------

// grid (hkv, splits), kAttnThreads threads. Partials: ws[g, split, h, 0..d) = acc, [d] = max,
// [d + 1] = sum of exp(logit - max).
template <typename T>
__global__ void sparse_attn_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                   const T* __restrict__ v, long long kv_head_stride,
                                   const int* __restrict__ idx, int group, int d, int length,
                                   int block_size, int budget, int blocks_per_split, float scale,
                                   float* __restrict__ partial) {
  __shared__ float qs[kMaxGroup * kMaxD];
  __shared__ float ks[kTileKeys][kMaxD + 1];
  __shared__ float vs[kTileKeys][kMaxD];
  __shared__ float ps[kMaxGroup][kTileKeys];
  __shared__ float m_s[kMaxGroup], l_s[kMaxGroup], corr_s[kMaxGroup];
  const int g = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int i = tid; i < group * d; i += blockDim.x) qs[i] = to_float(q[(long long)g * group * d + i]);
  if (tid < group) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.f;
  }
  constexpr int kAcc = kMaxGroup * kMaxD / kAttnThreads;
  float acc[kAcc];
#pragma unroll
  for (int e = 0; e < kAcc; ++e) acc[e] = 0.f;
  const T* kh = k + g * kv_head_stride;
  const T* vh = v + g * kv_head_stride;
  __syncthreads();

  for (int sb = 0; sb < blocks_per_split; ++sb) {
    const int slot = split * blocks_per_split + sb;
    if (slot >= budget) break;
    const int blk = idx[(long long)g * budget + slot];
    if (blk < 0) continue;
    for (int t0 = blk * block_size; t0 < min((blk + 1) * block_size, length); t0 += kTileKeys) {
      const int n_keys = min(kTileKeys, min((blk + 1) * block_size, length) - t0);
      // The tile's K and V rows as 16-byte loads, every load issued before the first is used
      // (one memory round trip per tile; loading element by element made it one per element).
      constexpr int kVec = 16 / sizeof(T);
      constexpr int kLoads = kTileKeys * kMaxD / 4 / kAttnThreads;   // fp32: 8; 16-bit: 4 used
      const int vec_per_row = d / kVec, n_vec = kTileKeys * vec_per_row;
      uint4 kr[kLoads], vr[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int i = tid + u * kAttnThreads, t = i / vec_per_row, c = i % vec_per_row;
        const bool ok = i < n_vec && t < n_keys;
        const long long off = (long long)(t0 + t) * d + c * kVec;
        kr[u] = ok ? __ldg(reinterpret_cast<const uint4*>(kh + off)) : make_uint4(0, 0, 0, 0);
        vr[u] = ok ? __ldg(reinterpret_cast<const uint4*>(vh + off)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int i = tid + u * kAttnThreads, t = i / vec_per_row, c = i % vec_per_row;
        if (i >= n_vec) break;
        const T* kv = reinterpret_cast<const T*>(&kr[u]);
        const T* vv = reinterpret_cast<const T*>(&vr[u]);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          ks[t][c * kVec + e] = to_float(kv[e]);
          vs[t][c * kVec + e] = to_float(vv[e]);
        }
      }
      __syncthreads();
      for (int h = warp; h < group; h += blockDim.x / 32) {   // lane = key in the tile
        float dot0 = 0.f, dot1 = 0.f;                            // two chains for latency
        for (int d0 = 0; d0 < d; d0 += 32) {
#pragma unroll
          for (int e = 0; e < 32; e += 2) {
            dot0 += qs[h * d + d0 + e] * ks[lane][d0 + e];
            dot1 += qs[h * d + d0 + e + 1] * ks[lane][d0 + e + 1];
          }
        }
        ps[h][lane] = lane < n_keys ? scale * (dot0 + dot1) : -INFINITY;
      }
      __syncthreads();
      if (tid < group) {
        float mx = m_s[tid];
        for (int t = 0; t < n_keys; ++t) mx = fmaxf(mx, ps[tid][t]);
        const float corr = m_s[tid] == -INFINITY ? 0.f : __expf(m_s[tid] - mx);
        float sum = 0.f;
        for (int t = 0; t < kTileKeys; ++t) {
          const float p = t < n_keys ? __expf(ps[tid][t] - mx) : 0.f;
          ps[tid][t] = p;
          sum += p;
        }
        m_s[tid] = mx;
        l_s[tid] = l_s[tid] * corr + sum;
        corr_s[tid] = corr;
      }
      __syncthreads();
#pragma unroll
      for (int e = 0; e < kAcc; ++e) {
        const int flat = tid + e * kAttnThreads, h = flat / d, dd = flat % d;
        if (h < group) {
          float a = acc[e] * corr_s[h];
          for (int t = 0; t < n_keys; ++t) a += ps[h][t] * vs[t][dd];
          acc[e] = a;
        }
      }
      __syncthreads();
    }
  }
  float* out = partial + ((long long)g * splits + split) * group * (d + 2);
#pragma unroll
  for (int e = 0; e < kAcc; ++e) {
    const int flat = tid + e * kAttnThreads, h = flat / d, dd = flat % d;
    if (h < group) out[h * (d + 2) + dd] = acc[e];
  }
  if (tid < group) {
    out[tid * (d + 2) + d] = m_s[tid];
    out[tid * (d + 2) + d + 1] = l_s[tid];
  }
}

// grid hq, d threads: merge the splits of query head h.
template <typename T>
__global__ void merge_kernel(const float* __restrict__ partial, int group, int d, int splits,
                             T* __restrict__ out) {
  const int h = blockIdx.x, g = h / group, hl = h % group, dd = threadIdx.x;
  const float* base = partial + (long long)g * splits * group * (d + 2) + hl * (d + 2);
  const long long step = (long long)group * (d + 2);
  float mx = -INFINITY;
#pragma unroll 8
  for (int sp = 0; sp < splits; ++sp) mx = fmaxf(mx, base[sp * step + d]);
  float num = 0.f, den = 0.f;
#pragma unroll 8
  for (int sp = 0; sp < splits; ++sp) {   // branch-free, so 8 splits' loads are in flight at once
    const float m = base[sp * step + d];
    const float w = m == -INFINITY ? 0.f : __expf(m - mx);   // an empty split adds nothing
    num += w * base[sp * step + dd];
    den += w * base[sp * step + d + 1];
  }
  out[(long long)h * d + dd] = from_float<T>(den > 0.f ? num / den : 0.f);
}

int blocks_per_split(int hkv, int budget);

// Bytes of the stage-2 partials [hkv, splits, group, d + 2]; they sit at offset 0 of the
// workspace so sparse_decode needs nothing but its own sizes.
size_t partial_bytes(int hq, int hkv, int d, int budget) {
  const int bps = blocks_per_split(hkv, budget);
  const int splits = (budget + bps - 1) / bps;
  return align256(sizeof(float) * (size_t)hkv * splits * (hq / hkv) * (d + 2));
}

struct Workspace {
  float* logits;   // coarse logits [hq, n2], n2 <= length / (4 * kernel_stride) + 1
  float* lse;      // [hq]
  float* s;        // group fine scores [hkv, n1], n1 <= length
  float* ranked;   // [hkv, n_blocks]
  size_t end;      // bytes used from the base
};

Workspace carve(void* base, int hq, int hkv, int d, int budget, int length, int kernel_stride) {
  const int n_blocks_cap = length;   // block_size >= kernel_stride >= 1
  size_t off = partial_bytes(hq, hkv, d, budget);
  char* p = static_cast<char*>(base);
  Workspace w;
  w.logits = reinterpret_cast<float*>(p + off);
  off += align256(sizeof(float) * (size_t)hq * (length / (4 * kernel_stride) + 1));
  w.lse = reinterpret_cast<float*>(p + off);
  off += align256(sizeof(float) * hq);
  w.s = reinterpret_cast<float*>(p + off);
  off += align256(sizeof(float) * (size_t)hkv * length);
  w.ranked = reinterpret_cast<float*>(p + off);
  off += align256(sizeof(float) * (size_t)hkv * n_blocks_cap);
  w.end = off;
  return w;
}

bool shapes_ok(int hq, int hkv, int d) {
  return hq > 0 && hkv > 0 && hq % hkv == 0 && hq / hkv <= kMaxGroup && d > 0 && d % 32 == 0 &&
         d <= kMaxD;
}

int blocks_per_split(int hkv, int budget) {
  const int bps = (budget * hkv) / (2 * sm_count());
  return bps < 1 ? 1 : bps;
}

template <typename T>
cudaError_t compress_t(const void* k, int hkv, int d, long long kv_head_stride, int old_len,
                       int new_len, int kernel, int stride, float* out, long long out_head_stride,
                       cudaStream_t stream) {
  const int first = n_kernels(old_len, kernel, stride);
  const int count = n_kernels(new_len, kernel, stride) - first;
  if (count <= 0) return cudaSuccess;
  dim3 grid((count + 7) / 8, hkv);
  compress_kernel<T><<<grid, 256, 0, stream>>>(static_cast<const T*>(k), d, kv_head_stride, first,
                                               count, kernel, stride, out, out_head_stride);
  return cudaGetLastError();
}

template <typename T>
cudaError_t select_t(const void* q, const float* fine, long long fine_head_stride,
                     const float* coarse, long long coarse_head_stride, int hq, int hkv, int d,
                     int length, int kernel_size, int kernel_stride, int block_size,
                     int init_blocks, int local_blocks, int budget, float scale, int* idx,
                     void* workspace, cudaStream_t stream) {
  const int group = hq / hkv;
  const int n1 = n_kernels(length, kernel_size, kernel_stride);
  const int n2 = n_kernels(length, 4 * kernel_size, 4 * kernel_stride);
  const int n_blocks = (length + block_size - 1) / block_size;
  const Workspace w = carve(workspace, hq, hkv, d, budget, length, kernel_stride);
  const T* qt = static_cast<const T*>(q);
  if (n2 > 0) {
    coarse_logit_kernel<T><<<dim3((n2 + 7) / 8, hkv), 256, 0, stream>>>(
        qt, coarse, coarse_head_stride, group, d, n2, scale, w.logits);
  }
  lse_kernel<<<hq, 256, 0, stream>>>(w.logits, n2, w.lse);
  if (n1 > 0) {
    fine_score_kernel<T><<<dim3((n1 + 7) / 8, hkv), 256, 0, stream>>>(
        qt, fine, fine_head_stride, w.lse, group, d, n1, scale, w.s);
  }
  pool_rank_kernel<<<dim3((n_blocks + 255) / 256, hkv), 256, 0, stream>>>(
      w.s, n1, n_blocks, block_size / kernel_stride, init_blocks, local_blocks, w.ranked);
  topk_kernel<<<hkv, kTopkThreads, n_blocks * sizeof(uint32_t), stream>>>(w.ranked, n_blocks,
                                                                          budget, idx);
  return cudaGetLastError();
}

template <typename T>
cudaError_t sparse_t(const void* q, const void* k, const void* v, long long kv_head_stride,
                     const int* idx, int hq, int hkv, int d, int length, int block_size, int budget,
                     float scale, void* out, void* workspace, cudaStream_t stream) {
  const int group = hq / hkv;
  float* partial = static_cast<float*>(workspace);   // offset 0, see partial_bytes
  const int bps = blocks_per_split(hkv, budget);
  const int splits = (budget + bps - 1) / bps;
  sparse_attn_kernel<T><<<dim3(hkv, splits), kAttnThreads, 0, stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
      kv_head_stride, idx, group, d, length, block_size, budget, bps, scale, partial);
  merge_kernel<T><<<hq, d, 0, stream>>>(partial, group, d, splits, static_cast<T*>(out));
  return cudaGetLastError();
}

// Calls fn(T{}) with T the element type of `dtype` (ARKINFER_FP16 / BF16 / FP32).
template <typename Fn>
int by_dtype(int dtype, Fn&& fn) {
  switch (dtype) {
    case ARKINFER_FP16: return (int)fn(half{});
    case ARKINFER_BF16: return (int)fn(__nv_bfloat16{});
    case ARKINFER_FP32: return (int)fn(float{});
    default: return (int)cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" int arkinfer_infllmv2_compress(const void* k, int dtype, int hkv, int d,
                                          long long kv_head_stride, int old_len, int new_len,
                                          int kernel_size, int kernel_stride, float* out,
                                          long long out_head_stride, cudaStream_t stream) {
  if (hkv <= 0 || d <= 0 || kernel_size <= 0 || kernel_stride <= 0 || old_len < 0 ||
      new_len < old_len) {
    return (int)cudaErrorInvalidValue;
  }
  return by_dtype(dtype, [&](auto t) {
    return compress_t<decltype(t)>(k, hkv, d, kv_head_stride, old_len, new_len, kernel_size,
                                   kernel_stride, out, out_head_stride, stream);
  });
}

extern "C" size_t arkinfer_infllmv2_workspace_bytes(int hq, int hkv, int d, int length,
                                                    int kernel_size, int kernel_stride,
                                                    int block_size, int budget) {
  (void)kernel_size;
  (void)block_size;
  if (!shapes_ok(hq, hkv, d) || length <= 0 || kernel_stride <= 0 || budget <= 0) return 0;
  return carve(nullptr, hq, hkv, d, budget, length, kernel_stride).end;
}

extern "C" int arkinfer_infllmv2_select(const void* q, int dtype, const float* fine,
                                        long long fine_head_stride, const float* coarse,
                                        long long coarse_head_stride, int hq, int hkv, int d,
                                        int length, int kernel_size, int kernel_stride,
                                        int block_size, int init_blocks, int local_blocks,
                                        int budget, float scale, int* idx, void* workspace,
                                        cudaStream_t stream) {
  const int n_blocks = length > 0 && block_size > 0 ? (length + block_size - 1) / block_size : 0;
  if (!shapes_ok(hq, hkv, d) || length <= 0 || kernel_stride <= 0 || block_size % kernel_stride ||
      budget <= 0 || n_blocks > kMaxBlocks) {
    return (int)cudaErrorInvalidValue;
  }
  return by_dtype(dtype, [&](auto t) {
    return select_t<decltype(t)>(q, fine, fine_head_stride, coarse, coarse_head_stride, hq, hkv, d,
                                 length, kernel_size, kernel_stride, block_size, init_blocks,
                                 local_blocks, budget, scale, idx, workspace, stream);
  });
}

extern "C" int arkinfer_infllmv2_sparse_decode(const void* q, const void* k, const void* v,
                                               int dtype, long long kv_head_stride, const int* idx,
                                               int hq, int hkv, int d, int length, int block_size,
                                               int budget, float scale, void* out, void* workspace,
                                               cudaStream_t stream) {
  if (!shapes_ok(hq, hkv, d) || length <= 0 || block_size <= 0 || budget <= 0) {
    return (int)cudaErrorInvalidValue;
  }
  return by_dtype(dtype, [&](auto t) {
    return sparse_t<decltype(t)>(q, k, v, kv_head_stride, idx, hq, hkv, d, length, block_size,
                                 budget, scale, out, workspace, stream);
  });
}
