/* simd_avx2_packed.c — AVX2 tiles over the repacked 8-row copies of Q4_0, Q4_1, Q8_0, Q5_0,
 * Q5_1, Q4_K, Q5_K and Q6_K matrices (simd_vnni_q.c and simd_kpack.c make them; simd_packed.h
 * has the layouts and the tile driver), for CPUs without AVX-VNNI (and for the formats other
 * than Q4_0, Q4_1 and Q8_0 where AVX-512 exists without it): up to 16 tokens per pass over each
 * weight block.
 *
 * maddubs multiplies 32 unsigned weight bytes by 32 signed activation bytes into 16 sums of
 * pairs; on Zen 2 it shares one pipe with madd (i16 pairs -> i32), so those two are what a
 * batch's integer work costs. For the nibble formats, |pair| <= 2 * 15 * 127 = 3810, so the
 * eight groups of a block add up in i16 (|sum| <= 30480: no saturation, the exact integer) and
 * one madd per block and token widens the sum: 9 instructions on that pipe per 256
 * multiply-adds instead of 16. Q8_0 keeps one madd per group (|w| up to 128: two pairs can
 * overflow i16). A pass over an 8-row group serves up to 5 tokens, whose float accumulators and
 * integer sums stay in the 16 registers with the unpacked weights; a larger batch passes over
 * the group again from L1, unpacking it again (a few instructions on the other pipes). The float
 * step per block and token is the VNNI tiles' (offset times the activation sum, then the
 * converted sum times d_w d_x, both fused), so a token's bits do not depend on its chunk,
 * group or batch. */
#include "cpu/x86/simd.h"

#ifdef SD_HAVE_X86_SIMD

#include <immintrin.h>

#include "cpu/x86/simd_packed.h"
#include "cpu/x86/simd_q_common.h"

/* Tokens per pass over an 8-row group's blocks: their float accumulators and integer sums
 * (2 x 5 registers) and the unpacked weight vectors stay in the 16 registers. */
#define CHUNK 5
/* The same for the formats whose sums go in two halves (3 x 4 registers). */
#define CHUNK_SPLIT 4

/* s = p (first) or s += p in 16-bit (ADD16) or 32-bit (ADD32) lanes, the add in place and
 * opaque to GCC: it would reassociate a chain of integer adds (every multiply of a block first,
 * the products spilled for the adds), and an empty asm that pins the sum instead costs a register
 * move per add. Saturating adds would stop it too, but on Zen 2 vpaddsw competes with maddubs
 * for its pipe. */
#define ADD_IN_PLACE(insn, first, s, p)                                                            \
    do {                                                                                           \
        if (first) {                                                                               \
            (s) = (p);                                                                             \
        } else {                                                                                   \
            __asm__(insn " %1, %0, %0" : "+x"(s) : "x"(p));                                        \
        }                                                                                          \
    } while (0)
#define ADD16(first, s, p) ADD_IN_PLACE("vpaddw", first, s, p)
#define ADD32(first, s, p) ADD_IN_PLACE("vpaddd", first, s, p)

/* The exact integer sums of one block of 8 rows (P) and tokens t0 .. t0 + C - 1 (X): s32[t]
 * lane k = row k's dot product with token t, times the rows' integer scales where the format has
 * them. One function per layout; pass_chunk() adds the float step. */

/* Q4_0, Q4_1 and Q4_K nibbles: the eight groups add up in i16, widened by one madd by 1, or by
 * Q4_K's integer sub-block scales (|sum| <= 30480, scale <= 63: exact in i32 and in f32). */
SD_Q_AVX2 SD_INLINE void sums_nibbles(const int f, const int t0, const int C, __m256i *s32,
                                      const uint8_t *P, const uint8_t *X) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    __m256i s[CHUNK];
    for (int h = 0; h < 4; h++) { /* vector h: group h (low nibbles) and h + 4 (high) */
        const __m256i v = _mm256_loadu_si256((const __m256i *)(P + 32 * h));
        const __m256i lo = _mm256_and_si256(v, lo4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
        for (int t = 0; t < C; t++) {
            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, XIB(X, t0 + t, h)),
                                               _mm256_maddubs_epi16(hi, XIB(X, t0 + t, h + 4)));
            ADD16(h == 0, s[t], p);
        }
    }
    const __m256i k16 = f == V_Q4_K
                            ? _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(P + pk_sc(f))))
                            : _mm256_set1_epi16(1);
    for (int t = 0; t < C; t++) {
        s32[t] = _mm256_madd_epi16(s[t], k16);
    }
}

