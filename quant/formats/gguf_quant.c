/* ggml's reference Q4_0 and Q8_0 block quantisers (quantize_row_q4_0_ref / _q8_0_ref), in C so a
 * build quantises at memory speed; loaded by gguf_blocks.py (_quantize_native) through
 * arkinfer/native_build.py. The arithmetic is ggml's, step by step, in fp32 with no FMA
 * contraction (built with -ffp-contract=off), so the bytes equal ggml's and gguf-py's
 * (tests/quant/test_quant_gguf_blocks.py compares them).
 *
 * Layout of one 32-value block: fp16 scale d (2 bytes, little-endian), then
 *   Q4_0: 16 bytes, byte j = code of value j (low nibble) | code of value j + 16 (high nibble),
 *         code = min(15, (int)(x / d + 8.5)), d = (the value of largest magnitude) / -8
 *   Q8_0: 32 int8 codes roundf(x / d), d = max|x| / 127
 * Both return 0, or -1 (nothing written past the block) at the first non-finite value: the
 * caller then takes ggml's own NaN / inf behaviour from the numpy path. */
#include <math.h>
#include <stdint.h>
#include <immintrin.h>

#define QK 32

static void put_half(uint8_t *out, float d) {
    uint16_t h = _cvtss_sh(d, 0);  /* round to nearest even, as ggml's GGML_FP32_TO_FP16 */
    out[0] = (uint8_t)(h & 0xff);
    out[1] = (uint8_t)(h >> 8);
}

int64_t ark_quantize_q4_0(const float *x, int64_t blocks, uint8_t *out) {
    for (int64_t i = 0; i < blocks; i++, x += QK, out += 2 + QK / 2) {
        float amax = 0.0f, max = 0.0f;
        int bad = 0;
        for (int j = 0; j < QK; j++) {
            bad |= !isfinite(x[j]);
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        }
        if (bad) return -1;
        const float d = max / -8.0f;
        const float id = d ? 1.0f / d : 0.0f;
        put_half(out, d);
        for (int j = 0; j < QK / 2; j++) {
            const float x0 = x[j] * id, x1 = x[QK / 2 + j] * id;
            const int a = (int)(int8_t)(x0 + 8.5f), b = (int)(int8_t)(x1 + 8.5f);
            const uint8_t q0 = (uint8_t)(a < 15 ? a : 15), q1 = (uint8_t)(b < 15 ? b : 15);
            out[2 + j] = q0 | (uint8_t)(q1 << 4);
        }
    }
    return 0;
}

int64_t ark_quantize_q8_0(const float *x, int64_t blocks, uint8_t *out) {
    for (int64_t i = 0; i < blocks; i++, x += QK, out += 2 + QK) {
        float amax = 0.0f;
        int bad = 0;
        for (int j = 0; j < QK; j++) {
            bad |= !isfinite(x[j]);
            amax = fmaxf(amax, fabsf(x[j]));
        }
        if (bad) return -1;
        const float d = amax / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        put_half(out, d);
        for (int j = 0; j < QK; j++) {   /* roundf (half away from zero), exactly, inlined */
            const float v = x[j] * id, a = fabsf(v);   /* a <= 127: casts truncate exactly */
            const int whole = (int)a, r = whole + (int)((a - (float)whole) * 2.0f);
            out[2 + j] = (uint8_t)(int8_t)(v < 0.0f ? -r : r);
        }
    }
    return 0;
}
