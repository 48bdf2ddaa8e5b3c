/* simd_packed.h — what the tiles over repacked 8-row copies share (simd_vnni_q.c makes the
 * copies and holds the AVX512-VNNI tiles, simd_avx2_packed.c the AVX2 ones): the formats, the
 * activations of a batch interleaved block by block, the 8-output store and the tile driver.
 * Include only from x86-64 SIMD sources, after cpu/x86/simd.h. */
#ifndef SD_SIMD_PACKED_H
#define SD_SIMD_PACKED_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "cpu/quant.h"
#include "cpu/x86/simd_q_common.h"

/* The 32-element formats of the 8-row kernels, and the formats of the repacked copies: V_Q4_0,
 * V_Q4_1 and V_Q8_0 for every tile over the copy; V_Q5_0, V_Q5_1 and the K-quants (32-element
 * sub-blocks) for the AVX2 and AVX-VNNI tiles alone (simd_kpack.c makes those copies). */
enum { V_Q4_0, V_Q4_1, V_Q5_0, V_Q5_1, V_Q8_0, V_Q4_K, V_Q5_K, V_Q6_K };

/* The repacked format of a ggml type, or -1. */
static inline int packed_format(int type) {
    switch (type) {
    case SD_TYPE_Q4_0: return V_Q4_0;
    case SD_TYPE_Q4_1: return V_Q4_1;
    case SD_TYPE_Q5_0: return V_Q5_0;
    case SD_TYPE_Q5_1: return V_Q5_1;
    case SD_TYPE_Q8_0: return V_Q8_0;
    case SD_TYPE_Q4_K: return V_Q4_K;
    case SD_TYPE_Q5_K: return V_Q5_K;
    case SD_TYPE_Q6_K: return V_Q6_K;
    default: return -1;
    }
}

/* One block of 8 repacked rows x 32 elements of format f: its bytes, and where its fields lie.
 *   nibbles (V_Q4_0, V_Q4_1, V_Q5_0, V_Q5_1, V_Q4_K, V_Q5_K): 4 x 32 bytes at 0, vector h
 *     holding groups h (low nibbles) and h + 4 (high nibbles): byte 4k + e = the low 4 bits of
 *     element 4h + e of row k | those of element 16 + 4h + e << 4;
 *   fifth bits (V_Q5_0, V_Q5_1, V_Q5_K): 32 bytes at 128, byte 4k + e bit h = bit 4 of element
 *     4h + e of row k, bit h + 4 = bit 4 of element 16 + 4h + e (h < 4): the nibble vectors'
 *     bytes, one bit each;
 *   bytes (V_Q8_0: + 128 as unsigned; V_Q6_K: the signed q - 32): 8 x 32 bytes at 0, vector g
 *     byte 4k + e = element 4g + e of row k;
 *   integer scales (K-quants), one u8 (V_Q4_K, V_Q5_K) or i8 (V_Q6_K) per row, twice (lanes
 *     2k and 2k + 1 of 16 x i16): the sub-block's 6-bit scale, for V_Q6_K that of elements
 *     0-15 at pk_sc, of 16-31 at pk_sc + 16;
 *   d: f16 d[8] (the block's d; a K-quant's super-block d);
 *   m: the offset that multiplies the activation sum: f16 m[8] (V_Q4_1, V_Q5_1: the block's
 *     min), f32 m[8] (V_Q4_K, V_Q5_K: -dmin * min, exact in f32), none (V_Q4_0: f16 -8 d
 *     stored; V_Q5_0: -16 d and V_Q8_0: -128 d computed from d; V_Q6_K: signed, no offset). */
static inline int packed_bb(int f) {
    static const short bb[] = {160, 160, 176, 192, 272, 192, 224, 304};
    return bb[f];
}
static inline int pk_sc(int f) {
    return f == V_Q4_K ? 128 : f == V_Q5_K ? 160 : 256;
}
static inline int pk_d(int f) {
    static const short off[] = {128, 128, 160, 160, 256, 144, 176, 288};
    return off[f];
}
static inline int pk_m(int f) {
    static const short off[] = {144, 144, -1, 176, -1, 160, 192, -1};
    return off[f];
}

/* y[0 .. nr) (= or, accumulating, +=) lanes 0 .. nr of v + bias (bias NULL: none). */
SD_Q_AVX2 SD_INLINE void store8(float *y, __m256 v, int nr, const float *bias, int accumulate) {
    float o[8];
    _mm256_storeu_ps(o, v);
    for (int k = 0; k < nr; k++) {
        const float val = o[k] + (bias != NULL ? bias[k] : 0.0f);
        y[k] = accumulate ? y[k] + val : val;
    }
}

/* The activations of up to XI_TOKENS tokens, interleaved block by block for the packed
 * kernels: per block of 32 elements, XI_BYTES bytes = the 32 quants of tokens 0..15 (token t at
 * 32 t), then their f32 scales d (at XI_D + 4 t), then the f32 values the weight offsets
 * multiply (at XI_O + 4 t: s for the formats with a min, as their kernels over rows as stored
 * and llama.cpp take it; e for the formats shifted to unsigned). One pointer and
 * immediate offsets address every token, so sixteen tokens do not need 48 address registers.
 * Slots past the batch are left as they are: the kernels read only the first tt. */
