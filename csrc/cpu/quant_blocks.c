/* quant_blocks.c — portable kernels of the quantized block formats.
 *
 * Each format is described once, by a decoder that turns one 32-element sub-block into int8
 * quants and float scales (sd_sub32). Dequantization and the dot product with quantized
 * activations are written over that decoder, so a format's layout lives in one function:
 *   dot = sum over sub-blocks of d_x * (d_lo * sum_lo(q * qx) + d_hi * sum_hi(q * qx)) + m * s_x
 * where s_x = d_x * sum(qx) carries the per-block offsets (Q4_1, Q5_1, K-quants). */
#include "cpu/quant_blocks.h"

#include <math.h>
#include <string.h>

/* The f32 value llama.cpp keeps of a scale it stores as f16. */
static float round_f16(float x) {
    return sd_hd_f16_to_f32(sd_hd_f32_to_f16(x));
}

void sd_quantize_q8_ref(int8_t *q, float *d, float *s, float *e, const float *x, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        const float db = amax / 127.0f;
        const float id = db != 0.0f ? 1.0f / db : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            int v = (int)nearbyintf(xb[j] * id); /* ties to even, as llama.cpp's AVX2 path */
            q[32 * b + j] = (int8_t)v;
            sum += v;
        }
        d[b] = round_f16(db);
        s[b] = round_f16(db * (float)sum);
        e[b] = d[b] * (float)sum;
    }
}

/* ---- decoders: blocks.h holds them (shared with the CUDA kernels) --------------------------- */

#define SD_DECODER(sfx)                                                                            \
    void sd_decode_##sfx(sd_sub32 *o, const uint8_t *blk, int sub) {                               \
        sd_blk_decode_##sfx(o, blk, sub);                                                          \
    }
SD_DECODER(q4_0)
SD_DECODER(q4_1)
SD_DECODER(q5_0)
SD_DECODER(q5_1)
SD_DECODER(q8_0)
SD_DECODER(q4_K)
SD_DECODER(q5_K)
SD_DECODER(q6_K)

void sd_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    sd_blk_k4_scale_min(j, q, sc, m);
}

/* ---- kernels over the decoders ------------------------------------------------------------- */

static inline void to_float_generic(sd_decode_fn decode, int block_size, int type_size, float *dst,
                                    const void *src, int64_t n) {
    const uint8_t *blk = (const uint8_t *)src;
    sd_sub32 s;
    for (int64_t b = 0; b < n / block_size; b++, blk += type_size) {
        for (int sub = 0; sub < block_size / 32; sub++) {
            decode(&s, blk, sub);
            float *o = dst + b * block_size + 32 * sub;
            for (int j = 0; j < 32; j++) {
                o[j] = (j < 16 ? s.d_lo : s.d_hi) * (float)s.q[j] + s.m;
            }
        }
    }
}

static inline float dot_q8_generic(sd_decode_fn decode, int block_size, int type_size,
                                   const void *w, sd_q8_row x, int64_t n) {
    const uint8_t *blk = (const uint8_t *)w;
    sd_sub32 s;
    float acc = 0.0f;
    int64_t xb = 0;
    for (int64_t b = 0; b < n / block_size; b++, blk += type_size) {
        for (int sub = 0; sub < block_size / 32; sub++, xb++) {
            decode(&s, blk, sub);
            const int8_t *xq = x.q + 32 * xb;
            int lo = 0, hi = 0;
            for (int j = 0; j < 16; j++) {
                lo += s.q[j] * xq[j];
                hi += s.q[j + 16] * xq[j + 16];
            }
            acc += x.d[xb] * (s.d_lo * (float)lo + s.d_hi * (float)hi) + s.m * x.s[xb];
        }
    }
    return acc;
}

#define SD_DEFINE_QUANT(sfx, block_size, type_size)                                                \
    void sd_to_float_##sfx(float *dst, const void *src, int64_t n) {                               \
        to_float_generic(sd_decode_##sfx, block_size, type_size, dst, src, n);                     \
    }                                                                                              \
    float sd_dot_q8_##sfx(const void *w, sd_q8_row x, int64_t n) {                                 \
        return dot_q8_generic(sd_decode_##sfx, block_size, type_size, w, x, n);                    \
    }                                                                                              \
    void sd_tile_##sfx(float *y, int64_t ldy, const void *w, size_t row_bytes, int64_t nrows,      \
                       const sd_acts *a, int T, int64_t n, const float *bias, int accumulate) {    \
        for (int64_t r = 0; r < nrows; r++) {                                                      \
            const void *row = (const uint8_t *)w + (size_t)r * row_bytes;                          \
            for (int t = 0; t < T; t++) {                                                          \
                float v = sd_dot_q8_##sfx(row, sd_q8_row_at(a->xq, n, t), n);                      \
                v += bias != NULL ? bias[r] : 0.0f;                                                \
                float *dst = &y[(size_t)t * (size_t)ldy + (size_t)r];                              \
                *dst = accumulate ? *dst + v : v;                                                  \
            }                                                                                      \
        }                                                                                          \
    }

SD_DEFINE_QUANT(q4_0, 32, 18)
SD_DEFINE_QUANT(q4_1, 32, 20)
SD_DEFINE_QUANT(q5_0, 32, 22)
SD_DEFINE_QUANT(q5_1, 32, 24)
SD_DEFINE_QUANT(q8_0, 32, 34)
SD_DEFINE_QUANT(q4_K, 256, 144)
SD_DEFINE_QUANT(q5_K, 256, 176)
SD_DEFINE_QUANT(q6_K, 256, 210)
