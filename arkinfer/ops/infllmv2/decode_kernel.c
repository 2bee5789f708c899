/* InfLLM v2 decode step in C (docs/infllmv2.md §3-§4, §10): one new query per sequence, block
 * selection and block-sparse attention in one call, split over OpenMP threads. native.py builds it
 * on first use (AVX2 + FMA + F16C, -fopenmp when the compiler has it: the library then binds to
 * the libgomp torch has already loaded, so it runs on torch's own thread pool) and fills
 * ark_decode_args from the tensors; decode.py holds the same arithmetic in torch.
 *
 * The score tiles of groups above 4 query heads and the weighted-sum tiles of groups above 2 run
 * with AVX-512 where the CPU has it, and so do the exponential phases B, C and E's softmax for
 * every group (decode_simd.h: the same bits as the AVX2 code). With a bf16 cache and query on a
 * CPU with AMX-BF16, stage 2 (phase E) runs on AMX tiles instead (decode_amx.h: not the same
 * bits, within one bf16 step). The kernels that newly completed keys add to the compressed state
 * are computed here too (ark_kernel_means).
 *
 * Shapes: B batch, H KV heads, G query heads per KV head (any G >= 1), D head_dim (a multiple of
 * 16); "head" bh = b * H + h below, its query heads are h * G + g. Caches are fp32, bf16 or fp16
 * (read 16-bit, widened to fp32 in registers / L1, accumulated in fp32); stage 1 is fp32 (§9).
 * Phases, each split over the threads with a barrier after it:
 *   0. per head, q' = fp32(q) * scale twice: transposed, qT[d][g] (g padded to Gp, a multiple of
 *      8, with zeros) for the head tiles, and row-major, qR[g][d], for groups of <= 4 heads
 *   A. fine logits L[bh][g][j] = q.Kc1[j], chunks of 512 kernels (compressed keys read in place)
 *   B. per (bh, g): coarse logits C[c] = mean of the fine logits 4c + m * step (m < 4, step =
 *      kernel_size / kernel_stride), in decode.py's order, or q.Kc2[c] when coarse_step = 0;
 *      lse = logsumexp(C) as torch computes it (shift 0 when the max is infinite)
 *   C. s[bh][j] = sum over g of nan->0(exp(L - lse)), zeroing NaN per head before the sum (§9)
 *   D. per head: max-pool kernels -> candidate blocks, exact top-k on int64 keys (fp32 bits << 24
 *      | (2^24 - 1 - block): by score, then the lower block), the idx row
 *   E. stage 2 per (bh, chunk of 512 selected rows): scores, chunk softmax (max m, sum l),
 *      acc = p @ V; the rows are the far blocks of idx, then keys first_window_block * bs .. end.
 *      K, then V, then the next chunk's K are one stream of rows, each requested PF_AHEAD rows
 *      before it is read, its lines spread over the tile that computes the rows before it
 *      (ark_pf; stage 1's compressed keys likewise, SCAN_AHEAD ahead)
 *   F. per (bh, g): out = sum acc * e^(m - M) / sum l * e^(m - M), M the chunks' max
 */
#include <float.h>
#include <math.h>

#include "decode_simd.h"
#include "decode_amx.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define CHUNK_KERNELS 512   /* compressed keys per stage-1 task */
#define CHUNK_ROWS 512      /* selected KV rows per stage-2 task */
#define RUN_ROWS 32         /* rows widened / scored at once (fp32 buffer: 32 * D floats, L1) */
#define PF_AHEAD 32         /* KV rows requested ahead of the one read (16 KiB of fp32 K) */
#define SCAN_AHEAD 32       /* compressed keys requested ahead of the one scored (16 KiB) */
#define MAX_ROW_LINES 32    /* cache lines per row the prefetch lists hold (D * element <= 2 KiB) */
#define PF_LINES (PF_AHEAD * MAX_ROW_LINES)
#define BLOCK_BITS 24
#define BLOCK_MASK ((1LL << BLOCK_BITS) - 1)

typedef struct {
    int64_t batch, kv_heads, group, head_dim;
    const void *q_sel; int64_t q_sel_dtype, q_sel_sb, q_sel_sh;  /* stage-1 query [B, Hq, 1, D] */
    const void *q; int64_t q_dtype, q_sb, q_sh;                  /* stage-2 query, same shape */
    double scale;
    const float *fine; int64_t fine_sb, fine_sh, fine_sr, n1;      /* [B, H, n1, D] fp32 */
    const float *coarse; int64_t coarse_sb, coarse_sh, coarse_sr, n2;
    const void *k; const void *v; int64_t kv_dtype, k_sb, k_sh, k_sr, v_sb, v_sh, v_sr;
    int64_t cache_len, block_size, init_blocks, local_blocks, topk, kernels_per_block;
    int64_t coarse_factor, coarse_step;
    int64_t *idx;                  /* out: [BH, topk + local_blocks] */
    void *out; int64_t out_dtype;  /* out: [B, Hq, 1, D] contiguous, or NULL (stage 1 only) */
    float *work; int64_t work_floats;
    int64_t threads;
} ark_decode_args;

