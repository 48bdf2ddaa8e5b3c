/* simd_avx2_packed.c — AVX2 tiles over the repacked 8-row copies of Q4_0, Q4_1 and Q8_0
 * matrices (simd_vnni_q.c makes them; simd_packed.h has the layout and the tile driver), for
 * CPUs without AVX512-VNNI: up to 16 tokens per pass over each weight block.
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

/* v as it is here, in a register: keeps GCC from reassociating a chain of integer adds (it
 * would do every multiply of a block first and spill the products for the adds). Saturating
 * adds would stop it too, but on Zen 2 vpaddsw competes with maddubs for its pipe. */
#define KEEP(v) __asm__("" : "+x"(v))

/* Tokens t0 .. t0 + C - 1 against nb 160-byte Q4_0/Q4_1 blocks of 8 rows from P. */
SD_Q_AVX2 SD_INLINE void chunk_nibbles(const int t0, const int C, __m256 *out, const uint8_t *P,
                                       int64_t nb, const uint8_t *X, int prefetch) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    __m256 acc[CHUNK];
    for (int t = 0; t < C; t++) {
        acc[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++, P += 160, X += XI_BYTES) {
        if (prefetch) { /* this block of the next 8 rows */
            for (int o = 0; o < 160; o += 64) {
                _mm_prefetch((const char *)P + (size_t)nb * 160 + o, _MM_HINT_T0);
            }
        }
        __m256i s[CHUNK];
        for (int h = 0; h < 4; h++) { /* vector h: group h (low nibbles) and h + 4 (high) */
            const __m256i v = _mm256_loadu_si256((const __m256i *)(P + 32 * h));
            const __m256i lo = _mm256_and_si256(v, lo4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
            for (int t = 0; t < C; t++) {
                const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, XIB(X, t0 + t, h)),
                                                   _mm256_maddubs_epi16(hi, XIB(X, t0 + t, h + 4)));
                s[t] = h == 0 ? p : _mm256_add_epi16(s[t], p);
                KEEP(s[t]);
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + 128)));
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + 144)));
        for (int t = 0; t < C; t++) {
            const __m256 sf = _mm256_cvtepi32_ps(_mm256_madd_epi16(s[t], _mm256_set1_epi16(1)));
            acc[t] = _mm256_fmadd_ps(mw, XIO(X, t0 + t), acc[t]);
            acc[t] = _mm256_fmadd_ps(sf, _mm256_mul_ps(dw, XID(X, t0 + t)), acc[t]);
        }
    }
    for (int t = 0; t < C; t++) {
        out[t0 + t] = acc[t];
    }
}

/* The same for 272-byte Q8_0 blocks (bytes stored + 128): back to signed, |w| for maddubs and
 * the sign of w moved onto the activations. */
SD_Q_AVX2 SD_INLINE void chunk_q8(const int t0, const int C, __m256 *out, const uint8_t *P,
                                  int64_t nb, const uint8_t *X, int prefetch) {
    __m256 acc[CHUNK];
    for (int t = 0; t < C; t++) {
        acc[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++, P += 272, X += XI_BYTES) {
        if (prefetch) {
            for (int o = 0; o < 272; o += 64) {
                _mm_prefetch((const char *)P + (size_t)nb * 272 + o, _MM_HINT_T0);
            }
        }
        __m256i s[CHUNK];
        for (int k = 0; k < 8; k++) {
            const __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(P + 32 * k)),
                                               _mm256_set1_epi8((char)0x80));
            const __m256i u = _mm256_sign_epi8(w, w);
            for (int t = 0; t < C; t++) {
                const __m256i x = _mm256_sign_epi8(XIB(X, t0 + t, k), w);
                const __m256i p =
                    _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
                s[t] = k == 0 ? p : _mm256_add_epi32(s[t], p);
                KEEP(s[t]);
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + 256)));
        for (int t = 0; t < C; t++) {
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_mul_ps(dw, XID(X, t0 + t)),
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
    const int nc = (TT + CHUNK - 1) / CHUNK;
    #pragma GCC unroll 4 /* chunk sizes as compile-time constants */
    for (int c = 0; c < nc; c++) {
        const int t0 = c * TT / nc, C = (c + 1) * TT / nc - t0;
        if (f == V_Q8_0) {
            chunk_q8(t0, C, out, P, nb, X, c == 0);
        } else {
            chunk_nibbles(t0, C, out, P, nb, X, c == 0);
        }
    }
}

PACKED_TILE(sd_tile_packed_avx2, SD_Q_AVX2, packed8_dot_avx2, 16, PACKED_NARROW)

#endif /* SD_HAVE_X86_SIMD */
