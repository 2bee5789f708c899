/* AMX tiles for stage 2 of a bf16 decode step (decode_kernel.c includes this after
 * decode_simd.h; docs/infllmv2.md §10).
 *
 * With a bf16 cache and a bf16 query, stage 2's two products run on the CPU's AMX unit
 * (Intel Sapphire Rapids and later: AMX-BF16), which multiplies bf16 pairs into fp32 sums at ~16x
 * the rate of AVX-512 fp32 FMAs. Stage 1 (fp32 by §9) never runs here. Per run of <= 32 rows:
 *
 *   scores  sT [16 rows][16 heads] fp32 = K rows (A: 16 rows x 32 dims, read in place from the
 *           cache) . qB (B: the query's dims in bf16 pairs), summed over D / 32 dim slices, then
 *           times `scale` (the AVX path scales q first: the two differ in the last fp32 bits)
 *   weights out [Gt heads][D] fp32 += (pH + pL) @ vB: the softmax weights p (fp32, in [0, 1])
 *           split into two bf16 parts (p = pH + pL to ~2^-17 relative), V rows interleaved in
 *           pairs (vB [16][D][2]: rows 2i and 2i+1 side by side, AMX's B layout)
 *
 * Products of bf16 values are exact in fp32, so the scores equal the fp32 path's up to the order
 * of the additions; the weighted sums differ by the pL rounding (< 2^-17 relative), far below a
 * bf16 output's 2^-9. AMX treats subnormal bf16 inputs as zero.
 *
 * Tiles (a per-thread configuration, loaded per chunk and released after it):
 *   0 scores C [16 rows x Gt fp32]   1 K A [16 rows x 32 bf16]   2 query B [16 x Gt pairs]
 *   3 out C [Gt x 16 fp32]           4 pH A [Gt x 32 bf16]       5 pL A [Gt x 32 bf16]
 *   6 V B [16 pairs x 16 columns]
 * Gt = min(G, 16) heads per tile; larger groups take ceil(G / 16) tiles of 16 (zero queries pad
 * the last one).
 */
#ifndef ARK_DECODE_AMX_H
#define ARK_DECODE_AMX_H

#if defined(__x86_64__) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define ARK_HAS_AMX 1
#include <cpuid.h>
#include <sys/syscall.h>
long syscall(long number, ...);   /* unistd.h declares it only outside strict C99 */
#else
#define ARK_HAS_AMX 0
#endif

#define ARK_AMX_ROWS 16     /* rows per scores tile; a run (RUN_ROWS = 32) is two of them */
#define ARK_AMX_PAIRS 16    /* row pairs per weighted-sum tile: 32 rows */

/* Floats of scratch the AMX chunk needs beyond the scores (sc) of its G heads: acc, sT, a K
 * tail buffer, vB, pH + pL, qB. */
static int64_t amx_scratch_floats(int64_t G, int64_t D) {
    const int64_t padded = (G + 15) / 16 * 16;
    return padded * D + 256 + 8 * D + 16 * D + 512 + padded * D / 2 + 64;
}

#if ARK_HAS_AMX
#define ARK_AMX \
    __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,fma")))
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int ark_amx = -1;

/* Whether the AMX tiles run: a CPU with AMX-BF16 and AVX512-BF16, and a kernel that grants this
 * process the tile state (Linux >= 5.16, arch_prctl). Checked once; call before threads start. */
static int use_amx(void) {
    if (ark_amx < 0) {
        /* CPUID leaf 7: subleaf 0 EDX bit 22 AMX-BF16, bit 24 AMX-TILE; subleaf 1 EAX bit 5
         * AVX512-BF16 (read directly: not every compiler's __builtin_cpu_supports knows them) */
        unsigned a0, b0, c0, d0, a1, b1, c1, d1;
        const int cpu = __get_cpuid_count(7, 0, &a0, &b0, &c0, &d0)
                        && __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)
                        && (d0 >> 22 & 1) && (d0 >> 24 & 1) && (a1 >> 5 & 1);
        __builtin_cpu_init();
        ark_amx = cpu && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")
                  && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    }
    return ark_amx;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) ark_tilecfg;