typedef struct {
    const ark_decode_args *a;
    int64_t BH, G, Gp, GP, QH, D, budget, nfar, first, end, rows, chunks1, chunks2, tasks2, esz;
    int64_t scratch_floats, part_floats;
    int amx;           /* stage 2 on AMX tiles (decode_amx.h): bf16 cache and query, D % 32 == 0 */
    float *qT1, *qT2, *logits, *clog, *lse, *s, *scratch, *part;
    int64_t next[4];   /* task counters of phases A, C, E, F (threads take tasks dynamically) */
} ctx_t;

static int64_t up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static int64_t cdiv(int64_t x, int64_t m) { return (x + m - 1) / m; }

/* Carve the workspace; returns the floats it needs (work may be NULL: size only). */
static int64_t layout(ctx_t *c, const ark_decode_args *a, float *work) {
    c->a = a;
    c->BH = a->batch * a->kv_heads;
    c->G = a->group, c->Gp = up(a->group, 8), c->D = a->head_dim;
    c->GP = a->group <= 2 ? a->group : up(a->group, 4);     /* heads the weighted sum computes */
    c->QH = c->D * c->Gp + c->G * c->D;                     /* qT then qR, per head */
    c->budget = a->topk + a->local_blocks;
    c->nfar = a->topk - 1;
    c->first = a->cache_len / a->block_size - a->local_blocks;
    c->end = a->cache_len + 1;
    c->rows = c->nfar * a->block_size + c->end - c->first * a->block_size;
    c->chunks1 = cdiv(a->n1, CHUNK_KERNELS);
    c->chunks2 = a->coarse_step ? 0 : cdiv(a->n2, CHUNK_KERNELS);
    c->tasks2 = a->out ? cdiv(c->rows, CHUNK_ROWS) : 0;
    c->esz = a->kv_dtype == ARK_F32 ? 4 : 2;
    c->scratch_floats = a->out ? c->GP * CHUNK_ROWS + RUN_ROWS * c->D + c->GP * c->D : 0;
    if (c->amx) c->scratch_floats = c->GP * CHUNK_ROWS + amx_scratch_floats(c->G, c->D);
    c->part_floats = 2 * c->G + c->G * c->D;
    const int same_q = a->q == a->q_sel && a->q_dtype == a->q_sel_dtype && a->q_sb == a->q_sel_sb
                       && a->q_sh == a->q_sel_sh;
    const int64_t q_floats = c->BH * c->QH;
    int64_t sizes[8] = {q_floats, a->out && !same_q ? q_floats : 0, c->BH * c->G * a->n1,
                        c->BH * c->G * a->n2, c->BH * c->G, c->BH * a->n1,
                        (a->threads < 1 ? 1 : a->threads) * c->scratch_floats,
                        c->BH * c->tasks2 * c->part_floats};
    float **slots[8] = {&c->qT1, &c->qT2, &c->logits, &c->clog, &c->lse, &c->s, &c->scratch,
                        &c->part};
    int64_t total = 0;
    for (int i = 0; i < 8; i++) {
        *slots[i] = work ? work + total : 0;
        total += up(sizes[i], 16);   /* 64-byte aligned regions */
    }
    if (same_q || !a->out) c->qT2 = c->qT1;
    return total;
}

/* -- phase 0 ----------------------------------------------------------------------------------- */
static void transpose_query(const ctx_t *c, const void *q, int64_t dtype, int64_t sb, int64_t sh,
                            int64_t bh, float *qT) {
    const int64_t b = bh / c->a->kv_heads, h = bh % c->a->kv_heads, D = c->D, Gp = c->Gp;
    const float scale = (float)c->a->scale;
    float *o = qT + bh * c->QH, *row_major = o + D * Gp;
    memset(o, 0, sizeof(float) * D * Gp);
    for (int64_t g = 0; g < c->G; g++) {
        const int64_t base = b * sb + (h * c->G + g) * sh;
        for (int64_t d = 0; d < D; d++) {
            const float x = ark_to_f32(q, base + d, (int)dtype) * scale;
            o[d * Gp + g] = row_major[g * D + d] = x;
        }
    }
}

