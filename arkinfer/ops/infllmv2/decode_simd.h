/* AVX2 + FMA building blocks of the InfLLM v2 decode kernel (decode_kernel.c includes this).
 *
 * Rows are D fp32 values `ld` floats apart. A 16-bit cache (bf16 or fp16) is first widened, 64
 * rows at a time, into a small fp32 buffer that stays in L1/L2 (`widen_rows`); every kernel below
 * then reads fp32 only.
 *
 *   scores_tiles: s[g * ns + t] = q[g] . row[t]   for g < G, t < n   (q given row-major, qR[g *
 *                 D + d], and transposed and zero-padded, qT[d * Gp + g], Gp = G rounded up to 8)
 *   pv_tiles:     out[g * D + j] += p[g * np + t] * row[t][j]          for g < GP (G, or G rounded
 *                 up to 4 when G > 2; the padded heads' p rows hold zeros), j < D (a multiple of 16,
 *                 of 32 when G <= 2)
 *   exp256:       exp of 8 floats, ~1 ulp, exact at the edges (+inf, 0 for -inf, NaN kept,
 *                 subnormal results kept)
 *   ark_pf:       the cache lines of the rows read next, which the tiles above request one at
 *                 a time between their multiply-adds (the caller issues what is left over)
 */
#ifndef ARK_DECODE_SIMD_H
#define ARK_DECODE_SIMD_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { ARK_F32 = 0, ARK_BF16 = 1, ARK_F16 = 2 };

static inline float ark_to_f32(const void *p, int64_t i, int dtype) {
    if (dtype == ARK_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    if (dtype == ARK_F16) return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* fp32 -> dtype, round to nearest even, as torch's .to() (a bf16 NaN becomes 0x7fc0). */
static inline void ark_from_f32(void *p, int64_t i, int dtype, float f) {
    if (dtype == ARK_F32) { ((float *)p)[i] = f; return; }
    if (dtype == ARK_F16) { ((uint16_t *)p)[i] = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); return; }
    uint32_t u;
    memcpy(&u, &f, 4);
    ((uint16_t *)p)[i] = f != f ? (uint16_t)0x7fc0
                                : (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* n rows of D 16-bit values (`ld` elements apart) -> dst [n, D] fp32. */
static void widen_rows(const uint16_t *src, int64_t ld, int64_t n, int64_t D, int dtype,
                       float *dst) {
    for (int64_t t = 0; t < n; t++) {
        const uint16_t *r = src + t * ld;
        float *o = dst + t * D;
        if (dtype == ARK_F16) {
            for (int64_t j = 0; j < D; j += 8)
                _mm256_storeu_ps(o + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + j))));
        } else {
            for (int64_t j = 0; j < D; j += 8) {
                __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(r + j)));
                _mm256_storeu_ps(o + j, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
            }
        }
    }
}

/* exp(x): Cody-Waite reduction x = n ln2 + r, Cephes' degree-6 polynomial on r, 2^n applied as
 * two factors so results down to the subnormals and up to +inf come out right. */
static inline __m256 exp256(__m256 x) {
    /* max/min return their second operand when one is NaN: x stays NaN through the clamp. */
    x = _mm256_min_ps(_mm256_set1_ps(89.0f), _mm256_max_ps(_mm256_set1_ps(-110.0f), x));
    const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i n = _mm256_cvtps_epi32(fx);
    const __m256i a = _mm256_srai_epi32(n, 1), b = _mm256_sub_epi32(n, a);
    const __m256i bias = _mm256_set1_epi32(127);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(a, bias), 23)));
    return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, bias), 23)));
}

#define ARK_INLINE static inline __attribute__((always_inline))

/* Cache lines a tile requests while it computes (the caller lists the lines of the rows it reads
 * next): one per ark_pf_step, which the tiles call every few multiply-adds, so the requests
 * overlap the arithmetic. Issued at once, a run's lines (256 for 32 fp32 rows of 128) filled the
 * core's ~16 line-fill buffers, and the core stalled on the prefetches with its FMA units idle;
 * spread over the tile, stage 1 of a 16-head group at 128K ran 5 % faster. The caller issues
 * what a short tile left over (ark_pf_rest). The requests go to L2 (prefetcht1), which keeps more
 * lines in flight than L1's fill buffers: KV evicted, fp32 group 16 at 32K 3-6 % faster, the
 * AMX bf16 step (decode_amx.h) 14 %. */
