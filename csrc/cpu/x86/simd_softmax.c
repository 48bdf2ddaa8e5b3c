/* simd_softmax.c — sampling's softmax and argmax over a row of logits (ops_cpu.h:
 * sd_softmax_exp, sd_argmax_f32) on AVX2 and AVX-512, with the portable twins' bits: the
 * exponentials are simd_exp.h's (sd_hd_expf's arithmetic lane for lane) and their sum goes into
 * the same eight double lanes in the same order. */
#include "cpu/x86/simd.h"

#ifdef SD_HAVE_X86_SIMD

#include "cpu/x86/simd_exp.h"

/* Eight lanes of double sums (lo: lanes 0-3, hi: 4-7) combined as sd_softmax_exp_ref does. */
SD_AVX2 static inline double lanes8_sum(__m256d lo, __m256d hi) {
    double l[8];
    _mm256_storeu_pd(l, lo);
    _mm256_storeu_pd(l + 4, hi);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* Eight floats added to the eight double lanes (lo: lanes 0-3, hi: 4-7). */
SD_AVX2 static inline void lanes8_add(__m256 v, __m256d *lo, __m256d *hi) {
    *lo = _mm256_add_pd(*lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    *hi = _mm256_add_pd(*hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

/* exp((x - mx) / t) of eight logits, added to the lanes of (lo, hi); past the row's end the
 * lanes load -inf, whose exponential, 0, leaves a sum as it is. */
SD_AVX2 static inline __attribute__((always_inline)) void
softmax_exp8(float *e, const float *x, int m, __m256 vmx, __m256 vt, __m256d *lo, __m256d *hi) {
    const __m256i lm = lanes_below(m);
    const __m256 v = m == 8 ? _mm256_loadu_ps(x)
                            : _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(x, lm),
                                               _mm256_castsi256_ps(lm));
    const __m256 y = exp256(_mm256_div_ps(_mm256_sub_ps(v, vmx), vt));
    if (m == 8) {
        _mm256_storeu_ps(e, y);
    } else {
        _mm256_maskstore_ps(e, lm, y);
    }
    lanes8_add(y, lo, hi);
}

SD_AVX2 double sd_softmax_exp_avx2(float *e, const float *x, int64_t n, float mx, float t) {
    const __m256 vmx = _mm256_set1_ps(mx), vt = _mm256_set1_ps(t);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        softmax_exp8(e + i, x + i, 8, vmx, vt, &lo, &hi);
    }
    if (i < n) {
        softmax_exp8(e + i, x + i, (int)(n - i), vmx, vt, &lo, &hi);
    }
    return lanes8_sum(lo, hi);
}

SD_AVX2 double sd_sum_f32_avx2(const float *x, int64_t n) {
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        lanes8_add(v, &lo, &hi);
    }
    if (i < n) { /* the tail's lanes past the end add +0, which leaves a sum as it is */
        const __m256 v = _mm256_maskload_ps(x + i, lanes_below((int)(n - i)));
        lanes8_add(v, &lo, &hi);
    }
    return lanes8_sum(lo, hi);
}

SD_AVX2 int64_t sd_argmax_f32_avx2(const float *x, int64_t n) {
    if (n < 2 || x[0] != x[0]) {
        return 0;
    }
    /* the largest value (maxps keeps its second operand when the first is a NaN), then the
     * first index holding it */
    __m256 m0 = _mm256_set1_ps(x[0]), m1 = m0, m2 = m0, m3 = m0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(x + i + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(x + i + 24), m3);
    }
    m0 = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    float l[8];
    _mm256_storeu_ps(l, m0);
    float mx = l[0];
    for (int j = 1; j < 8; j++) {
        mx = l[j] > mx ? l[j] : mx;
    }
    for (; i < n; i++) {
        mx = x[i] > mx ? x[i] : mx;
    }
    const __m256 vmx = _mm256_set1_ps(mx);
    for (i = 0; i + 8 <= n; i += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vmx, _CMP_EQ_OQ));
        if (hit != 0) {
            return i + __builtin_ctz((unsigned)hit);
        }
    }
    for (; i < n; i++) {
        if (x[i] == mx) {
            return i;
        }
    }
    return 0;
}

/* sd_softmax_exp_avx2 sixteen logits at a time: each half of a block goes into the same eight
 * lanes in order of i (low half, then high), so the sum has the same bits. */
SD_AVX512 double sd_softmax_exp_avx512(float *e, const float *x, int64_t n, float mx, float t) {
    const __m512 vmx = _mm512_set1_ps(mx), vt = _mm512_set1_ps(t);
    __m512d acc = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 y = exp512(_mm512_div_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmx), vt));
        _mm512_storeu_ps(e + i, y);
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(y)));
        acc = _mm512_add_pd(
            acc, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1))));
    }
    __m256d lo = _mm512_castpd512_pd256(acc), hi = _mm512_extractf64x4_pd(acc, 1);
    const __m256 vmx8 = _mm256_set1_ps(mx), vt8 = _mm256_set1_ps(t);
    for (; i < n; i += 8) {
        softmax_exp8(e + i, x + i, n - i < 8 ? (int)(n - i) : 8, vmx8, vt8, &lo, &hi);
    }
    return lanes8_sum(lo, hi);
}

#endif /* SD_HAVE_X86_SIMD */