/* -- phase A: logits against compressed keys --------------------------------------------------- */
static void score_compressed(const ctx_t *c, int64_t task) {
    const ark_decode_args *a = c->a;
    const int64_t per_head = c->chunks1 + c->chunks2, bh = task / per_head;
    int64_t chunk = task % per_head;
    const int64_t b = bh / a->kv_heads, h = bh % a->kv_heads;
    const float *keys = a->fine + b * a->fine_sb + h * a->fine_sh;
    int64_t n = a->n1, ld = a->fine_sr;
    float *out = c->logits + bh * c->G * a->n1;
    if (chunk >= c->chunks1) {   /* coarse keys scored directly (kernel_size % stride != 0) */
        chunk -= c->chunks1;
        keys = a->coarse + b * a->coarse_sb + h * a->coarse_sh;
        n = a->n2, ld = a->coarse_sr;
        out = c->clog + bh * c->G * a->n2;
    }
    const int64_t lo = chunk * CHUNK_KERNELS, len = n - lo < CHUNK_KERNELS ? n - lo : CHUNK_KERNELS;
    const float *qT = c->qT1 + bh * c->QH;
    /* The keys are contiguous, but the hardware prefetcher restarts at every 4 KiB page: rows
     * requested SCAN_AHEAD ahead (into L2 now, see ark_pf; with KV in L3 L1 measured 1-6 %
     * better, with KV evicted L2 is 3-6 % better for the whole step) made the whole step 9-13 %
     * faster with the cache in L3 (128K, one thread: group 2 1.59 -> 1.44 ms, group 16 4.08 ->
     * 3.55 ms), 5 % at 32K, ~1 % from DRAM. The tiles issue the requests a few at a time
     * (ark_pf): group 16 at 128K from DRAM 12 % faster than requesting a run's rows at once. */
    const char *lines[PF_LINES];
    ark_pf pf = {lines, 0, 0};
    for (int64_t t = 0; t < len; t += SCAN_AHEAD) {
        const int64_t m = len - t < SCAN_AHEAD ? len - t : SCAN_AHEAD;
        const int64_t pf_end = lo + t + m + SCAN_AHEAD < n ? lo + t + m + SCAN_AHEAD : n;
        pf.n = pf.i = 0;
        for (int64_t r = lo + t + SCAN_AHEAD; r < pf_end; r++)
            for (int64_t j = 0; j < c->D * 4; j += 64) lines[pf.n++] = (const char *)(keys + r * ld) + j;
        scores_tiles(qT, qT + c->D * c->Gp, c->G, c->D, keys + (lo + t) * ld, ld, m, out + lo + t,
                     n, &pf);
        ark_pf_rest(&pf);
    }
}