typedef struct {
    const char **line;
    int64_t n, i;
} ark_pf;

ARK_INLINE void ark_pf_step(ark_pf *q) {
    if (q->i < q->n) _mm_prefetch(q->line[q->i++], _MM_HINT_T1);
}

static inline void ark_pf_rest(ark_pf *q) {
    while (q->i < q->n) _mm_prefetch(q->line[q->i++], _MM_HINT_T1);
}

/* Lanes t < n of 8 (for loop tails): loads pad with `fill`, stores write only lanes < n. */
static inline __m256i lane_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline __m256 load_part(const float *p, int64_t n, float fill) {
    const __m256i m = lane_mask(n);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline float hmax256(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* Scores of one tile of 8 * NV heads (NV = 1 or 2) against n rows; qT row stride qs. Register
 * tile: 8 accumulators, 8 rows x 8 heads (NV = 1) or 4 rows x 16 heads (NV = 2), one broadcast
 * per row element. Eight independent FMA chains keep both FMA units busy (4-cycle latency); the
 * former 4-row tile of NV = 1 had four, and groups of 5-8 heads ran at half the FMA rate. */
static void scores_tile(int NV, const float *qT, int64_t qs, int64_t D, const float *k, int64_t ld,
                        int64_t n, float *s, int64_t ns, int64_t heads, ark_pf *pf) {
    float tmp[8][16];
    int64_t t = 0;
    if (NV == 1) {
        for (; t + 8 <= n; t += 8) {
            const float *k0 = k + t * ld;
            __m256 a[8];
            for (int r = 0; r < 8; r++) a[r] = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d++) {
                if (d & 1) ark_pf_step(pf);
                const __m256 q0 = _mm256_loadu_ps(qT + d * qs);
                for (int r = 0; r < 8; r++)
                    a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(k0 + r * ld + d), q0, a[r]);
            }
            for (int r = 0; r < 8; r++) _mm256_storeu_ps(tmp[r], a[r]);
            for (int64_t g = 0; g < heads; g++)
                for (int r = 0; r < 8; r++) s[g * ns + t + r] = tmp[r][g];
        }
    }
    for (; t + 4 <= n; t += 4) {
        const float *k0 = k + t * ld, *k1 = k0 + ld, *k2 = k1 + ld, *k3 = k2 + ld;
        __m256 a00 = _mm256_setzero_ps(), a10 = a00, a20 = a00, a30 = a00;
        __m256 a01 = a00, a11 = a00, a21 = a00, a31 = a00;
        if (NV == 2) {
            for (int64_t d = 0; d < D; d++) {
                if (d & 1) ark_pf_step(pf);
                const __m256 q0 = _mm256_loadu_ps(qT + d * qs), q1 = _mm256_loadu_ps(qT + d * qs + 8);
                __m256 b = _mm256_broadcast_ss(k0 + d);
                a00 = _mm256_fmadd_ps(b, q0, a00); a01 = _mm256_fmadd_ps(b, q1, a01);
                b = _mm256_broadcast_ss(k1 + d);
                a10 = _mm256_fmadd_ps(b, q0, a10); a11 = _mm256_fmadd_ps(b, q1, a11);
                b = _mm256_broadcast_ss(k2 + d);
                a20 = _mm256_fmadd_ps(b, q0, a20); a21 = _mm256_fmadd_ps(b, q1, a21);
                b = _mm256_broadcast_ss(k3 + d);
                a30 = _mm256_fmadd_ps(b, q0, a30); a31 = _mm256_fmadd_ps(b, q1, a31);
            }
        } else {
            for (int64_t d = 0; d < D; d++) {
                if (d & 1) ark_pf_step(pf);
                const __m256 q0 = _mm256_loadu_ps(qT + d * qs);
                a00 = _mm256_fmadd_ps(_mm256_broadcast_ss(k0 + d), q0, a00);
                a10 = _mm256_fmadd_ps(_mm256_broadcast_ss(k1 + d), q0, a10);
                a20 = _mm256_fmadd_ps(_mm256_broadcast_ss(k2 + d), q0, a20);
                a30 = _mm256_fmadd_ps(_mm256_broadcast_ss(k3 + d), q0, a30);
            }
        }
        _mm256_storeu_ps(tmp[0], a00); _mm256_storeu_ps(tmp[0] + 8, a01);
        _mm256_storeu_ps(tmp[1], a10); _mm256_storeu_ps(tmp[1] + 8, a11);
        _mm256_storeu_ps(tmp[2], a20); _mm256_storeu_ps(tmp[2] + 8, a21);
        _mm256_storeu_ps(tmp[3], a30); _mm256_storeu_ps(tmp[3] + 8, a31);
        for (int64_t g = 0; g < heads; g++)
            for (int r = 0; r < 4; r++) s[g * ns + t + r] = tmp[r][g];
    }
    for (; t < n; t++) {
        const float *k0 = k + t * ld;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        for (int64_t d = 0; d < D; d++) {
            const __m256 b = _mm256_broadcast_ss(k0 + d);
            a0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(qT + d * qs), a0);
            if (NV == 2) a1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(qT + d * qs + 8), a1);
        }
        _mm256_storeu_ps(tmp[0], a0); _mm256_storeu_ps(tmp[0] + 8, a1);
        for (int64_t g = 0; g < heads; g++) s[g * ns + t] = tmp[0][g];
    }
}


