/* simd_kpack.c — the load-time copies of Q5_0, Q5_1, Q4_K, Q5_K and Q6_K matrices in the 8-row
 * interleaved layout of the AVX2 tile over repacked rows (simd_avx2_packed.c; layouts in
 * simd_packed.h). Every value is kept exactly: the integer quants as they are (5-bit ones as a
 * nibble and a bit), the f16 scales as stored, and a K-quant's 6-bit sub-block scale as an
 * integer that the tile multiplies in before its one float step per block. */
#include "cpu/x86/simd.h"

#ifdef SD_HAVE_X86_SIMD

#include <string.h>

#include "cpu/quant_blocks.h"
#include "cpu/x86/simd_packed.h"

/* Sub-block b (32 elements) of one row as the copy holds it: 32 quants (unsigned 0..31 for the
 * 5-bit and 4-bit formats, signed q - 32 for Q6_K), the f16 d as stored, the offset (f16 bits of
 * a Q5_1 min, or a K-quant's f32 -dmin * min) and the integer scales (Q6_K: two). */
typedef struct {
    uint8_t q[32];
    uint16_t d;
    uint16_t m16;
    float m;
    int sc[2];
} sub_t;

static void read_sub(sub_t *o, const int f, const uint8_t *row, int64_t b) {
    sd_sub32 s;
    const uint8_t *blk;
    const int sub = (int)(b % 8);
    switch (f) {
    case V_Q5_0:
        blk = row + (size_t)b * 22;
        sd_decode_q5_0(&s, blk, 0);
        for (int j = 0; j < 32; j++) {
            o->q[j] = (uint8_t)(s.q[j] + 16);
        }
        break;
    case V_Q5_1:
        blk = row + (size_t)b * 24;
        sd_decode_q5_1(&s, blk, 0);
        memcpy(o->q, s.q, 32);
        memcpy(&o->m16, blk + 2, 2);
        break;
    case V_Q4_K:
    case V_Q5_K: {
        blk = row + (size_t)(b / 8) * (f == V_Q4_K ? 144 : 176);
        (f == V_Q4_K ? sd_decode_q4_K : sd_decode_q5_K)(&s, blk, sub);
        memcpy(o->q, s.q, 32);
        uint8_t sc, mn;
        sd_k4_scale_min(sub, blk + 4, &sc, &mn);
        o->sc[0] = o->sc[1] = sc;
        o->m = s.m; /* -dmin * min: an f16 times a 6-bit integer, exact in f32 */
        break;
    }
    default: /* V_Q6_K */
        blk = row + (size_t)(b / 8) * 210;
        sd_decode_q6_K(&s, blk, sub);
        memcpy(o->q, s.q, 32);
        o->sc[0] = ((const int8_t *)blk)[192 + 2 * sub];
        o->sc[1] = ((const int8_t *)blk)[192 + 2 * sub + 1];
        blk += 208; /* where d is */
        break;
    }
    memcpy(&o->d, blk, 2);
}

void sd_kpack_rows8(void *dst, int f, const void *w, size_t row_bytes, int64_t rows, int64_t cols) {
    const int bb = packed_bb(f);
    const int64_t nb = cols / 32;
    const int five = f == V_Q5_0 || f == V_Q5_1 || f == V_Q5_K;
    uint8_t *P = (uint8_t *)dst;
    for (int64_t r0 = 0; r0 < rows; r0 += 8) {
        for (int64_t b = 0; b < nb; b++, P += bb) {
            memset(P, 0, (size_t)bb);
            for (int k = 0; k < 8; k++) {
                sub_t s = {0};
                read_sub(&s, f, (const uint8_t *)w + (size_t)(r0 + k) * row_bytes, b);
                for (int g = 0; g < 8 && f == V_Q6_K; g++) { /* bytes */
                    memcpy(P + 32 * g + 4 * k, s.q + 4 * g, 4);
                }
                for (int h = 0; h < 4 && f != V_Q6_K; h++) { /* nibbles, fifth bits */
                    for (int e = 0; e < 4; e++) {
                        const uint8_t lo = s.q[4 * h + e], hi = s.q[16 + 4 * h + e];
                        P[32 * h + 4 * k + e] = (uint8_t)((lo & 15) | (hi & 15) << 4);
                        if (five) {
                            P[128 + 4 * k + e] |= (uint8_t)((lo >> 4) << h | (hi >> 4) << (h + 4));
                        }
                    }
                }
                if (f >= V_Q4_K) {
                    for (int i = 0; i < (f == V_Q6_K ? 2 : 1); i++) {
                        P[pk_sc(f) + 16 * i + 2 * k] = P[pk_sc(f) + 16 * i + 2 * k + 1] =
                            (uint8_t)s.sc[i];
                    }
                }
                memcpy(P + pk_d(f) + 2 * k, &s.d, 2);
                if (f == V_Q5_1) {
                    memcpy(P + pk_m(f) + 2 * k, &s.m16, 2);
                } else if (f == V_Q4_K || f == V_Q5_K) {
                    memcpy(P + pk_m(f) + 4 * k, &s.m, 4);
                }
            }
        }
    }
}

#endif /* SD_HAVE_X86_SIMD */