/* Load the tile shapes above for Gt heads per tile (1..16). */
ARK_AMX static void amx_configure(int64_t Gt) {
    ark_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    const uint16_t heads_bytes = (uint16_t)(Gt * 4);
    const uint8_t rows[7] = {16, 16, 16, (uint8_t)Gt, (uint8_t)Gt, (uint8_t)Gt, 16};
    const uint16_t colsb[7] = {heads_bytes, 64, heads_bytes, 64, 64, 64, 64};
    for (int t = 0; t < 7; t++) cfg.rows[t] = rows[t], cfg.colsb[t] = colsb[t];
    /* ldtilecfg directly: GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes, so the
     * stores above may be dropped (the tiles then stay unconfigured: SIGILL). */
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

ARK_AMX static void amx_release(void) { _tile_release(); }

/* qB [ceil(G / 16)][D / 32][16][Gt][2] bf16: for query tile qt and dim slice c, row i holds
 * (q[h][32c + 2i], q[h][32c + 2i + 1]) for the tile's heads h (zeros past G). q: G rows of D bf16,
 * `sh` elements apart. */
static void amx_pack_queries(const uint16_t *q, int64_t sh, int64_t G, int64_t Gt, int64_t D,
                             uint16_t *qB) {
    const int64_t tiles = (G + 15) / 16;
    for (int64_t qt = 0; qt < tiles; qt++)
        for (int64_t c = 0; c < D / 32; c++)
            for (int64_t i = 0; i < 16; i++)
                for (int64_t h = 0; h < Gt; h++) {
                    const int64_t g = qt * 16 + h, o = (((qt * (D / 32) + c) * 16 + i) * Gt + h) * 2;
                    qB[o] = g < G ? q[g * sh + 32 * c + 2 * i] : 0;
                    qB[o + 1] = g < G ? q[g * sh + 32 * c + 2 * i + 1] : 0;
                }
}

/* sT [16][16] fp32 (row stride 16; columns < Gt used) = 16 rows of k (bf16, `ld` elements
 * apart) . the queries of one tile of qB. */
ARK_AMX static void amx_scores16(const uint16_t *k, int64_t ld, const uint16_t *qB, int64_t Gt,
                                 int64_t D, float *sT) {
    _tile_zero(0);
    for (int64_t c = 0; c < D / 32; c++) {
        _tile_loadd(1, k + 32 * c, ld * 2);
        _tile_loadd(2, qB + c * 16 * Gt * 2, Gt * 4);
        _tile_dpbf16ps(0, 1, 2);
    }
    _tile_stored(0, sT, 64);
}

/* s[g * ns + r] = sT[r][g] * scale for heads g < heads and rows r < m: the score tile
 * transposed in registers (transpose16_zmm; 16 gathers before, which microcode that mitigates
 * gather data sampling makes slow: a fifth of a 16-head stage 2 in cache). */
ARK_AMX static void amx_store_scores(const float *sT, float scale, int64_t heads, int64_t m,
                                     float *s, int64_t ns, ark_pf *pf) {
    const __mmask16 rows = lanes16(m);
    const __m512 vs = _mm512_set1_ps(scale);
    __m512 a[16];
    for (int r = 0; r < 16; r++) a[r] = _mm512_loadu_ps(sT + 16 * r);
    transpose16_zmm(a);
    for (int64_t g = 0; g < heads; g++) {
        _mm512_mask_storeu_ps(s + g * ns, rows, _mm512_mul_ps(a[g], vs));
        for (int i = 0; i < 4; i++) ark_pf_step(pf);
    }
}

/* vB [16][D][2] bf16 = rows 2i and 2i + 1 of v (`ld` elements apart) interleaved element by
 * element; rows >= n are zeros. */
ARK_AMX static void amx_pack_rows(const uint16_t *v, int64_t ld, int64_t n, int64_t D,
                                  uint16_t *vB, ark_pf *pf) {
    __m512i lo_idx, hi_idx;
    uint16_t lo[32], hi[32];
    for (int j = 0; j < 32; j++) {
        lo[j] = (uint16_t)((j & 1) * 32 + j / 2);
        hi[j] = (uint16_t)((j & 1) * 32 + 16 + j / 2);
    }
    lo_idx = _mm512_loadu_si512(lo), hi_idx = _mm512_loadu_si512(hi);
    for (int64_t i = 0; i < ARK_AMX_PAIRS; i++) {
        const uint16_t *a = v + 2 * i * ld, *b = a + ld;
        uint16_t *o = vB + i * 2 * D;
        for (int64_t d = 0; d < D; d += 32) {
            const __m512i x = 2 * i < n ? _mm512_loadu_si512(a + d) : _mm512_setzero_si512();
            const __m512i y = 2 * i + 1 < n ? _mm512_loadu_si512(b + d) : _mm512_setzero_si512();
            _mm512_storeu_si512(o + 2 * d, _mm512_permutex2var_epi16(x, lo_idx, y));
            _mm512_storeu_si512(o + 2 * d + 32, _mm512_permutex2var_epi16(x, hi_idx, y));
            ark_pf_step(pf);
        }
    }
}

/* bf16 -> fp32 of the 16 values in the low (hi = 0) or high (hi = 1) half of a bf16 vector. */
ARK_AMX static inline __m512 amx_widen16(__m512i h, int hi) {
    const __m256i half = hi ? _mm512_extracti64x4_epi64(h, 1) : _mm512_castsi512_si256(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* pH, pL [Gt][32] bf16 from p [heads][n] fp32 (row stride np): pH = bf16(p), pL = bf16(p - pH);
 * rows >= heads and columns >= n are zeros. */
ARK_AMX static void amx_split_weights(const float *p, int64_t np, int64_t heads, int64_t Gt,
                                      int64_t n, uint16_t *pH, uint16_t *pL, ark_pf *pf) {
    const __mmask16 m0 = lanes16(n), m1 = n > 16 ? lanes16(n - 16) : 0;
    for (int64_t h = 0; h < Gt; h++) {
        __m512 x0 = _mm512_setzero_ps(), x1 = _mm512_setzero_ps();
        if (h < heads) {
            x0 = _mm512_maskz_loadu_ps(m0, p + h * np);
            x1 = _mm512_maskz_loadu_ps(m1, p + h * np + 16);
        }
        const __m512i hb = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
        const __m512 r0 = _mm512_sub_ps(x0, amx_widen16(hb, 0));
        const __m512 r1 = _mm512_sub_ps(x1, amx_widen16(hb, 1));
        _mm512_storeu_si512(pH + h * 32, hb);
        _mm512_storeu_si512(pL + h * 32, (__m512i)_mm512_cvtne2ps_pbh(r1, r0));
        ark_pf_step(pf);
        ark_pf_step(pf);
    }
}

/* acc [Gt][D] fp32 (row stride D) += (pH + pL) @ the 32 rows packed in vB. */
ARK_AMX static void amx_weighted_sum(const uint16_t *pH, const uint16_t *pL, const uint16_t *vB,
                                     int64_t D, float *acc, ark_pf *pf) {
    _tile_loadd(4, pH, 64);
    _tile_loadd(5, pL, 64);
    for (int64_t j = 0; j < D; j += 16) {
        _tile_loadd(3, acc + j, D * 4);
        _tile_loadd(6, vB + 2 * j, D * 4);
        _tile_dpbf16ps(3, 4, 6);
        _tile_dpbf16ps(3, 5, 6);
        _tile_stored(3, acc + j, D * 4);
        for (int i = 0; i < 4; i++) ark_pf_step(pf);
    }
}
#else
static int use_amx(void) { return 0; }
#endif

#endif