/* The 8 sums of a0..a7's lanes, in order: one reduction tree (9 instructions) instead of 8
 * horizontal sums (~7 each; callgrind: they were a fifth of the G <= 4 dot-product loop). */
static inline __m256 hsum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                             __m256 a6, __m256 a7) {
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* Scores of G <= 4 heads as dot products along D (q row-major: q[g * D + d]). A head tile would
 * waste 8 - G of its 8 lanes. 8 accumulators at once, R = 8 / G4 rows x G4 heads (G4 = G, or 4
 * for G = 3: one idle head), reduced by hsum8x8 into one vector: lane r + R * g is row r of
 * head g. Leftover rows (n % R), one at a time. */
ARK_INLINE void scores_dot(const int G, const float *q, int64_t D, const float *k, int64_t ld,
                           int64_t n, float *s, int64_t ns, ark_pf *pf) {
    const int G4 = G == 3 ? 4 : G, R = 8 / G4;
    int64_t t = 0;
    for (; t + R <= n; t += R) {
        __m256 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) {
            for (int i = 0; i < 4; i++) ark_pf_step(pf);
            __m256 x[8];
            for (int r = 0; r < R; r++) x[r] = _mm256_loadu_ps(k + (t + r) * ld + d);
            for (int g = 0; g < G; g++) {
                const __m256 qv = _mm256_loadu_ps(q + g * D + d);
                for (int r = 0; r < R; r++) a[g * R + r] = _mm256_fmadd_ps(x[r], qv, a[g * R + r]);
            }
        }
        float out[8];
        _mm256_storeu_ps(out, hsum8x8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]));
        for (int g = 0; g < G; g++)
            for (int r = 0; r < R; r++) s[g * ns + t + r] = out[g * R + r];
    }
    for (; t < n; t++) {
        for (int g = 0; g < G; g++) {
            __m256 acc = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 8)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(k + t * ld + d),
                                      _mm256_loadu_ps(q + g * D + d), acc);
            s[g * ns + t] = hsum256(acc);
        }
    }
}

/* -- AVX-512 variants of the two compute-bound tiles (groups of more than 4 heads) -----------
 * Same arithmetic per output lane, in the same order (one fused multiply-add per element, rows /
 * columns in the same sequence), so they give the AVX2 tiles' bits at twice the FMA width. Used
 * where the CPU has AVX-512F and VL (checked once at run time, `ark_zmm`); the file stays AVX2. */
#define ARK_ZMM __attribute__((target("avx512f,avx512vl,fma")))

/* The 16 x 16 transpose of a[0..15] (a[r] lane g becomes a[g] lane r): four stages of 16
 * shuffles, the classic unpack_ps / unpack_pd / shuffle_f32x4 network. */
