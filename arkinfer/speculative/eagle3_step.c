/* One EAGLE-3 head step for one token, float32, in C: what `Eagle3Head.forward` computes for
 * T = 1 (arkinfer/speculative/eagle3_head.py), without PyTorch's per-operator overhead — a step
 * of the demo's head is ~0.6 ms through PyTorch and a few microseconds here.
 *
 *   z      = cat(rmsnorm(embed, input_layernorm), rmsnorm(hidden, hidden_norm))      [2H]
 *   q,k,v  = Wq z, Wk z, Wv z; RoPE (rotate-half) on q and k at `position`
 *   k, v   written into the cache at row `length` (k_buf, v_buf: [nkv, capacity, hd])
 *   attn   = softmax(q k^T / sqrt(hd)) v over rows 0..length, query head h reads KV head
 *            h / (nh / nkv)
 *   h1     = hidden + Wo attn;   h2 = h1 + down(silu(gate m) * up m), m = rmsnorm(h1, post)
 *   logits = lm_head rmsnorm(h2, norm)                                                 [Vd]
 *
 * Returns the argmax of the logits (the first maximum); hidden_out gets h2. `scratch` holds
 * 2H + 2 nh hd + (length + 1) + 2I floats. */
#include <math.h>
#include <stdint.h>

typedef struct {
    int32_t hidden, heads, kv_heads, head_dim, inter, vocab;
    float eps;
    int32_t pad;
    const float *input_norm, *hidden_norm, *wq, *wk, *wv, *wo, *post_norm, *gate, *up, *down,
        *norm, *lm_head, *inv_freq;
} head_weights;

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

static float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void matvec(float *out, const float *w, const float *x, int rows, int cols) {
    for (int r = 0; r < rows; r++) out[r] = dot(w + (int64_t)r * cols, x, cols);
}

static void rope(float *x, int64_t position, const float *inv_freq, int hd) {
    int half = hd / 2;
    for (int j = 0; j < half; j++) {
        float angle = (float)position * inv_freq[j];
        float c = cosf(angle), s = sinf(angle);
        float x1 = x[j], x2 = x[j + half];
        x[j] = x1 * c - x2 * s;
        x[j + half] = x2 * c + x1 * s;
    }
}

int64_t eagle3_step(const head_weights *w, const float *embed, const float *hidden,
                    int64_t position, float *k_buf, float *v_buf, int64_t capacity,
                    int64_t length, float *hidden_out, float *logits, float *scratch) {
    const int H = w->hidden, nh = w->heads, nkv = w->kv_heads, hd = w->head_dim, I = w->inter;
    float *z = scratch;                 /* 2H */
    float *q = z + 2 * H;               /* nh hd */
    float *attn = q + nh * hd;          /* nh hd */
    float *scores = attn + nh * hd;     /* length + 1 */
    float *g = scores + length + 1;     /* I */
    float *u = g + I;                   /* I */
    float k[1024], v[1024];             /* nkv hd <= 1024, checked by the caller */

    rmsnorm(z, embed, w->input_norm, H, w->eps);
    rmsnorm(z + H, hidden, w->hidden_norm, H, w->eps);
    matvec(q, w->wq, z, nh * hd, 2 * H);
    matvec(k, w->wk, z, nkv * hd, 2 * H);
    matvec(v, w->wv, z, nkv * hd, 2 * H);
    for (int h = 0; h < nh; h++) rope(q + h * hd, position, w->inv_freq, hd);
    for (int h = 0; h < nkv; h++) {
        rope(k + h * hd, position, w->inv_freq, hd);
        float *kr = k_buf + ((int64_t)h * capacity + length) * hd;
        float *vr = v_buf + ((int64_t)h * capacity + length) * hd;
        for (int d = 0; d < hd; d++) { kr[d] = k[h * hd + d]; vr[d] = v[h * hd + d]; }
    }
    const float scale = 1.0f / sqrtf((float)hd);
    const int group = nh / nkv;
    for (int h = 0; h < nh; h++) {
        const float *kh = k_buf + (int64_t)(h / group) * capacity * hd;
        const float *vh = v_buf + (int64_t)(h / group) * capacity * hd;
        float top = -INFINITY, total = 0.0f;
        for (int64_t t = 0; t <= length; t++) {
            scores[t] = dot(q + h * hd, kh + t * hd, hd) * scale;
            if (scores[t] > top) top = scores[t];
        }
        for (int64_t t = 0; t <= length; t++) { scores[t] = expf(scores[t] - top); total += scores[t]; }
        float *out = attn + h * hd;
        for (int d = 0; d < hd; d++) out[d] = 0.0f;
        for (int64_t t = 0; t <= length; t++) {
            float p = scores[t] / total;
            for (int d = 0; d < hd; d++) out[d] += p * vh[t * hd + d];
        }
    }
    matvec(hidden_out, w->wo, attn, H, nh * hd);
    for (int i = 0; i < H; i++) hidden_out[i] += hidden[i];
    rmsnorm(z, hidden_out, w->post_norm, H, w->eps);
    matvec(g, w->gate, z, I, H);
    matvec(u, w->up, z, I, H);
    for (int i = 0; i < I; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    matvec(z + H, w->down, g, H, I);
    for (int i = 0; i < H; i++) hidden_out[i] += z[H + i];
    rmsnorm(z, hidden_out, w->norm, H, w->eps);
    matvec(logits, w->lm_head, z, w->vocab, H);
    int64_t best = 0;
    for (int64_t i = 1; i < w->vocab; i++) if (logits[i] > logits[best]) best = i;
    return best;
}