/* 5-bit quants (Q5_0, Q5_1, Q5_K): the nibble vectors and the fifth bits. A pair of products
 * reaches 2 * 31 * 127 = 7874, so a block's sums go in two i16 halves (elements 0-15 from the
 * low nibbles, 16-31 from the high: at most 31496 each), widened by two madds (by 1, or by
 * Q5_K's integer sub-block scales, <= 63: at most 7.9e6 in i32, exact in f32). */
SD_Q_AVX2 SD_INLINE void sums_five(const int f, const int t0, const int C, __m256i *s32,
                                   const uint8_t *P, const uint8_t *X) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    const __m256i H = _mm256_loadu_si256((const __m256i *)(P + 128));
    __m256i sa[CHUNK_SPLIT], sb[CHUNK_SPLIT];
    for (int h = 0; h < 4; h++) {
        /* bit h of H to bit 4 for group h, bit h + 4 for group h + 4 (16-bit shifts move no
         * other byte's bit there) */
        const __m256i v = _mm256_loadu_si256((const __m256i *)(P + 32 * h));
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, lo4),
                                           _mm256_and_si256(_mm256_slli_epi16(H, 4 - h), bit4));
        const __m256i hi =
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), lo4),
                            _mm256_and_si256(h == 0 ? H : _mm256_srli_epi16(H, h), bit4));
        for (int t = 0; t < C; t++) {
            const __m256i pa = _mm256_maddubs_epi16(lo, XIB(X, t0 + t, h));
            const __m256i pb = _mm256_maddubs_epi16(hi, XIB(X, t0 + t, h + 4));
            ADD16(h == 0, sa[t], pa);
            ADD16(h == 0, sb[t], pb);
        }
    }
    const __m256i k16 = f == V_Q5_K
                            ? _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(P + pk_sc(f))))
                            : _mm256_set1_epi16(1);
    for (int t = 0; t < C; t++) {
        s32[t] = _mm256_add_epi32(_mm256_madd_epi16(sa[t], k16), _mm256_madd_epi16(sb[t], k16));
    }
}

/* Q8_0 bytes (stored + 128): back to signed, |w| for maddubs and the sign of w moved onto the
 * activations; one madd per group (|w| up to 128: two pairs can overflow i16). */
SD_Q_AVX2 SD_INLINE void sums_q8(const int t0, const int C, __m256i *s32, const uint8_t *P,
                                 const uint8_t *X) {
    for (int k = 0; k < 8; k++) {
        const __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(P + 32 * k)),
                                           _mm256_set1_epi8((char)0x80));
        const __m256i u = _mm256_sign_epi8(w, w);
        for (int t = 0; t < C; t++) {
            const __m256i x = _mm256_sign_epi8(XIB(X, t0 + t, k), w);
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
            ADD32(k == 0, s32[t], p);
        }
    }
}

/* Q6_K bytes, signed q - 32: as Q8_0, but |w| <= 32 lets a half block (4 groups, one scale) add
 * up in i16 (<= 32512), widened by madds by its signed 8-bit scales (the i32 sum of a block
 * stays below 32 * 32 * 127 * 128 < 2^24: exact in f32). */