/* -- phases B and E: maximum and exponential sum of a row ------------------------------------ */
/* max of x[0..n), NaN skipped (-inf when n == 0). */
static float max_of(const float *x, int64_t n) {
    if (use_zmm()) return max_zmm(x, n);
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(_mm256_loadu_ps(x + i), vm);
    float m = hmax256(vm);
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* Sum of exp(x[t] - shift) for t < n, as an 8-lane running sum then hsum256 (exp_sum_zmm adds in
 * the same order); out (x itself, or NULL) receives the exponentials. */
static float exp_sum(const float *x, int64_t n, float shift, float *out) {
    if (use_zmm()) return exp_sum_zmm(x, n, shift, out);
    const __m256 vs = _mm256_set1_ps(shift);
    __m256 sum = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
        if (out) _mm256_storeu_ps(out + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (i < n) {
        const __m256 e = exp256(_mm256_sub_ps(load_part(x + i, n - i, -INFINITY), vs));
        if (out) _mm256_maskstore_ps(out + i, lane_mask(n - i), e);
        sum = _mm256_add_ps(sum, e);
    }
    return hsum256(sum);
}

static float logsumexp(const float *x, int64_t n) {
    if (n == 0) return -INFINITY;
    /* A NaN was skipped by the max; it reaches the sum below, so the result is NaN as torch's. */
    const float m = max_of(x, n), shift = isinf(m) ? 0.0f : m;    /* torch.logsumexp's guard */
    return logf(exp_sum(x, n, shift, 0)) + shift;
}

static void coarse_lse(const ctx_t *c, int64_t pair) {
    const ark_decode_args *a = c->a;
    const int64_t n2 = a->n2, step = a->coarse_step, f = a->coarse_factor;
    float *cl = c->clog + pair * n2;
    if (step) {
        const float *L = c->logits + pair * a->n1, inv = 1.0f / (float)f;
        const int64_t done = use_zmm() ? coarse_means_zmm(L, a->n1, f, step, inv, cl, n2) : 0;
        for (int64_t j = done; j < n2; j++) {
            float sum = L[f * j];
            for (int64_t m = 1; m < f; m++) sum += L[f * j + m * step];
            cl[j] = sum * inv;
        }
    }
    c->lse[pair] = logsumexp(cl, n2);
}

/* -- phase C: group sum of the fine probabilities ---------------------------------------------- */
static void group_sum(const ctx_t *c, int64_t task, int64_t n_needed) {
    const int64_t bh = task / c->chunks1, lo = (task % c->chunks1) * CHUNK_KERNELS;
    const int64_t n1 = c->a->n1;
    const int64_t hi = lo + CHUNK_KERNELS < n_needed ? lo + CHUNK_KERNELS : n_needed;
    const float *L = c->logits + bh * c->G * n1, *lse = c->lse + bh * c->G;
    float *s = c->s + bh * n1;
    if (use_zmm()) {
        group_exp_sum_zmm(L + lo, n1, lse, c->G, hi - lo, s + lo);
        return;
    }
    for (int64_t j = lo; j < hi; j += 8) {
        const int64_t n = hi - j < 8 ? hi - j : 8;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t g = 0; g < c->G; g++) {
            const __m256 x = n == 8 ? _mm256_loadu_ps(L + g * n1 + j) : load_part(L + g * n1 + j, n, 0.0f);
            const __m256 p = exp256(_mm256_sub_ps(x, _mm256_set1_ps(lse[g])));
            acc = _mm256_add_ps(acc, _mm256_and_ps(p, _mm256_cmp_ps(p, p, _CMP_ORD_Q)));
        }
        if (n == 8) _mm256_storeu_ps(s + j, acc);
        else _mm256_maskstore_ps(s + j, lane_mask(n), acc);
    }
}

/* -- phase D: top-k ---------------------------------------------------------------------------- */
static void heap_down(int64_t *h, int64_t n, int64_t i) {   /* min-heap */
    for (;;) {
        int64_t l = 2 * i + 1, m = i;
        if (l < n && h[l] < h[m]) m = l;
        if (l + 1 < n && h[l + 1] < h[m]) m = l + 1;
        if (m == i) return;
        const int64_t t = h[i]; h[i] = h[m]; h[m] = t;
        i = m;
    }
}

static void select_row(const ctx_t *c, int64_t bh, int64_t n_needed) {
    const ark_decode_args *a = c->a;
    const int64_t r = a->kernels_per_block, init = a->init_blocks, n_free = a->topk - init - 1;
    const float *s = c->s + bh * a->n1;
    int64_t *row = a->idx + bh * c->budget, *heap = row + init, filled = 0;
    for (int64_t blk = init; blk < c->first; blk++) {
        float best = 0.0f;   /* kernels past n1 count as 0, and every score is >= 0 */
        for (int64_t j = r * blk - 1; j < r * blk + r; j++)
            if (j >= 0 && j < n_needed && s[j] > best) best = s[j];
        best = best > FLT_MAX ? FLT_MAX : best;
        uint32_t bits;
        memcpy(&bits, &best, 4);
        const int64_t key = ((int64_t)bits << BLOCK_BITS) | (BLOCK_MASK - blk);
        if (filled < n_free) {
            heap[filled++] = key;
            if (filled == n_free)
                for (int64_t i = n_free / 2 - 1; i >= 0; i--) heap_down(heap, n_free, i);
        } else if (key > heap[0]) {
            heap[0] = key;
            heap_down(heap, n_free, 0);
        }
    }
    for (int64_t i = 0; i < n_free; i++) heap[i] = BLOCK_MASK - (heap[i] & BLOCK_MASK);
    for (int64_t i = 1; i < n_free; i++) {       /* ascending (insertion sort: n_free ~ 63) */
        const int64_t x = heap[i];
        int64_t j = i - 1;
        for (; j >= 0 && heap[j] > x; j--) heap[j + 1] = heap[j];
        heap[j + 1] = x;
    }
    for (int64_t i = 0; i < init; i++) row[i] = i;
    for (int64_t i = 0; i <= a->local_blocks; i++) row[init + n_free + i] = c->first + i;
}

/* -- phase E: attention over one chunk of the selected rows ------------------------------------ */
/* The contiguous run of cache rows at position `off` of head bh's row sequence: returns its first
 * cache row, *len = its length (at most RUN_ROWS and hi - off). */
static int64_t locate(const ctx_t *c, const int64_t *far, int64_t off, int64_t hi, int64_t *len) {
    const int64_t bs = c->a->block_size, far_rows = c->nfar * bs;
    int64_t row, n;
    if (off < far_rows) row = far[off / bs] * bs + off % bs, n = bs - off % bs;
    else row = c->first * bs + off - far_rows, n = c->rows - off;
    n = n < hi - off ? n : hi - off;
    *len = n < RUN_ROWS ? n : RUN_ROWS;
    return row;
}

/* fp32 rows [n, D] of `base` from cache row `row` on: in place, or widened into buf. */
static const float *run_rows(const ctx_t *c, const void *base, int64_t ld, int64_t row, int64_t n,
                             float *buf, int64_t *ld_out) {
    if (c->a->kv_dtype == ARK_F32) {
        *ld_out = ld;
        return (const float *)base + row * ld;
    }
    if (use_zmm()) widen_rows_zmm((const uint16_t *)base + row * ld, ld, n, c->D, (int)c->a->kv_dtype, buf);
    else widen_rows((const uint16_t *)base + row * ld, ld, n, c->D, (int)c->a->kv_dtype, buf);
    *ld_out = c->D;
    return buf;
}

/* Append to q the cache lines of the rows at positions [from, to) of the row sequence of `base`. */
static void list_rows(const ctx_t *c, const int64_t *far, const char *base, int64_t ld_bytes,
                      int64_t from, int64_t to, ark_pf *q) {
    const int64_t bytes = c->D * c->esz;
    for (int64_t len; from < to; from += len) {
        const char *r = base + locate(c, far, from, to, &len) * ld_bytes;
        for (const char *end = r + len * ld_bytes; r < end; r += ld_bytes)
            for (int64_t j = 0; j < bytes; j += 64) q->line[q->n++] = r + j;
    }
}

/* A chunk reads, in order, its K rows, its V rows, then (usually on the same thread) the next
 * chunk's K rows: positions [0, n), [n, 2n), [2n, ...) of one stream. list_stream makes q the
 * lines of the stream's positions [from, to) (past the last row: nothing), at most PF_AHEAD
 * rows. */
static void list_stream(const ctx_t *c, const int64_t *far, const char *kb, const char *vb,
                        int64_t lo, int64_t hi, int64_t from, int64_t to, ark_pf *q) {
    const int64_t n = hi - lo, kld = c->a->k_sr * c->esz, vld = c->a->v_sr * c->esz;
    q->n = q->i = 0;
    if (from < n) list_rows(c, far, kb, kld, lo + from, lo + (to < n ? to : n), q);
    if (to > n && from < 2 * n)
        list_rows(c, far, vb, vld, lo + (from > n ? from - n : 0), lo + (to < 2 * n ? to - n : n),
                  q);
    if (to > 2 * n) {
        const int64_t end = hi + to - 2 * n < c->rows ? hi + to - 2 * n : c->rows;
        list_rows(c, far, kb, kld, hi + (from > 2 * n ? from - 2 * n : 0), end, q);
    }
}

/* Softmax numerators of a chunk's scores, in place: for each head g < G of sc [rows][CHUNK_ROWS]
 * (n columns), m[g] = the max, p = exp(s - m), l[g] = sum p; rows G..rows hold zeros after. */
static void chunk_softmax(float *sc, int64_t n, int64_t G, int64_t rows, float *m, float *l) {
    for (int64_t g = 0; g < rows; g++) {
        float *p = sc + g * CHUNK_ROWS;
        if (g >= G) { memset(p, 0, sizeof(float) * n); continue; }
        const float mx = max_of(p, n);
        m[g] = mx;
        if (mx == -INFINITY) {    /* every key of the chunk at -inf: it weighs nothing */
            memset(p, 0, sizeof(float) * n);
            l[g] = 0.0f;
            continue;
        }
        l[g] = exp_sum(p, n, mx, p);
    }
}

static void attend_chunk(const ctx_t *c, int64_t task, float *scratch) {
    const ark_decode_args *a = c->a;
    const int64_t bh = task / c->tasks2, b = bh / a->kv_heads, h = bh % a->kv_heads;
    const int64_t lo = (task % c->tasks2) * CHUNK_ROWS;
    const int64_t hi = lo + CHUNK_ROWS < c->rows ? lo + CHUNK_ROWS : c->rows, n = hi - lo;
    const int64_t G = c->G, D = c->D;
    const int64_t *far = a->idx + bh * c->budget;
    const char *kb = (const char *)a->k + (b * a->k_sb + h * a->k_sh) * c->esz;
    const char *vb = (const char *)a->v + (b * a->v_sb + h * a->v_sh) * c->esz;
    float *sc = scratch, *buf = sc + c->GP * CHUNK_ROWS, *acc = buf + RUN_ROWS * D;
    const float *qT = c->qT2 + bh * c->QH;
    /* Each run's rows are requested PF_AHEAD rows before they are read (pf: the stream position
     * requested so far): the hardware prefetcher stops at the 4 KiB pages of a block jump.
     * Before, a run's V rows were requested during the K pass, 512 rows before the weighted sum
     * read them: 256 KiB of fp32 V parked in L2 per chunk and thread, the whole L2 of a core
     * whose two SMT threads both do that. Now ~16 KiB per thread is in flight. Same speed on a
     * 2 MiB-L2 Xeon (one thread, 32K, group 2: within 2 %), no dependence on L2 size. The
     * lines of the next run are issued by the tiles of this one, a few per multiply-add step. */
    const char *lines[PF_LINES];
    ark_pf q = {lines, 0, 0};
    int64_t len, ld, pf = PF_AHEAD;
    list_stream(c, far, kb, vb, lo, hi, 0, PF_AHEAD, &q);   /* the first rows: at once */
    ark_pf_rest(&q);
    for (int64_t off = lo; off < hi; off += len) {
        const int64_t row = locate(c, far, off, hi, &len), to = off - lo + len + PF_AHEAD;
        if (pf < to) list_stream(c, far, kb, vb, lo, hi, pf, to, &q), pf = to;
        const float *rows = run_rows(c, kb, a->k_sr, row, len, buf, &ld);
        scores_tiles(qT, qT + D * c->Gp, G, D, rows, ld, len, sc + off - lo, CHUNK_ROWS, &q);
        ark_pf_rest(&q);
    }
    float *m = c->part + task * c->part_floats, *l = m + G, *out = l + G;
    chunk_softmax(sc, n, G, c->GP, m, l);
    memset(acc, 0, sizeof(float) * c->GP * D);
    for (int64_t off = lo; off < hi; off += len) {
        const int64_t row = locate(c, far, off, hi, &len), to = n + off - lo + len + PF_AHEAD;
        if (pf < to) list_stream(c, far, kb, vb, lo, hi, pf, to, &q), pf = to;
        const float *rows = run_rows(c, vb, a->v_sr, row, len, buf, &ld);
        pv_tiles(sc + off - lo, CHUNK_ROWS, c->GP, rows, ld, D, len, acc, &q);
        ark_pf_rest(&q);
    }
    memcpy(out, acc, sizeof(float) * G * D);
}

#if ARK_HAS_AMX
/* attend_chunk on AMX tiles (decode_amx.h): the same rows, prefetch stream, chunk softmax and
 * partial results; the scores and the weighted sum are bf16 tile products. */
static void attend_chunk_amx(const ctx_t *c, int64_t task, float *scratch) {
    const ark_decode_args *a = c->a;
    const int64_t bh = task / c->tasks2, b = bh / a->kv_heads, h = bh % a->kv_heads;
    const int64_t lo = (task % c->tasks2) * CHUNK_ROWS;
    const int64_t hi = lo + CHUNK_ROWS < c->rows ? lo + CHUNK_ROWS : c->rows, n = hi - lo;
    const int64_t G = c->G, D = c->D, Gt = G < 16 ? G : 16, tiles = (G + 15) / 16;
    const int64_t *far = a->idx + bh * c->budget;
    const char *kb = (const char *)a->k + (b * a->k_sb + h * a->k_sh) * 2;
    const char *vb = (const char *)a->v + (b * a->v_sb + h * a->v_sh) * 2;
    const float scale = (float)a->scale;
    float *sc = scratch, *acc = sc + c->GP * CHUNK_ROWS, *sT = acc + tiles * 16 * D;
    uint16_t *ktail = (uint16_t *)(sT + 256), *vB = ktail + 16 * D, *pH = vB + 32 * D;
    uint16_t *pL = pH + 512, *qB = pL + 512;
    amx_configure(Gt);
    amx_pack_queries((const uint16_t *)a->q + b * a->q_sb + h * G * a->q_sh, a->q_sh, G, Gt, D,
                     qB);
    const char *lines[PF_LINES];
    ark_pf q = {lines, 0, 0};
    int64_t len, pf = PF_AHEAD;
    list_stream(c, far, kb, vb, lo, hi, 0, PF_AHEAD, &q);
    ark_pf_rest(&q);
    for (int64_t off = lo; off < hi; off += len) {
        const int64_t row = locate(c, far, off, hi, &len), to = off - lo + len + PF_AHEAD;
        if (pf < to) list_stream(c, far, kb, vb, lo, hi, pf, to, &q), pf = to;
        for (int64_t r0 = 0; r0 < len; r0 += ARK_AMX_ROWS) {
            const int64_t m = len - r0 < ARK_AMX_ROWS ? len - r0 : ARK_AMX_ROWS;
            const uint16_t *k = (const uint16_t *)kb + (row + r0) * a->k_sr;
            int64_t ld = a->k_sr;
            if (m < ARK_AMX_ROWS) {    /* a short tail: zero-padded to a whole tile */
                memset(ktail, 0, sizeof(uint16_t) * 16 * D);
                for (int64_t r = 0; r < m; r++) memcpy(ktail + r * D, k + r * ld, 2 * D);
                k = ktail, ld = D;
            }
            for (int64_t qt = 0; qt < tiles; qt++) {
                amx_scores16(k, ld, qB + qt * D * Gt, Gt, D, sT);
                const int64_t heads = G - qt * 16 < 16 ? G - qt * 16 : 16;
                amx_store_scores(sT, scale, heads, m, sc + qt * 16 * CHUNK_ROWS + off - lo + r0,
                                 CHUNK_ROWS, &q);
            }
        }
        ark_pf_rest(&q);
    }
    float *mx = c->part + task * c->part_floats, *l = mx + G, *out = l + G;
    chunk_softmax(sc, n, G, G, mx, l);
    memset(acc, 0, sizeof(float) * tiles * 16 * D);
    for (int64_t off = lo; off < hi; off += len) {
        const int64_t row = locate(c, far, off, hi, &len), to = n + off - lo + len + PF_AHEAD;
        if (pf < to) list_stream(c, far, kb, vb, lo, hi, pf, to, &q), pf = to;
        amx_pack_rows((const uint16_t *)vb + row * a->v_sr, a->v_sr, len, D, vB, &q);
        for (int64_t qt = 0; qt < tiles; qt++) {
            const int64_t heads = G - qt * 16 < 16 ? G - qt * 16 : 16;
            amx_split_weights(sc + qt * 16 * CHUNK_ROWS + off - lo, CHUNK_ROWS, heads, Gt, len,
                              pH, pL, &q);
            amx_weighted_sum(pH, pL, vB, D, acc + qt * 16 * D, &q);
        }
        ark_pf_rest(&q);
    }
    amx_release();
    memcpy(out, acc, sizeof(float) * G * D);
}
#endif

static void attend(const ctx_t *c, int64_t task, float *scratch) {
#if ARK_HAS_AMX
    if (c->amx) {
        attend_chunk_amx(c, task, scratch);
        return;
    }
#endif
    attend_chunk(c, task, scratch);
}

/* -- phase F: merge the chunks of one (bh, g) -------------------------------------------------- */
static void combine(const ctx_t *c, int64_t pair) {
    const ark_decode_args *a = c->a;
    const int64_t bh = pair / c->G, g = pair % c->G, D = c->D, G = c->G;
    float mx = -INFINITY, total = 0.0f, w[CHUNK_ROWS];   /* tasks2 <= rows / 512 + 1 */
    const float *part = c->part + bh * c->tasks2 * c->part_floats;
    for (int64_t t = 0; t < c->tasks2; t++) {
        const float m = part[t * c->part_floats + g];
        mx = m > mx || isnan(m) ? m : mx;
    }
    for (int64_t t = 0; t < c->tasks2; t++) {
        const float *p = part + t * c->part_floats;
        w[t] = p[G + g] == 0.0f ? 0.0f : expf(p[g] - mx);   /* empty chunks add nothing */
        total += w[t] * p[G + g];
    }
    const int64_t b = bh / a->kv_heads, head = (bh % a->kv_heads) * G + g;
    const int64_t o = (b * a->kv_heads * G + head) * D;
    float sum[MAX_ROW_LINES * 16];   /* D <= 512: per column, the chunks added in order */
    memset(sum, 0, sizeof(float) * D);
    for (int64_t t = 0; t < c->tasks2; t++) {
        if (w[t] == 0.0f) continue;
        const float *acc = part + t * c->part_floats + 2 * G + g * D;
        for (int64_t j = 0; j < D; j++) sum[j] += w[t] * acc[j];
    }
    for (int64_t j = 0; j < D; j++) ark_from_f32(a->out, o + j, (int)a->out_dtype, sum[j] / total);
}

/* -- the step --------------------------------------------------------------------------------- */
#ifdef _OPENMP
#define BARRIER _Pragma("omp barrier")
#else
#define BARRIER
#endif

static int64_t take(int64_t *counter) { return __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED); }