ARK_ZMM static inline void transpose16_zmm(__m512 a[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(a[i], a[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(a[i], a[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        const __m512d t0 = _mm512_castps_pd(t[i]), t1 = _mm512_castps_pd(t[i + 1]);
        const __m512d t2 = _mm512_castps_pd(t[i + 2]), t3 = _mm512_castps_pd(t[i + 3]);
        a[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        a[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        a[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        a[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_f32x4(a[i + j], a[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_f32x4(a[i + j], a[i + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        a[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
        a[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
    }
}

/* As scores_tile with 9..16 heads in one zmm (lanes >= heads masked off): 16 rows per pass (16
 * independent FMA chains: the former 8 kept both FMA units at exactly their 4-cycle latency, and
 * ran at about half their rate), then 8, then one. The prefetch queue is a local copy, so its
 * cursor stays in a register (through *pf it was stored and reloaded every step). */
ARK_ZMM ARK_INLINE void scores_tile_zmm_ld(const float *qT, int64_t qs, int64_t D, const float *k,
                                           int64_t ld, int64_t n, float *s, int64_t ns,
                                           int64_t heads, ark_pf *pf) {
    const __mmask16 lanes = (__mmask16)((1u << heads) - 1u);
    ark_pf q = *pf;   /* a local copy stays in registers; *pf's cursor is written back below */
    float tmp[8][16];
    int64_t t = 0;
    for (; t + 16 <= n; t += 16) {
        const float *k0 = k + t * ld;
        __m512 a[16];
        for (int r = 0; r < 16; r++) a[r] = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d++) {
            ark_pf_step(&q);
            const __m512 qd = _mm512_maskz_loadu_ps(lanes, qT + d * qs);
            for (int r = 0; r < 16; r++)
                a[r] = _mm512_fmadd_ps(_mm512_set1_ps(k0[r * ld + d]), qd, a[r]);
        }
        transpose16_zmm(a);
        for (int64_t g = 0; g < heads; g++) _mm512_storeu_ps(s + g * ns + t, a[g]);
    }
    for (; t + 8 <= n; t += 8) {
        const float *k0 = k + t * ld;
        __m512 a[8];
        for (int r = 0; r < 8; r++) a[r] = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d++) {
            if (d & 1) ark_pf_step(&q);
            const __m512 qd = _mm512_maskz_loadu_ps(lanes, qT + d * qs);
            for (int r = 0; r < 8; r++)
                a[r] = _mm512_fmadd_ps(_mm512_set1_ps(k0[r * ld + d]), qd, a[r]);
        }
        for (int r = 0; r < 8; r++) _mm512_storeu_ps(tmp[r], a[r]);
        for (int64_t g = 0; g < heads; g++)
            for (int r = 0; r < 8; r++) s[g * ns + t + r] = tmp[r][g];
    }
    pf->i = q.i;
    for (; t < n; t++) {
        const float *k0 = k + t * ld;
        __m512 a0 = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d++)
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(k0[d]), _mm512_maskz_loadu_ps(lanes, qT + d * qs),
                                 a0);
        _mm512_storeu_ps(tmp[0], a0);
        for (int64_t g = 0; g < heads; g++) s[g * ns + t] = tmp[0][g];
    }
}

/* scores_tile_zmm_ld, with the row stride a constant for the usual contiguous rows of 128
 * floats: the 16 rows of a pass are then one pointer and 16 displacements, where a run-time
 * stride takes 16 registers and spilled 7 of them, a reload per multiply-add step. */
ARK_ZMM static void scores_tile_zmm(const float *qT, int64_t qs, int64_t D, const float *k,
                                    int64_t ld, int64_t n, float *s, int64_t ns, int64_t heads,
                                    ark_pf *pf) {
    if (ld == 128 && D == 128) scores_tile_zmm_ld(qT, qs, 128, k, 128, n, s, ns, heads, pf);
    else scores_tile_zmm_ld(qT, qs, D, k, ld, n, s, ns, heads, pf);
}

/* As scores_tile with 5..8 heads (NV = 1), compiled for AVX-512 so that 16 rows per pass fit the
 * 32 vector registers: 16 independent FMA chains instead of 8 (see scores_tile_zmm). It stays a
 * ymm twin of scores_tile_zmm on purpose: that tile with 8 lanes masked gives the same bits but
 * ran group 8 (fp32, caches warm) 3-9 % slower here, and equal from DRAM (session 16, runs
 * alternated). */
ARK_ZMM ARK_INLINE void scores_tile8_zmm_ld(const float *qT, int64_t qs, int64_t D, const float *k,
                                            int64_t ld, int64_t n, float *s, int64_t ns,
                                            int64_t heads, ark_pf *pf) {
    ark_pf q = *pf;   /* as scores_tile_zmm_ld */
    int64_t t = 0;
    for (; t + 16 <= n; t += 16) {
        const float *k0 = k + t * ld;
        __m256 a[16];
        for (int r = 0; r < 16; r++) a[r] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d++) {
            ark_pf_step(&q);
            const __m256 qd = _mm256_loadu_ps(qT + d * qs);
            for (int r = 0; r < 16; r++)
                a[r] = _mm256_fmadd_ps(_mm256_set1_ps(k0[r * ld + d]), qd, a[r]);
        }
        __m512 w[16];    /* lanes 8-15 zero: the transpose's rows 8-15 are not stored */
        for (int r = 0; r < 16; r++) w[r] = _mm512_zextps256_ps512(a[r]);
        transpose16_zmm(w);
        for (int64_t g = 0; g < heads; g++) _mm512_storeu_ps(s + g * ns + t, w[g]);
    }
    pf->i = q.i;
    if (t < n) scores_tile(1, qT, qs, D, k + t * ld, ld, n - t, s + t, ns, heads, pf);
}

ARK_ZMM static void scores_tile8_zmm(const float *qT, int64_t qs, int64_t D, const float *k,
                                     int64_t ld, int64_t n, float *s, int64_t ns, int64_t heads,
                                     ark_pf *pf) {
    if (ld == 128 && D == 128) scores_tile8_zmm_ld(qT, qs, 128, k, 128, n, s, ns, heads, pf);
    else scores_tile8_zmm_ld(qT, qs, D, k, ld, n, s, ns, heads, pf);
}

/* As pv_tile(4, W) for 4 heads x 64 floats (4 zmm per row): out[h][j..j+63] += p[h][t] row[t]. */
ARK_ZMM static void pv_tile_zmm(const float *p, int64_t np, const float *v, int64_t ld, int64_t n,
                                float *o, int64_t D, ark_pf *pf) {
    __m512 acc[4][4];
    for (int h = 0; h < 4; h++)
        for (int w = 0; w < 4; w++) acc[h][w] = _mm512_loadu_ps(o + h * D + 16 * w);
    for (int64_t t = 0; t < n; t++) {
        ark_pf_step(pf);
        __m512 x[4];
        for (int w = 0; w < 4; w++) x[w] = _mm512_loadu_ps(v + t * ld + 16 * w);
        for (int h = 0; h < 4; h++) {
            const __m512 b = _mm512_set1_ps(p[h * np + t]);
            for (int w = 0; w < 4; w++) acc[h][w] = _mm512_fmadd_ps(b, x[w], acc[h][w]);
        }
    }
    for (int h = 0; h < 4; h++)
        for (int w = 0; w < 4; w++) _mm512_storeu_ps(o + h * D + 16 * w, acc[h][w]);
}

/* -- AVX-512 variants of the exponential phases ------------------------------------------------
 * exp512 is exp256 on 16 lanes (the same bits per lane; its last steps are scalef). The loops
 * below keep their AVX2 twins' order of additions: a sum over heads per lane, or an 8-lane
 * running sum fed one block of 8 after the other (a block past the end adds zeros, which changes
 * no bits), so they give the same results at twice the width. */
ARK_ZMM static inline __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-110.0f), x));
    const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    /* y * 2^a * 2^b, a = floor(fx / 2), b = fx - a, as exp256's two multiplies by exponents it
     * builds from integers, in 5 instructions instead of 9: scalef multiplies by 2^a with the
     * same single rounding (every one of the 2^32 inputs gives exp256's bits; NaN stays NaN). */
    const __m512 a = _mm512_roundscale_ps(_mm512_mul_ps(fx, _mm512_set1_ps(0.5f)),
                                          _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    return _mm512_scalef_ps(_mm512_scalef_ps(y, a), _mm512_sub_ps(fx, a));
}

ARK_ZMM static inline __mmask16 lanes16(int64_t n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

/* s[j] = sum over g < G of nan->0(exp(L[g * ld + j] - lse[g])), for j < n (phase C). */
ARK_ZMM static void group_exp_sum_zmm(const float *L, int64_t ld, const float *lse, int64_t G,
                                      int64_t n, float *s) {
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = lanes16(n - j);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t g = 0; g < G; g++) {
            const __m512 x = _mm512_maskz_loadu_ps(m, L + g * ld + j);
            const __m512 p = exp512(_mm512_sub_ps(x, _mm512_set1_ps(lse[g])));
            acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, p, _CMP_ORD_Q), p));
        }
        _mm512_mask_storeu_ps(s + j, m, acc);
    }
}

/* max of x[0..n) with NaN skipped (-inf when n == 0), as hmax256 over the AVX2 loop. */
ARK_ZMM static float max_zmm(const float *x, int64_t n) {
    __m512 vm = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < n; t += 16)
        vm = _mm512_max_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), lanes16(n - t), x + t),
                           vm);
    return _mm512_reduce_max_ps(vm);
}

