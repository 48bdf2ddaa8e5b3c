/* simd_avx2.c — AVX2/FMA/F16C twins of the scalar row kernels in quant.c.
 * Each function carries its own target attribute, so this file builds with the default flags
 * and is only called after sd_cpu_has_avx2_fma_f16c() said yes. */
#include "simd.h"

#ifdef SD_HAVE_X86_SIMD

#include <cpuid.h>
#include <immintrin.h>
#include <string.h>

#define SD_AVX2 __attribute__((target("avx2,fma,f16c")))

int sd_cpu_has_avx2_fma_f16c(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) {
        return 0;
    }
    const int f16c = (c >> 29) & 1u;
    /* avx2 and fma as the compiler runtime sees them (it also checks the OS saves the
     * AVX registers) */
    __builtin_cpu_init();
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
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

/* ---- batched rows x tokens tile (the verify batch) ------------------------------------------
 * y[t * ldy] (= or +=) dot(w, x_t) + bias for one weight row and TT tokens at once: each
 * weight vector is loaded and widened once for TT tokens and the accumulators stay in
 * registers. TT and the type (a ggml id) become compile-time constants when tile_kernel is
 * inlined into tile_impl's calls. */

SD_AVX2 static inline __m256 load_w8(int type, const void *w, int64_t i) {
    if (type == 1) { /* F16 */
        return load_f16x8((const uint16_t *)w + i);
    }
    if (type == 30) { /* BF16 */
        return load_bf16x8((const uint16_t *)w + i);
    }
    return _mm256_loadu_ps((const float *)w + i);
}

SD_AVX2 static inline float load_w1(int type, const void *w, int64_t i) {
    if (type == 1) {
        return _cvtsh_ss(((const uint16_t *)w)[i]);
    }
    if (type == 30) {
        uint32_t bits = (uint32_t)((const uint16_t *)w)[i] << 16;
        float f;
        memcpy(&f, &bits, sizeof(f));
        return f;
    }
    return ((const float *)w)[i];
}

SD_AVX2 static inline __attribute__((always_inline)) void
tile_kernel(const int TT, int type, float *y, int64_t ldy, const unsigned char *w, const float *x,
            int64_t ldx, int64_t n, float bias, int accumulate) {
    /* Two accumulator sets (even and odd 8-element steps) when few tokens leave the FMA
     * latency exposed; one set otherwise. */
    const int S = TT <= 2 ? 2 : 1;
    __m256 acc[2][4];
    for (int k = 0; k < S; k++) {
        for (int t = 0; t < TT; t++) {
            acc[k][t] = _mm256_setzero_ps();
        }
    }
    int64_t i = 0;
    for (; i + 8 * S <= n; i += 8 * S) {
        for (int k = 0; k < S; k++) {
            __m256 wv = load_w8(type, w, i + 8 * k);
            for (int t = 0; t < TT; t++) {
                __m256 xv = _mm256_loadu_ps(x + (size_t)t * (size_t)ldx + i + 8 * k);
                acc[k][t] = _mm256_fmadd_ps(wv, xv, acc[k][t]);
            }
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m256 wv = load_w8(type, w, i);
        for (int t = 0; t < TT; t++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)t * (size_t)ldx + i);
            acc[0][t] = _mm256_fmadd_ps(wv, xv, acc[0][t]);
        }
    }
    for (int t = 0; t < TT; t++) {
        __m256 sum = S == 2 ? _mm256_add_ps(acc[0][t], acc[1][t]) : acc[0][t];
        float v = hsum256(sum);
        for (int64_t k = i; k < n; k++) {
            v += load_w1(type, w, k) * x[(size_t)t * (size_t)ldx + k];
        }
        v += bias;
        float *dst = &y[(size_t)t * (size_t)ldy];
        *dst = accumulate ? *dst + v : v;
    }
}

/* Rows one after the other, so the weights stream through memory in file order (several rows
 * in flight defeat the hardware prefetcher); each row serves the tokens 4 at a time. Long
 * batches (prefill) go in blocks of 16 tokens whose activations stay in L1, the rows of this
 * call coming again from L2 for each block. */
SD_AVX2 static inline __attribute__((always_inline)) void
tile_impl(const int type, float *y, int64_t ldy, const void *w, size_t row_bytes, int64_t nrows,
          const float *x, int64_t ldx, int T, int64_t n, const float *bias, int accumulate) {
    for (int t0 = 0; t0 < T; t0 += 16) {
        const int t1 = T - t0 < 16 ? T : t0 + 16;
        for (int64_t r = 0; r < nrows; r++) {
            const unsigned char *wr = (const unsigned char *)w + (size_t)r * row_bytes;
            const float b = bias != NULL ? bias[r] : 0.0f;
            int t = t0;
            for (; t + 4 <= t1; t += 4) {
                tile_kernel(4, type, y + (size_t)t * (size_t)ldy + r, ldy, wr,
                            x + (size_t)t * (size_t)ldx, ldx, n, b, accumulate);
            }
            float *yt = y + (size_t)t * (size_t)ldy + r;
            const float *xt = x + (size_t)t * (size_t)ldx;
            switch (t1 - t) {
            case 3: tile_kernel(3, type, yt, ldy, wr, xt, ldx, n, b, accumulate); break;
            case 2: tile_kernel(2, type, yt, ldy, wr, xt, ldx, n, b, accumulate); break;
            case 1: tile_kernel(1, type, yt, ldy, wr, xt, ldx, n, b, accumulate); break;
            default: break;
            }
        }
    }
}

/* The weight type becomes a constant too, so the inner loops carry no type test. */
SD_AVX2 void sd_matmul_tile_avx2(int type, float *y, int64_t ldy, const void *w, size_t row_bytes,
                                 int64_t nrows, const float *x, int64_t ldx, int T, int64_t n,
                                 const float *bias, int accumulate) {
    switch (type) {
    case 1: tile_impl(1, y, ldy, w, row_bytes, nrows, x, ldx, T, n, bias, accumulate); break;
    case 30: tile_impl(30, y, ldy, w, row_bytes, nrows, x, ldx, T, n, bias, accumulate); break;
    default: tile_impl(0, y, ldy, w, row_bytes, nrows, x, ldx, T, n, bias, accumulate); break;
    }
}

#endif /* SD_HAVE_X86_SIMD */
