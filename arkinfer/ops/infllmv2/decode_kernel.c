/* InfLLM v2 decode kernels (fp32, AVX2 + FMA), compiled on first use by native.py; torch is the
 * fallback wherever they do not apply.
 *
 * One KV head, G query heads (its GQA group; G = 8 or 16), head_dim D (a multiple of 16). Keys and
 * values are rows of D floats `ld` floats apart (the KV cache as it is, no copy). A query attends
 * to `nb` selected full blocks of `bs` rows (block ids in `blocks`), then to `ntail` rows from
 * row `tail0`; rows are visited in that order, t = 0 .. nb * bs + ntail - 1.
 *
 *   ark_scores: s[g * ns + t] = q[g] . k[row t]          (q given transposed: qT[d * G + g])
 *   ark_pv:     out[g * D + j] = sum_t p[g * np + t] * v[row t][j]
 *
 * Register tiles: scores keep 4 rows x G heads of accumulators (8 ymm), pv keeps 4 heads x 16
 * floats of the output (8 ymm); every FMA needs under one load, so both run near the FMA limit
 * when the rows stream from memory.
 */
#include <immintrin.h>
#include <stdint.h>

#define AHEAD 16   /* rows prefetched ahead of the one being read */

/* Prefetch row r of the run (rows past n continue into `next`, the following run, if any). */
static inline void prefetch_row(const float *k, const float *next, int64_t ld, int64_t n,
                                int64_t r, int64_t D) {
    const float *row = r < n ? k + r * ld : next ? next + (r - n) * ld : 0;
    if (!row) return;
    for (int64_t j = 0; j < D; j += 16) _mm_prefetch((const char *)(row + j), _MM_HINT_T0);
}

/* Scores of n consecutive rows k[0 .. n) for G = 8 * NV heads, into s (row stride ns). */
static void scores_run(int NV, const float *qT, int64_t D, const float *k, const float *next,
                       int64_t ld, int64_t n, float *s, int64_t ns) {
    const int G = 8 * NV;
    float tmp[4][16];
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
        const float *k0 = k + t * ld, *k1 = k0 + ld, *k2 = k1 + ld, *k3 = k2 + ld;
        for (int64_t r = t + AHEAD; r < t + AHEAD + 4; r++) prefetch_row(k, next, ld, n, r, D);
        __m256 a00 = _mm256_setzero_ps(), a10 = a00, a20 = a00, a30 = a00;
        __m256 a01 = a00, a11 = a00, a21 = a00, a31 = a00;
        if (NV == 2) {
            for (int64_t d = 0; d < D; d++) {
                const __m256 q0 = _mm256_loadu_ps(qT + d * 16), q1 = _mm256_loadu_ps(qT + d * 16 + 8);
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
                const __m256 q0 = _mm256_loadu_ps(qT + d * 8);
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
        for (int g = 0; g < G; g++)
            for (int r = 0; r < 4; r++) s[g * ns + t + r] = tmp[r][g];
    }
    for (; t < n; t++) {
        const float *k0 = k + t * ld;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        for (int64_t d = 0; d < D; d++) {
            const __m256 b = _mm256_broadcast_ss(k0 + d);
            a0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(qT + d * G), a0);
            if (NV == 2) a1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(qT + d * G + 8), a1);
        }
        _mm256_storeu_ps(tmp[0], a0); _mm256_storeu_ps(tmp[0] + 8, a1);
        for (int g = 0; g < G; g++) s[g * ns + t] = tmp[0][g];
    }
}

/* Returns 0, or -1 for an unsupported shape. s has G rows of ns >= nb * bs + ntail floats. */
int ark_scores(const float *qT, int G, int64_t D, const float *k, int64_t ld,
               const int64_t *blocks, int64_t nb, int64_t bs, int64_t tail0, int64_t ntail,
               float *s, int64_t ns) {
    if (G != 8 && G != 16) return -1;
    const int nv = G / 8;
    const float *tail = ntail ? k + tail0 * ld : 0;
    for (int64_t r = 0; r < AHEAD; r++)
        prefetch_row(nb ? k + blocks[0] * bs * ld : tail, 0, ld, nb ? bs : ntail, r, D);
    for (int64_t i = 0; i < nb; i++) {
        const float *next = i + 1 < nb ? k + blocks[i + 1] * bs * ld : tail;
        scores_run(nv, qT, D, k + blocks[i] * bs * ld, next, ld, bs, s + i * bs, ns);
    }
    if (ntail) scores_run(nv, qT, D, tail, 0, ld, ntail, s + nb * bs, ns);
    return 0;
}