/* Sum of exp(x[t] - shift) for t < n, added up as the AVX2 loops do (an 8-lane running sum, then
 * hsum256); out (may be x, or NULL) receives the exponentials. */
ARK_ZMM static float exp_sum_zmm(const float *x, int64_t n, float shift, float *out) {
    const __m512 vs = _mm512_set1_ps(shift);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t t = 0; t < n; t += 16) {
        const __mmask16 m = lanes16(n - t);
        const __m512 e = exp512(_mm512_sub_ps(
            _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, x + t), vs));
        if (out) _mm512_mask_storeu_ps(out + t, m, e);
        sum = _mm256_add_ps(sum, _mm512_castps512_ps256(e));
        sum = _mm256_add_ps(sum, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    }
    return hsum256(sum);
}

/* cl[j] = (((L[f j] + L[f j + step]) + L[f j + 2 step]) + ...) * inv, the scalar loop's order,
 * 8 kernels at a time for f <= 4 (each term picked from 32 loaded floats by one permute), as
 * long as the loads stay below n1. Returns how many j it wrote (the caller does the rest). */
ARK_ZMM static int64_t coarse_means_zmm(const float *L, int64_t n1, int64_t f, int64_t step,
                                        float inv, float *cl, int64_t n2) {
    if (f < 1 || f > 4) return 0;
    const __m512i pick = _mm512_mullo_epi32(_mm512_set1_epi32((int)f),
                                            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0,
                                                              0, 0, 0, 0, 0));
    int64_t j = 0;
    for (; j + 8 <= n2 && f * j + (f - 1) * step + 32 <= n1; j += 8) {
        __m512 sum = _mm512_setzero_ps();
        for (int64_t m = 0; m < f; m++) {
            const float *base = L + f * j + m * step;
            const __m512 term = _mm512_permutex2var_ps(_mm512_loadu_ps(base), pick,
                                                       _mm512_loadu_ps(base + 16));
            sum = m ? _mm512_add_ps(sum, term) : term;
        }
        _mm256_storeu_ps(cl + j, _mm512_castps512_ps256(_mm512_mul_ps(sum, _mm512_set1_ps(inv))));
    }
    return j;
}

