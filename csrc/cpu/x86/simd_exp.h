/* simd_exp.h — the vector exponential of the x86 kernels (SwiGLU, attention's softmax, sampling's
 * softmax), eight lanes on AVX2 and sixteen on AVX-512 with the same bits per lane, and the
 * masks of a row's tail. Included by the x86 kernel files only (util/hd.h's sd_hd_expf is the
 * scalar statement of the same arithmetic). */
#ifndef SD_SIMD_EXP_H
#define SD_SIMD_EXP_H

#include <immintrin.h>
#include <math.h>

#define SD_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SD_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl")))

/* exp(x) = 2^n * e^r with n = round(x / ln 2) and |r| <= ln 2 / 2, e^r by its Taylor series to
 * degree 7 (truncation error below 3e-9 relative), ln 2 split in two parts so r is exact to
 * float precision: within 2 ulp of expf over the range. Below -87.33 (where 2^n leaves the
 * normal range) the result is 0, above 88.72 infinity; -inf gives 0 (masked scores). */
/* y = 2^n e^r for r = xc - n ln 2 (ln 2 in two parts), in vectors of W bits (256, 512): one
 * definition, so every width computes the same bits per lane. 2^n for n in [-126, 128]: 2^128
 * overflows the exponent field, so it scales by 2^(n-1), then by 2. */
#define SD_EXP_CORE(W, y, n, xc)                                                                   \
    do {                                                                                           \
        __typeof__(y) r_ = _mm##W##_fnmadd_ps(n, _mm##W##_set1_ps(0.693145751953125f), xc);        \
        r_ = _mm##W##_fnmadd_ps(n, _mm##W##_set1_ps(1.428606765330187e-06f), r_);                  \
        y = _mm##W##_set1_ps(1.0f / 5040.0f);                                                      \
        y = _mm##W##_fmadd_ps(y, r_, _mm##W##_set1_ps(1.0f / 720.0f));                             \
        y = _mm##W##_fmadd_ps(y, r_, _mm##W##_set1_ps(1.0f / 120.0f));                             \
        y = _mm##W##_fmadd_ps(y, r_, _mm##W##_set1_ps(1.0f / 24.0f));                              \
        y = _mm##W##_fmadd_ps(y, r_, _mm##W##_set1_ps(1.0f / 6.0f));                               \
        y = _mm##W##_fmadd_ps(y, r_, _mm##W##_set1_ps(0.5f));                                      \
        y = _mm##W##_fmadd_ps(y, r_, _mm##W##_set1_ps(1.0f));                                      \
        y = _mm##W##_fmadd_ps(y, r_, _mm##W##_set1_ps(1.0f));                                      \
        const __typeof__(_mm##W##_cvtps_epi32(n)) e_ =                                             \
            _mm##W##_cvtps_epi32(_mm##W##_sub_ps(n, _mm##W##_set1_ps(1.0f)));                      \
        const __typeof__(y) half_scale_ = _mm##W##_castsi##W##_ps(                                 \
            _mm##W##_slli_epi32(_mm##W##_add_epi32(e_, _mm##W##_set1_epi32(127)), 23));            \
        y = _mm##W##_mul_ps(_mm##W##_mul_ps(y, half_scale_), _mm##W##_set1_ps(2.0f));              \
    } while (0)

SD_AVX2 static inline __m256 exp256(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33f), hi = _mm256_set1_ps(88.72f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ), over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
    const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 y;
    SD_EXP_CORE(256, y, n, xc);
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), under);
    return _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), over);
}

/* Lanes i < n of a vector (n in 1..7): the mask of maskload/maskstore for a row's tail. */
SD_AVX2 static inline __m256i lanes_below(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* exp256 on sixteen lanes: the same operations, so each lane has exp256's bits. */
SD_AVX512 static inline __m512 exp512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.33f), hi = _mm512_set1_ps(88.72f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    const __mmask16 over = _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ);
    const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 y;
    SD_EXP_CORE(512, y, n, xc);
    y = _mm512_mask_blend_ps(under, y, _mm512_setzero_ps());
    return _mm512_mask_blend_ps(over, y, _mm512_set1_ps(INFINITY));
}

#endif /* SD_SIMD_EXP_H */