/* Every phase of one head, in order, on the calling thread. */
static void run_head(ctx_t *c, int64_t bh, float *scratch, int64_t n_needed) {
    const ark_decode_args *a = c->a;
    transpose_query(c, a->q_sel, a->q_sel_dtype, a->q_sel_sb, a->q_sel_sh, bh, c->qT1);
    if (c->qT2 != c->qT1) transpose_query(c, a->q, a->q_dtype, a->q_sb, a->q_sh, bh, c->qT2);
    const int64_t per_head = c->chunks1 + c->chunks2;
    for (int64_t t = 0; t < per_head; t++) score_compressed(c, bh * per_head + t);
    for (int64_t g = 0; g < c->G; g++) coarse_lse(c, bh * c->G + g);
    for (int64_t t = 0; t < c->chunks1; t++) group_sum(c, bh * c->chunks1 + t, n_needed);
    select_row(c, bh, n_needed);
    if (!a->out) return;
    for (int64_t t = 0; t < c->tasks2; t++) attend(c, bh * c->tasks2 + t, scratch);
    for (int64_t g = 0; g < c->G; g++) combine(c, bh * c->G + g);
}

/* With as many heads as threads (or a multiple), each thread runs whole heads, taking the next
 * unclaimed one: no barrier but the region's end, and a thread that other processes keep off a
 * core for a while leaves its head to the others instead of stalling the step. Otherwise every
 * phase is split over all threads, a barrier after each. */