#define XI_TOKENS 16
#define XI_D (32 * XI_TOKENS)
#define XI_O (XI_D + 4 * XI_TOKENS)
#define XI_BYTES (XI_O + 4 * XI_TOKENS)

SD_Q_AVX2 SD_INLINE void interleave_acts(uint8_t *xi, const int f, const sd_acts *a, int t0, int tt,
                                         int64_t n) {
    const int64_t nb = n / 32;
    for (int i = 0; i < tt; i++) {
        const sd_q8_row x = sd_q8_row_at(a->xq, n, t0 + i);
        const float *xo = f == V_Q4_1 || f == V_Q5_1 || f == V_Q4_K || f == V_Q5_K ? x.s : x.e;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = xi + (size_t)b * XI_BYTES;
            memcpy(blk + 32 * i, x.q + 32 * b, 32);
            memcpy(blk + XI_D + 4 * i, &x.d[b], 4);
            memcpy(blk + XI_O + 4 * i, &xo[b], 4);
        }
    }
}

/* The 4 activation bytes of group g of token t in the interleaved block X, broadcast. */
#define XIB(X, t, g) _mm256_set1_epi32(*(const int32_t *)((X) + 32 * (t) + 4 * (g)))
#define XID(X, t) _mm256_set1_ps(*(const float *)((X) + XI_D + 4 * (t)))
#define XIO(X, t) _mm256_set1_ps(*(const float *)((X) + XI_O + 4 * (t)))

/* One 160-byte block of 8 packed Q4_0/Q4_1 rows: the eight group vectors (nibbles as bytes,
 * groups h and h + 4 from vector h), the rows' scales d and offsets m. */
SD_Q_AVX2 SD_INLINE void unpack_packed_nibbles(__m256i *g, __m256 *dw, __m256 *mw,
                                               const uint8_t *P) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    for (int h = 0; h < 4; h++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(P + 32 * h));
        g[h] = _mm256_and_si256(v, lo4);
        g[h + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
    }
    *dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + 128)));
    *mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + 144)));
}

/* Fetch into L1 the block at P of the next 8-row group (nb blocks of bb bytes on): the tiles
 * do it while the first pass over a group multiplies, so the weights stream from memory once. */
SD_Q_AVX2 SD_INLINE void prefetch_next_group(const uint8_t *P, int64_t nb, int bb) {
    for (int o = 0; o < bb; o += 64) {
        _mm_prefetch((const char *)P + (size_t)nb * (size_t)bb + o, _MM_HINT_T0);
    }
}

/* The tile over repacked rows, for one instruction set. The tokens go in groups of at most TS,
 * as even as can be (17 tokens: 8 and 9, not 16 and 1: a pass of one token over the weights
 * costs nearly what a pass of many does, its sums being one dependent chain; a token's
 * arithmetic does not depend on its group's size, so no bit changes). The groups are
 * interleaved once, as many at a time as PACKED_XI_BYTES holds (all of a verify batch's; a long
 * prefill's in runs); for each run, blocks of PACKED_ROW_BLOCK rows (small enough to stay in L2
 * while every group passes over them), eight rows at a time with that set's packed8 kernel, or
 * sixteen where WIDE takes them. One body, two instantiations (VNNI with the 16-row step in
 * simd_vnni_q.c, AVX2 alone without it in simd_avx2_packed.c), each compiled for its own
 * target. */
#define PACKED_ROW_BLOCK 64
/* the most bytes of interleaved groups at once (one group of the longest row, SD_VNNI_MAX_ROW /
 * 32 blocks, takes 160 KB: then one group at a time) */