/* widen_rows 16 values at a time (D a multiple of 16): the same exact conversion, half the
 * instructions, which bf16 / fp16 steps spend for every K and V row they read. */
ARK_ZMM static void widen_rows_zmm(const uint16_t *src, int64_t ld, int64_t n, int64_t D, int dtype,
                                   float *dst) {
    for (int64_t t = 0; t < n; t++) {
        const uint16_t *r = src + t * ld;
        float *o = dst + t * D;
        if (dtype == ARK_F16) {
            for (int64_t j = 0; j < D; j += 16)
                _mm512_storeu_ps(o + j, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r + j))));
        } else {
            for (int64_t j = 0; j < D; j += 16) {
                const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r + j)));
                _mm512_storeu_ps(o + j, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
            }
        }
    }
}

/* 1 where the AVX-512 tiles run: the CPU has AVX-512F and VL, unless ark_set_zmm(0) turned them off
 * (tests compare both). */
static int ark_zmm = -1;

static int use_zmm(void) {
    if (ark_zmm < 0) {
        __builtin_cpu_init();
        ark_zmm = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") ? 1 : 0;
    }
    return ark_zmm;
}

/* s [G, n] (row stride ns) = q . rows for all G heads: dot products for G <= 4 (qR [G, D]),
 * otherwise tiles of 16 heads, then one of 8 (qT [D, Gp]). */