static void run_phases(ctx_t *c, int tid, int nt) {
    const ark_decode_args *a = c->a;
    const int64_t n_needed = a->n1 < a->kernels_per_block * c->first ? a->n1
                             : a->kernels_per_block * c->first;
    float *scratch = c->scratch + tid * c->scratch_floats;
    if (c->BH % nt == 0) {
        for (int64_t bh; (bh = take(&c->next[0])) < c->BH;) run_head(c, bh, scratch, n_needed);
        return;
    }
    for (int64_t i = tid; i < c->BH; i += nt) {
        transpose_query(c, a->q_sel, a->q_sel_dtype, a->q_sel_sb, a->q_sel_sh, i, c->qT1);
        if (c->qT2 != c->qT1) transpose_query(c, a->q, a->q_dtype, a->q_sb, a->q_sh, i, c->qT2);
    }
    BARRIER
    for (int64_t t; (t = take(&c->next[0])) < c->BH * (c->chunks1 + c->chunks2);)
        score_compressed(c, t);
    BARRIER
    for (int64_t i = tid; i < c->BH * c->G; i += nt) coarse_lse(c, i);
    BARRIER
    for (int64_t t; (t = take(&c->next[1])) < c->BH * c->chunks1;) group_sum(c, t, n_needed);
    BARRIER
    for (int64_t i = tid; i < c->BH; i += nt) select_row(c, i, n_needed);
    if (!a->out) return;
    BARRIER
    for (int64_t t; (t = take(&c->next[2])) < c->BH * c->tasks2;) attend(c, t, scratch);
    BARRIER
    for (int64_t t; (t = take(&c->next[3])) < c->BH * c->G;) combine(c, t);
}

