/* blocks.h — ggml's quantized block formats, one decoder per format: sub-block `sub` (32
 * elements) of a block -> int8 quants and float scales. The C kernels (quant_blocks.c) and the
 * CUDA matmul kernels decode with these same functions (SD_HD: host and device). Layouts as in
 * ggml-common.h; blocks are only 2-byte aligned, so wider fields are read with memcpy. */
#ifndef SD_BLOCKS_H
#define SD_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "util/hd.h"

/* One 32-element sub-block decoded: value[j] = (j < 16 ? d_lo : d_hi) * q[j] + m.
 * d_lo == d_hi except for Q6_K, whose scales cover 16 elements. */
typedef struct {
    int8_t q[32];
    float d_lo, d_hi;
    float m;
} sd_sub32;

SD_HD float sd_blk_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return sd_hd_f16_to_f32(h);
}

/* Q4_0: f16 d | 16 bytes of nibbles; element j < 16 is the low nibble of byte j, element
 * j + 16 its high nibble; value = d * (nibble - 8). */
SD_HD void sd_blk_decode_q4_0(sd_sub32 *o, const uint8_t *blk, int sub) {
    (void)sub;
    const uint8_t *qs = blk + 2;
    for (int j = 0; j < 16; j++) {
        o->q[j] = (int8_t)((qs[j] & 0x0F) - 8);
        o->q[j + 16] = (int8_t)((qs[j] >> 4) - 8);
    }
    o->d_lo = o->d_hi = sd_blk_f16(blk);
    o->m = 0.0f;
}

/* Q4_1: f16 d | f16 m | nibbles as Q4_0; value = d * nibble + m. */
SD_HD void sd_blk_decode_q4_1(sd_sub32 *o, const uint8_t *blk, int sub) {
    (void)sub;
    const uint8_t *qs = blk + 4;
    for (int j = 0; j < 16; j++) {
        o->q[j] = (int8_t)(qs[j] & 0x0F);
        o->q[j + 16] = (int8_t)(qs[j] >> 4);
    }
    o->d_lo = o->d_hi = sd_blk_f16(blk);
    o->m = sd_blk_f16(blk + 2);
}

/* Q5_0: f16 d | u32 qh (bit j: fifth bit of element j) | nibbles; value = d * (q5 - 16). */
SD_HD void sd_blk_decode_q5_0(sd_sub32 *o, const uint8_t *blk, int sub) {
    (void)sub;
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    const uint8_t *qs = blk + 6;
    for (int j = 0; j < 16; j++) {
        o->q[j] = (int8_t)(((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4)) - 16);
        o->q[j + 16] = (int8_t)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16);
    }
    o->d_lo = o->d_hi = sd_blk_f16(blk);
    o->m = 0.0f;
}

/* Q5_1: f16 d | f16 m | u32 qh | nibbles; value = d * q5 + m. */
SD_HD void sd_blk_decode_q5_1(sd_sub32 *o, const uint8_t *blk, int sub) {
    (void)sub;
    uint32_t qh;
    memcpy(&qh, blk + 4, 4);
    const uint8_t *qs = blk + 8;
    for (int j = 0; j < 16; j++) {
        o->q[j] = (int8_t)((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4));
        o->q[j + 16] = (int8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
    }
    o->d_lo = o->d_hi = sd_blk_f16(blk);
    o->m = sd_blk_f16(blk + 2);
}

/* Q8_0: f16 d | 32 int8; value = d * q. */
SD_HD void sd_blk_decode_q8_0(sd_sub32 *o, const uint8_t *blk, int sub) {
    (void)sub;
    memcpy(o->q, blk + 2, 32);
    o->d_lo = o->d_hi = sd_blk_f16(blk);
    o->m = 0.0f;
}

SD_HD void sd_blk_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
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
SD_HD void sd_blk_decode_q4_K(sd_sub32 *o, const uint8_t *blk, int sub) {
    uint8_t sc, m;
    sd_blk_k4_scale_min(sub, blk + 4, &sc, &m);
    const uint8_t *qs = blk + 16 + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    for (int j = 0; j < 32; j++) {
        o->q[j] = (int8_t)((qs[j] >> shift) & 0x0F);
    }
    o->d_lo = o->d_hi = sd_blk_f16(blk) * (float)sc;
    o->m = -sd_blk_f16(blk + 2) * (float)m;
}

/* Q5_K (256 elements): as Q4_K with 32 bytes qh after the scales: bit `sub` of qh[j] is the
 * fifth bit of element j of sub-block `sub`; value = d * sc * q5 - dmin * m. */
SD_HD void sd_blk_decode_q5_K(sd_sub32 *o, const uint8_t *blk, int sub) {
    uint8_t sc, m;
    sd_blk_k4_scale_min(sub, blk + 4, &sc, &m);
    const uint8_t *qh = blk + 16;
    const uint8_t *qs = blk + 48 + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    for (int j = 0; j < 32; j++) {
        o->q[j] = (int8_t)(((qs[j] >> shift) & 0x0F) | (((qh[j] >> sub) & 1) << 4));
    }
    o->d_lo = o->d_hi = sd_blk_f16(blk) * (float)sc;
    o->m = -sd_blk_f16(blk + 2) * (float)m;
}

/* Q6_K (256 elements): 128 bytes ql (low 4 bits) | 64 bytes qh (high 2 bits) | 16 int8 scales |
 * f16 d. Two halves of 128 elements; in half h, sub-block k (0..3) takes the low (k < 2) or high
 * nibbles of ql[64h + 32(k % 2) + j] and bits 2k, 2k + 1 of qh[32h + j]; each 16 elements have
 * their own scale; value = d * scale * (q6 - 32). */
SD_HD void sd_blk_decode_q6_K(sd_sub32 *o, const uint8_t *blk, int sub) {
    const int h = sub / 4, k = sub % 4;
    const uint8_t *ql = blk + 64 * h + 32 * (k % 2);
    const uint8_t *qh = blk + 128 + 32 * h;
    const int8_t *sc = (const int8_t *)(blk + 192) + 8 * h + 2 * k;
    const int nshift = 4 * (k / 2), hshift = 2 * k;
    for (int j = 0; j < 32; j++) {
        int q = ((ql[j] >> nshift) & 0x0F) | (((qh[j] >> hshift) & 3) << 4);
        o->q[j] = (int8_t)(q - 32);
    }
    const float d = sd_blk_f16(blk + 208);
    o->d_lo = d * (float)sc[0];
    o->d_hi = d * (float)sc[1];
    o->m = 0.0f;
}

#endif /* SD_BLOCKS_H */
