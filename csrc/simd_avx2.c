/* simd_avx2.c — AVX2/FMA/F16C twins of the scalar row kernels in quant.c.
 * Each function carries its own target attribute, so this file builds with the default flags
 * and is only called after sd_cpu_has_avx2_fma_f16c() said yes. */
#include "simd.h"

#ifdef SD_HAVE_X86_SIMD

#include <immintrin.h>
#include <string.h>

#define SD_AVX2 __attribute__((target("avx2,fma,f16c")))

int sd_cpu_has_avx2_fma_f16c(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}

SD_AVX2 static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehdup_ps(lo);
    lo = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, lo);
    lo = _mm_add_ss(lo, sh);
    return _mm_cvtss_f32(lo);
}

SD_AVX2 static inline __m256 load_f16x8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

SD_AVX2 static inline __m256 load_bf16x8(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

SD_AVX2 float sd_dot_f32_avx2(const float *a, const float *b, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps();
    __m256 acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    }
    float s = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) {
        s += a[i] * b[i];
    }
    return s;
}

SD_AVX2 float sd_dot_f16_avx2(const void *w, const float *x, int64_t n) {
    const uint16_t *h = (const uint16_t *)w;
    __m256 acc0 = _mm256_setzero_ps();
    __m256 acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(load_f16x8(h + i), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(load_f16x8(h + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) {
        acc0 = _mm256_fmadd_ps(load_f16x8(h + i), _mm256_loadu_ps(x + i), acc0);
    }
    float s = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) {
        s += _cvtsh_ss(h[i]) * x[i];
    }
    return s;
}

SD_AVX2 float sd_dot_bf16_avx2(const void *w, const float *x, int64_t n) {
    const uint16_t *h = (const uint16_t *)w;
    __m256 acc0 = _mm256_setzero_ps();
    __m256 acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(load_bf16x8(h + i), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(load_bf16x8(h + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) {
        acc0 = _mm256_fmadd_ps(load_bf16x8(h + i), _mm256_loadu_ps(x + i), acc0);
    }
    float s = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) {
        uint32_t bits = (uint32_t)h[i] << 16;
        float f;
        memcpy(&f, &bits, sizeof(f));
        s += f * x[i];
    }
    return s;
}

SD_AVX2 void sd_f16_to_f32_avx2(float *dst, const void *src, int64_t n) {
    const uint16_t *h = (const uint16_t *)src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i, load_f16x8(h + i));
    }
    for (; i < n; i++) {
        dst[i] = _cvtsh_ss(h[i]);
    }
}

SD_AVX2 void sd_bf16_to_f32_avx2(float *dst, const void *src, int64_t n) {
    const uint16_t *h = (const uint16_t *)src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i, load_bf16x8(h + i));
    }
    for (; i < n; i++) {
        uint32_t bits = (uint32_t)h[i] << 16;
        memcpy(dst + i, &bits, sizeof(float));
    }
}

SD_AVX2 void sd_axpy_f32_avx2(float *y, float a, const float *x, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++) {
        y[i] += a * x[i];
    }
}

/* One weight row against four activation rows: each weight load feeds four FMAs. */
SD_AVX2 void sd_dot4_f32_avx2(float y[4], const float *w, const float *x, int64_t ldx, int64_t n) {
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 vw = _mm256_loadu_ps(w + i);
        a0 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(x0 + i), a0);
        a1 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(x1 + i), a1);
        a2 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(x2 + i), a2);
        a3 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(x3 + i), a3);
    }
    float s0 = hsum256(a0), s1 = hsum256(a1), s2 = hsum256(a2), s3 = hsum256(a3);
    for (; i < n; i++) {
        s0 += w[i] * x0[i];
        s1 += w[i] * x1[i];
        s2 += w[i] * x2[i];
        s3 += w[i] * x3[i];
    }
    y[0] = s0;
    y[1] = s1;
    y[2] = s2;
    y[3] = s3;
}

#endif /* SD_HAVE_X86_SIMD */
