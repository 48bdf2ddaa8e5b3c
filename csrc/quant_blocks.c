/* quant_blocks.c — portable kernels of the quantized block formats.
 *
 * Each format is described once, by a decoder that turns one 32-element sub-block into int8
 * quants and float scales (sd_sub32). Dequantization and the dot product with quantized
 * activations are written over that decoder, so a format's layout lives in one function:
 *   dot = sum over sub-blocks of d_x * (d_lo * sum_lo(q * qx) + d_hi * sum_hi(q * qx)) + m * s_x
 * where s_x = d_x * sum(qx) carries the per-block offsets (Q4_1, Q5_1, K-quants). */
#include "quant_blocks.h"

#include <math.h>
#include <string.h>

static float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return sd_f16_to_f32(h);
}

/* The f32 value llama.cpp keeps of a scale it stores as f16. */
static float round_f16(float x) {
    return sd_f16_to_f32(sd_f32_to_f16(x));
}

void sd_quantize_q8_ref(unsigned char *dst, const float *x, int64_t n) {
    int8_t *q = (int8_t *)dst;
    float *d = (float *)(dst + n);
    float *s = d + n / 32;
    float *e = s + n / 32;
    for (int64_t b = 0; b < n / 32; b++) {
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

/* ---- decoders: one per format ------------------------------------------------------------- */

/* Q4_0: f16 d | 16 bytes of nibbles; element j < 16 is the low nibble of byte j, element
 * j + 16 its high nibble; value = d * (nibble - 8). */
void sd_decode_q4_0(sd_sub32 *o, const uint8_t *blk, int sub) {
    (void)sub;
    const uint8_t *qs = blk + 2;
    for (int j = 0; j < 16; j++) {
        o->q[j] = (int8_t)((qs[j] & 0x0F) - 8);
        o->q[j + 16] = (int8_t)((qs[j] >> 4) - 8);
    }
    o->d_lo = o->d_hi = f16_at(blk);
    o->m = 0.0f;
}

/* Q4_1: f16 d | f16 m | nibbles as Q4_0; value = d * nibble + m. */
void sd_decode_q4_1(sd_sub32 *o, const uint8_t *blk, int sub) {
    (void)sub;
    const uint8_t *qs = blk + 4;
    for (int j = 0; j < 16; j++) {
        o->q[j] = (int8_t)(qs[j] & 0x0F);
        o->q[j + 16] = (int8_t)(qs[j] >> 4);
    }
    o->d_lo = o->d_hi = f16_at(blk);
    o->m = f16_at(blk + 2);
}

/* Q5_0: f16 d | u32 qh (bit j: fifth bit of element j) | nibbles; value = d * (q5 - 16). */
void sd_decode_q5_0(sd_sub32 *o, const uint8_t *blk, int sub) {
    (void)sub;
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    const uint8_t *qs = blk + 6;
    for (int j = 0; j < 16; j++) {
        o->q[j] = (int8_t)(((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4)) - 16);
        o->q[j + 16] = (int8_t)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16);
    }
    o->d_lo = o->d_hi = f16_at(blk);
    o->m = 0.0f;
}

/* Q5_1: f16 d | f16 m | u32 qh | nibbles; value = d * q5 + m. */
void sd_decode_q5_1(sd_sub32 *o, const uint8_t *blk, int sub) {
    (void)sub;
    uint32_t qh;
    memcpy(&qh, blk + 4, 4);
    const uint8_t *qs = blk + 8;
    for (int j = 0; j < 16; j++) {
        o->q[j] = (int8_t)((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4));
        o->q[j + 16] = (int8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
    }
    o->d_lo = o->d_hi = f16_at(blk);
    o->m = f16_at(blk + 2);
}

/* Q8_0: f16 d | 32 int8; value = d * q. */
void sd_decode_q8_0(sd_sub32 *o, const uint8_t *blk, int sub) {
    (void)sub;
    memcpy(o->q, blk + 2, 32);
    o->d_lo = o->d_hi = f16_at(blk);
    o->m = 0.0f;
}

void sd_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Q4_K (256 elements): f16 d | f16 dmin | 12 bytes of 6-bit scales and mins | 128 bytes of
 * nibbles. Sub-blocks 2i and 2i + 1 are the low and high nibbles of bytes 32i .. 32i + 31;
 * value = d * sc[sub] * nibble - dmin * m[sub]. */
void sd_decode_q4_K(sd_sub32 *o, const uint8_t *blk, int sub) {
    uint8_t sc, m;
    sd_k4_scale_min(sub, blk + 4, &sc, &m);
    const uint8_t *qs = blk + 16 + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    for (int j = 0; j < 32; j++) {
        o->q[j] = (int8_t)((qs[j] >> shift) & 0x0F);
    }
    o->d_lo = o->d_hi = f16_at(blk) * (float)sc;
    o->m = -f16_at(blk + 2) * (float)m;
}

/* Q5_K (256 elements): as Q4_K with 32 bytes qh after the scales: bit `sub` of qh[j] is the
 * fifth bit of element j of sub-block `sub`; value = d * sc * q5 - dmin * m. */
void sd_decode_q5_K(sd_sub32 *o, const uint8_t *blk, int sub) {
    uint8_t sc, m;
    sd_k4_scale_min(sub, blk + 4, &sc, &m);
    const uint8_t *qh = blk + 16;
    const uint8_t *qs = blk + 48 + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    for (int j = 0; j < 32; j++) {
        o->q[j] = (int8_t)(((qs[j] >> shift) & 0x0F) | (((qh[j] >> sub) & 1) << 4));
    }
    o->d_lo = o->d_hi = f16_at(blk) * (float)sc;
    o->m = -f16_at(blk + 2) * (float)m;
}

/* Q6_K (256 elements): 128 bytes ql (low 4 bits) | 64 bytes qh (high 2 bits) | 16 int8 scales |
 * f16 d. Two halves of 128 elements; in half h, sub-block k (0..3) takes the low (k < 2) or high
 * nibbles of ql[64h + 32(k % 2) + j] and bits 2k, 2k + 1 of qh[32h + j]; each 16 elements have
 * their own scale; value = d * scale * (q6 - 32). */
void sd_decode_q6_K(sd_sub32 *o, const uint8_t *blk, int sub) {
    const int h = sub / 4, k = sub % 4;
    const uint8_t *ql = blk + 64 * h + 32 * (k % 2);
    const uint8_t *qh = blk + 128 + 32 * h;
    const int8_t *sc = (const int8_t *)(blk + 192) + 8 * h + 2 * k;
    const int nshift = 4 * (k / 2), hshift = 2 * k;
    for (int j = 0; j < 32; j++) {
        int q = ((ql[j] >> nshift) & 0x0F) | (((qh[j] >> hshift) & 3) << 4);
        o->q[j] = (int8_t)(q - 32);
    }
    const float d = f16_at(blk + 208);
    o->d_lo = d * (float)sc[0];
    o->d_hi = d * (float)sc[1];
    o->m = 0.0f;
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