SD_Q_AVX2 SD_INLINE void sums_q6k(const int t0, const int C, __m256i *s32, const uint8_t *P,
                                  const uint8_t *X) {
    __m256i sh[2][CHUNK_SPLIT]; /* the sums of elements 0-15 and of 16-31 */
    for (int half = 0; half < 2; half++) {
        for (int j = 0; j < 4; j++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(P + 128 * half + 32 * j));
            const __m256i u = _mm256_sign_epi8(w, w);
            for (int t = 0; t < C; t++) {
                const __m256i x = _mm256_sign_epi8(XIB(X, t0 + t, 4 * half + j), w);
                const __m256i p = _mm256_maddubs_epi16(u, x);
                ADD16(j == 0, sh[half][t], p);
            }
        }
    }
    const int so = pk_sc(V_Q6_K);
    const __m256i ka = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(P + so)));
    const __m256i kb = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(P + so + 16)));
    for (int t = 0; t < C; t++) {
        s32[t] = _mm256_add_epi32(_mm256_madd_epi16(sh[0][t], ka), _mm256_madd_epi16(sh[1][t], kb));
    }
}

/* Tokens t0 .. t0 + C - 1 against nb blocks of 8 rows of format f from P: per block the exact
 * integer sums, then the float step (the offset times the activation sum, then the converted sum
 * times d_w d_x, both fused; Q8_0 and Q6_K have no offset). */
SD_Q_AVX2 SD_INLINE void pass_chunk(const int f, const int t0, const int C, __m256 *out,
                                    const uint8_t *P, int64_t nb, const uint8_t *X, int prefetch) {
    const int bb = packed_bb(f);
    const int offset = f != V_Q8_0 && f != V_Q6_K;
    __m256 acc[CHUNK];
    for (int t = 0; t < C; t++) {
        acc[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++, P += bb, X += XI_BYTES) {
        if (prefetch) {
            prefetch_next_group(P, nb, bb);
        }
        __m256i s32[CHUNK];
        if (f == V_Q8_0) {
            sums_q8(t0, C, s32, P, X);
        } else if (f == V_Q6_K) {
            sums_q6k(t0, C, s32, P, X);
        } else if (f == V_Q5_0 || f == V_Q5_1 || f == V_Q5_K) {
            sums_five(f, t0, C, s32, P, X);
        } else {
            sums_nibbles(f, t0, C, s32, P, X);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + pk_d(f))));
        __m256 mw = _mm256_setzero_ps();
        if (f == V_Q5_0) {
            mw = _mm256_mul_ps(dw, _mm256_set1_ps(-16.0f));
        } else if (f == V_Q4_K || f == V_Q5_K) {
            mw = _mm256_loadu_ps((const float *)(P + pk_m(f)));
        } else if (offset) {
            mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + pk_m(f))));
        }
        for (int t = 0; t < C; t++) {
            if (offset) {
                acc[t] = _mm256_fmadd_ps(mw, XIO(X, t0 + t), acc[t]);
            }
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[t]), _mm256_mul_ps(dw, XID(X, t0 + t)),
                                     acc[t]);
        }
    }
    for (int t = 0; t < C; t++) {
        out[t0 + t] = acc[t];
    }
}

/* Eight packed rows against TT <= 16 tokens: out[t] lane k = dot(row k, token t). The tokens go
 * in chunks of at most CHUNK, as even as can be, each a pass over the group's blocks (from
 * memory for the first, which prefetches the next group; then from L1: 18-48 blocks of 160
 * bytes for rows of 576-1536). */
SD_Q_AVX2 SD_INLINE void packed8_dot_avx2(const int f, const int TT, __m256 *out, const uint8_t *P,
                                          int64_t nb, const uint8_t *X) {
    const int split = f == V_Q5_0 || f == V_Q5_1 || f == V_Q5_K || f == V_Q6_K;
    const int chunk = split ? CHUNK_SPLIT : CHUNK;
    const int nc = (TT + chunk - 1) / chunk;
#pragma GCC unroll 4 /* chunk sizes as compile-time constants */
    for (int c = 0; c < nc; c++) {
        const int t0 = c * TT / nc, C = (c + 1) * TT / nc - t0;
        pass_chunk(f, t0, C, out, P, nb, X, c == 0);
    }
}

PACKED_TILE(sd_tile_packed_avx2, SD_Q_AVX2, packed8_dot_avx2, 16, PACKED_NARROW,
            PACKED_DISPATCH_ALL)

#endif /* SD_HAVE_X86_SIMD */