/* Returns 0; the workspace floats needed (> 0) when work_floats is smaller; or < 0 for arguments
 * the kernel does not take: -1 head_dim / group, -2 dtype, -3 not a sparse step or block ids past
 * 2^24, -4 more selected rows than one combine buffer holds. */
int64_t ark_decode(const ark_decode_args *a) {
    if (a->head_dim % 16 || a->head_dim <= 0 || a->head_dim > 16 * MAX_ROW_LINES || a->group < 1)
        return -1;
    if (a->q_sel_dtype > ARK_F16 || a->q_dtype > ARK_F16 || a->kv_dtype > ARK_F16
        || a->out_dtype > ARK_F16 || a->q_sel_dtype < 0 || a->q_dtype < 0 || a->kv_dtype < 0)
        return -2;
    ctx_t c;
    memset(&c, 0, sizeof c);
    c.amx = a->out && a->kv_dtype == ARK_BF16 && a->q_dtype == ARK_BF16 && a->head_dim % 32 == 0
            && use_amx();
    const int64_t need = layout(&c, a, 0);
    if (c.first < a->topk || a->topk - a->init_blocks - 1 < 0 || c.first > BLOCK_MASK
        || (a->coarse_step && a->n2 && a->coarse_factor * (a->n2 - 1) + (a->coarse_factor - 1)
            * a->coarse_step >= a->n1))
        return -3;
    if (c.tasks2 > CHUNK_ROWS) return -4;
    if (a->work_floats < need || !a->work) return need;
    layout(&c, a, a->work);
    const int nt = a->threads < 1 ? 1 : (int)a->threads;
#ifdef _OPENMP
    if (nt > 1) {
#pragma omp parallel num_threads(nt)
        run_phases(&c, omp_get_thread_num(), omp_get_num_threads());
        return 0;
    }
#endif
    (void)nt;
    run_phases(&c, 0, 1);
    return 0;
}

