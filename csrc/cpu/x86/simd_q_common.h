/* simd_q_common.h — block-unpacking helpers shared by the AVX2 and AVX512-VNNI quantized tiles,
 * and the AVX-512 tiles' 16-output store. Static inline with an AVX2 (the store: AVX-512F)
 * target: callable from (and inlined into) functions compiled for any superset of it. Include
 * only from x86-64 SIMD sources. */
#ifndef SD_SIMD_Q_COMMON_H
#define SD_SIMD_Q_COMMON_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define SD_Q_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SD_INLINE static inline __attribute__((always_inline))

/* An f16 scale stored at p (blocks are not aligned). */
SD_Q_AVX2 SD_INLINE float sd_q_f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0-15), then high (16-31). */
SD_Q_AVX2 SD_INLINE __m256i sd_q_nibbles(const uint8_t *qs) {
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    const __m128i m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

/* The 32 bits stored at p -> 32 bytes, byte j = 0x10 where bit j is set (the fifth bit of the
 * Q5 formats). */
SD_Q_AVX2 SD_INLINE __m256i sd_q_fifth_bits(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* y[0 .. 16) = (or, accumulating, y +=) v + bias (bias NULL: none): sixteen outputs of the
 * AVX-512 tiles, with the bits of the 8-lane tiles' stores (y + (v + bias)). */
#define SD_Q_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl")))
SD_Q_AVX512 SD_INLINE void sd_q_store16(float *y, __m512 v, const float *bias, int accumulate) {
    if (bias != NULL) {
        v = _mm512_add_ps(v, _mm512_loadu_ps(bias));
    }
    if (accumulate) {
        v = _mm512_add_ps(_mm512_loadu_ps(y), v);
    }
    _mm512_storeu_ps(y, v);
}

#endif /* SD_SIMD_Q_COMMON_H */