/* out[g * D + j] += sum_t p[g * np + t] * v[t * ld + j] for n consecutive rows, all G heads;
 * meanwhile the nn rows of `next` (the following run) are prefetched, spread over the tiles. */
static void pv_run(int G, const float *p, int64_t np, const float *v, int64_t ld, int64_t D,
                   int64_t n, float *out, const float *next, int64_t nn) {
    const int64_t tiles = (D / 16) * (G / 4);
    const int64_t per_tile = (nn + tiles - 1) / tiles;
    int64_t fetched = 0;
    for (int64_t j = 0; j < D; j += 16) {
        for (int g = 0; g < G; g += 4) {
            for (int64_t r = fetched; r < fetched + per_tile && r < nn; r++)
                prefetch_row(next, 0, ld, nn, r, D);
            fetched += per_tile;
            float *o = out + g * D + j;
            __m256 a00 = _mm256_loadu_ps(o), a01 = _mm256_loadu_ps(o + 8);
            __m256 a10 = _mm256_loadu_ps(o + D), a11 = _mm256_loadu_ps(o + D + 8);
            __m256 a20 = _mm256_loadu_ps(o + 2 * D), a21 = _mm256_loadu_ps(o + 2 * D + 8);
            __m256 a30 = _mm256_loadu_ps(o + 3 * D), a31 = _mm256_loadu_ps(o + 3 * D + 8);
            const float *p0 = p + g * np, *p1 = p0 + np, *p2 = p1 + np, *p3 = p2 + np;
            for (int64_t t = 0; t < n; t++) {
                const __m256 v0 = _mm256_loadu_ps(v + t * ld + j);
                const __m256 v1 = _mm256_loadu_ps(v + t * ld + j + 8);
                __m256 w = _mm256_broadcast_ss(p0 + t);
                a00 = _mm256_fmadd_ps(w, v0, a00); a01 = _mm256_fmadd_ps(w, v1, a01);
                w = _mm256_broadcast_ss(p1 + t);
                a10 = _mm256_fmadd_ps(w, v0, a10); a11 = _mm256_fmadd_ps(w, v1, a11);
                w = _mm256_broadcast_ss(p2 + t);
                a20 = _mm256_fmadd_ps(w, v0, a20); a21 = _mm256_fmadd_ps(w, v1, a21);
                w = _mm256_broadcast_ss(p3 + t);
                a30 = _mm256_fmadd_ps(w, v0, a30); a31 = _mm256_fmadd_ps(w, v1, a31);
            }
            _mm256_storeu_ps(o, a00); _mm256_storeu_ps(o + 8, a01);
            _mm256_storeu_ps(o + D, a10); _mm256_storeu_ps(o + D + 8, a11);
            _mm256_storeu_ps(o + 2 * D, a20); _mm256_storeu_ps(o + 2 * D + 8, a21);
            _mm256_storeu_ps(o + 3 * D, a30); _mm256_storeu_ps(o + 3 * D + 8, a31);
        }
    }
}

/* out [G, D] = p [G, np] @ the rows of ark_scores. Returns 0, or -1 for an unsupported shape. */
int ark_pv(const float *p, int G, int64_t np, const float *v, int64_t ld, int64_t D,
           const int64_t *blocks, int64_t nb, int64_t bs, int64_t tail0, int64_t ntail,
           float *out) {
    if ((G != 8 && G != 16) || D % 16) return -1;
    for (int64_t i = 0; i < G * D; i++) out[i] = 0.0f;
    const float *tail = ntail ? v + tail0 * ld : 0;
    for (int64_t r = 0; r < AHEAD; r++)
        prefetch_row(nb ? v + blocks[0] * bs * ld : tail, 0, ld, nb ? bs : ntail, r, D);
    for (int64_t i = 0; i < nb; i++) {
        const float *next = i + 1 < nb ? v + blocks[i + 1] * bs * ld : tail;
        pv_run(G, p + i * bs, np, v + blocks[i] * bs * ld, ld, D, bs, out, next,
               i + 1 < nb ? bs : ntail);
    }
    if (ntail) pv_run(G, p + nb * bs, np, tail, ld, D, ntail, out, 0, 0);
    return 0;
}