/* -- key compression (docs/infllmv2.md §2): the kernels a decode step completes ------------- */
typedef struct {
    const void *k; int64_t k_dtype, k_sb, k_sh, k_sr;   /* [B, H, S, D] cache, element strides */
    int64_t batch, heads, head_dim, kernel, stride, first, count;
    float *out; int64_t out_sb, out_sh, out_sr;          /* [B, H, count, D] fp32 */
} ark_means_args;

/* out[b, h, j] = mean(k[b, h, stride * (first + j) + off] for off < kernel), summed offset by
 * offset in fp32 and then multiplied by (float)(1 / kernel): the order and roundings of
 * compress.kernel_means, so a kernel has the same bits whichever of the two computed it. */
int64_t ark_kernel_means(const ark_means_args *a) {
    if (a->head_dim % 8 || a->k_dtype < 0 || a->k_dtype > ARK_F16) return -1;
    const float inv = (float)(1.0 / (double)a->kernel);
    const int64_t D = a->head_dim;
    for (int64_t b = 0; b < a->batch; b++)
        for (int64_t h = 0; h < a->heads; h++)
            for (int64_t j = 0; j < a->count; j++) {
                const int64_t row = a->stride * (a->first + j), base = b * a->k_sb + h * a->k_sh;
                float *o = a->out + b * a->out_sb + h * a->out_sh + j * a->out_sr;
                float acc[8];
                for (int64_t d0 = 0; d0 < D; d0 += 8) {
                    for (int i = 0; i < 8; i++)
                        acc[i] = ark_to_f32(a->k, base + row * a->k_sr + d0 + i, (int)a->k_dtype);
                    for (int64_t off = 1; off < a->kernel; off++)
                        for (int i = 0; i < 8; i++)
                            acc[i] += ark_to_f32(a->k, base + (row + off) * a->k_sr + d0 + i,
                                                 (int)a->k_dtype);
                    for (int i = 0; i < 8; i++) o[d0 + i] = acc[i] * inv;
                }
            }
    return 0;
}

/* The AVX-512 tiles: on = 1 (where the CPU has AVX-512F and VL) or 0 (AVX2 only), -1 just asks;
 * returns whether they run now. Both give the same bits (tests/ops/test_infllmv2_native.py). */
int64_t ark_set_zmm(int64_t on) {
    if (on >= 0) {
        ark_zmm = -1;                /* use_zmm() detects the CPU again */
        ark_zmm = on && use_zmm();
    }
    return use_zmm();
}

/* The AMX tiles of stage 2 (bf16 cache and query): on = 1 (where the CPU and the OS allow them)
 * or 0, -1 just asks; returns whether they run now. */
int64_t ark_set_amx(int64_t on) {
#if ARK_HAS_AMX
    if (on >= 0) {
        ark_amx = -1;
        ark_amx = on && use_amx();
    }
#endif
    return use_amx();
}

/* 1 when built with OpenMP (threads > 1 take effect), else 0. */
int64_t ark_decode_threaded(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