static void scores_tiles(const float *qT, const float *qR, int64_t G, int64_t D, const float *k,
                         int64_t ld, int64_t n, float *s, int64_t ns, ark_pf *pf) {
    switch (G) {
    case 1: scores_dot(1, qR, D, k, ld, n, s, ns, pf); return;
    case 2: scores_dot(2, qR, D, k, ld, n, s, ns, pf); return;
    case 3: scores_dot(3, qR, D, k, ld, n, s, ns, pf); return;
    case 4: scores_dot(4, qR, D, k, ld, n, s, ns, pf); return;
    default: break;
    }
    const int64_t qs = (G + 7) / 8 * 8;
    const int zmm = use_zmm();
    for (int64_t g0 = 0; g0 < G; g0 += 16) {
        const int64_t heads = G - g0 < 16 ? G - g0 : 16;
        if (zmm && heads > 8) scores_tile_zmm(qT + g0, qs, D, k, ld, n, s + g0 * ns, ns, heads, pf);
        else if (zmm) scores_tile8_zmm(qT + g0, qs, D, k, ld, n, s + g0 * ns, ns, heads, pf);
        else scores_tile(heads > 8 ? 2 : 1, qT + g0, qs, D, k, ld, n, s + g0 * ns, ns, heads,
                         pf);
    }
}

/* out [H, 8 * W floats at column j] += p [H, n] @ rows[:, j : j + 8W]: one register tile of
 * H heads x W vectors (H * W = 8 accumulators). */
ARK_INLINE void pv_tile(const int H, const int W, const float *p, int64_t np, const float *v,
                        int64_t ld, int64_t n, float *o, int64_t D, ark_pf *pf) {
    __m256 acc[4][4];
    for (int h = 0; h < H; h++)
        for (int w = 0; w < W; w++) acc[h][w] = _mm256_loadu_ps(o + h * D + 8 * w);
    for (int64_t t = 0; t < n; t++) {
        ark_pf_step(pf);
        __m256 x[4];
        for (int w = 0; w < W; w++) x[w] = _mm256_loadu_ps(v + t * ld + 8 * w);
        for (int h = 0; h < H; h++) {
            const __m256 b = _mm256_broadcast_ss(p + h * np + t);
            for (int w = 0; w < W; w++) acc[h][w] = _mm256_fmadd_ps(b, x[w], acc[h][w]);
        }
    }
    for (int h = 0; h < H; h++)
        for (int w = 0; w < W; w++) _mm256_storeu_ps(o + h * D + 8 * w, acc[h][w]);
}

/* out [GP, D] += p [GP, n] (row stride np) @ rows [n, D], GP = 1, 2 or a multiple of 4 (the
 * padded heads' p rows hold zeros). Tiles: 4 heads x 16 floats, or GP x 32 floats for GP <= 2.
 * Each 64-byte column j of the rows is read once per tile of heads (from L1 / L2: the caller
 * prefetched the rows; an L1 prefetch of the next column here was 10 % of the step's
 * instructions and measured no faster). */
static void pv_tiles(const float *p, int64_t np, int64_t GP, const float *v, int64_t ld, int64_t D,
                     int64_t n, float *out, ark_pf *pf) {
    if (GP >= 4 && D % 64 == 0 && use_zmm()) {
        for (int64_t j = 0; j < D; j += 64)
            for (int64_t g = 0; g < GP; g += 4)
                pv_tile_zmm(p + g * np, np, v + j, ld, n, out + g * D + j, D, pf);
        return;
    }
    const int64_t width = GP <= 2 && D % 32 == 0 ? 32 : 16;
    for (int64_t j = 0; j < D; j += width) {
        if (GP == 1 && width == 32) pv_tile(1, 4, p, np, v + j, ld, n, out + j, D, pf);
        else if (GP == 2 && width == 32) pv_tile(2, 4, p, np, v + j, ld, n, out + j, D, pf);
        else if (GP == 1) pv_tile(1, 2, p, np, v + j, ld, n, out + j, D, pf);
        else if (GP == 2) pv_tile(2, 2, p, np, v + j, ld, n, out + j, D, pf);
        else
            for (int64_t g = 0; g < GP; g += 4) pv_tile(4, 2, p + g * np, np, v + j, ld, n, out + g * D + j, D, pf);
    }
}

#endif