#define PACKED_XI_BYTES (128 * 1024)
#define PACKED_TILE(name, attr, dot, TS, WIDE, DISPATCH)                                           \
    attr void name(int type, float *y, int64_t ldy, const void *packed, int64_t nrows,             \
                   const sd_acts *a, int T, int64_t n, const float *bias, int accumulate) {        \
        const int f = packed_format(type);                                                         \
        const int bb = packed_bb(f);                                                               \
        const int64_t nb = n / 32;                                                                 \
        const size_t xg = (size_t)nb * XI_BYTES; /* one group's interleaved activations */         \
        const int ng = (T + (TS)-1) / (TS);                                                        \
        const int cap = xg <= PACKED_XI_BYTES ? (int)(PACKED_XI_BYTES / xg) : 1;                   \
        const int run = ng < cap ? ng : cap; /* groups interleaved at a time */                    \
        uint8_t xi[(size_t)(run > 0 ? run : 1) * xg] __attribute__((aligned(32)));                 \
        /* group g: tokens g T / ng to (g + 1) T / ng */                                           \
        for (int g0 = 0; g0 < ng; g0 += run) {                                                     \
            const int g1 = ng - g0 < run ? ng : g0 + run;                                          \
            for (int g = g0; g < g1; g++) {                                                        \
                const int t = (int)((int64_t)g * T / ng), te = (int)((int64_t)(g + 1) * T / ng);   \
                interleave_acts(xi + (size_t)(g - g0) * xg, f, a, t, te - t, n);                   \
            }                                                                                      \
            for (int64_t rb = 0; rb < nrows; rb += PACKED_ROW_BLOCK) {                             \
                const int64_t re = nrows - rb < PACKED_ROW_BLOCK ? nrows : rb + PACKED_ROW_BLOCK;  \
                for (int g = g0; g < g1; g++) {                                                    \
                    const int t = (int)((int64_t)g * T / ng);                                      \
                    const int tt = (int)((int64_t)(g + 1) * T / ng) - t;                           \
                    const uint8_t *xs = xi + (size_t)(g - g0) * xg;                                \
                    for (int64_t r0 = rb; r0 < re; r0 += 8) {                                      \
                        const uint8_t *P =                                                         \
                            (const uint8_t *)packed + (size_t)(r0 / 8) * (size_t)nb * (size_t)bb;  \
                        const float *bv = bias != NULL ? bias + r0 : NULL;                         \
                        WIDE(f, tt, P, nb, bb, xs, y, ldy, t, r0, re, bv, accumulate)              \
                        __m256 out[XI_TOKENS];                                                     \
                        DISPATCH(dot, f, tt, out, P, nb, xs);                                      \
                        for (int i = 0; i < tt; i++) {                                             \
                            store8(y + (size_t)(t + i) * (size_t)ldy + (size_t)r0, out[i], 8, bv,  \
                                   accumulate);                                                    \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

/* Format and token count as compile-time constants of a packed kernel: dot(F, TT, ...) with the
 * arguments that follow tt. */
#define PACKED_DISPATCH(dot, f, tt, ...)                                                           \
    do {                                                                                           \
        if ((f) == V_Q4_0) {                                                                       \
            PACKED_TT(dot, V_Q4_0, tt, __VA_ARGS__);                                               \
        } else if ((f) == V_Q4_1) {                                                                \
            PACKED_TT(dot, V_Q4_1, tt, __VA_ARGS__);                                               \
        } else {                                                                                   \
            PACKED_TT(dot, V_Q8_0, tt, __VA_ARGS__);                                               \
        }                                                                                          \
    } while (0)
/* PACKED_DISPATCH with the formats only the AVX2 and AVX-VNNI tiles read too. */
#define PACKED_DISPATCH_ALL(dot, f, tt, ...)                                                       \
    do {                                                                                           \
        switch (f) {                                                                               \
        case V_Q4_0: PACKED_TT(dot, V_Q4_0, tt, __VA_ARGS__); break;                               \
        case V_Q4_1: PACKED_TT(dot, V_Q4_1, tt, __VA_ARGS__); break;                               \
        case V_Q5_0: PACKED_TT(dot, V_Q5_0, tt, __VA_ARGS__); break;                               \
        case V_Q5_1: PACKED_TT(dot, V_Q5_1, tt, __VA_ARGS__); break;                               \
        case V_Q4_K: PACKED_TT(dot, V_Q4_K, tt, __VA_ARGS__); break;                               \
        case V_Q5_K: PACKED_TT(dot, V_Q5_K, tt, __VA_ARGS__); break;                               \
        case V_Q6_K: PACKED_TT(dot, V_Q6_K, tt, __VA_ARGS__); break;                               \
        default: PACKED_TT(dot, V_Q8_0, tt, __VA_ARGS__); break;                                   \
        }                                                                                          \
    } while (0)
#define PACKED_TT(dot, F, tt, ...)                                                                 \
    switch (tt) {                                                                                  \
    case 16: dot(F, 16, __VA_ARGS__); break;                                                       \
    case 15: dot(F, 15, __VA_ARGS__); break;                                                       \
    case 14: dot(F, 14, __VA_ARGS__); break;                                                       \
    case 13: dot(F, 13, __VA_ARGS__); break;                                                       \
    case 12: dot(F, 12, __VA_ARGS__); break;                                                       \
    case 11: dot(F, 11, __VA_ARGS__); break;                                                       \
    case 10: dot(F, 10, __VA_ARGS__); break;                                                       \
    case 9: dot(F, 9, __VA_ARGS__); break;                                                         \
    case 8: dot(F, 8, __VA_ARGS__); break;                                                         \
    case 7: dot(F, 7, __VA_ARGS__); break;                                                         \
    case 6: dot(F, 6, __VA_ARGS__); break;                                                         \
    case 5: dot(F, 5, __VA_ARGS__); break;                                                         \
    case 4: dot(F, 4, __VA_ARGS__); break;                                                         \
    case 3: dot(F, 3, __VA_ARGS__); break;                                                         \
    case 2: dot(F, 2, __VA_ARGS__); break;                                                         \
    default: dot(F, 1, __VA_ARGS__); break;                                                        \
    }
#define PACKED_NARROW(...)

#endif /* SD_SIMD_PACKED_H */
