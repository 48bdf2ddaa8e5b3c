/* quant.c — the type table: geometry of ggml block formats (for validating files) and the
 * scalar row kernels of F32, F16 and BF16, replaced by their AVX2 twins when the CPU has them.
 * Quantized block formats get their kernels in this table too; until then their entries carry
 * geometry only and the loader reports them as unsupported. */
#include "quant.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

/* ---- scalar conversions ---------------------------------------------------------------------- */

float sd_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400u) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

uint16_t sd_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) { /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
    }
    if (absx >= 0x477ff000u) { /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        float a;
        memcpy(&a, &absx, sizeof(a));
        /* 2^-24 is the subnormal step; rint rounds half to even */
        return (uint16_t)(sign | (uint32_t)rintf(a * 16777216.0f));
    }
    uint32_t mant = absx & 0x7fffffu;
    uint32_t exp = (absx >> 23) - 127 + 15;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) {
        h++;
    }
    return (uint16_t)(sign | h);
}

float sd_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* ---- scalar row kernels ---------------------------------------------------------------------- */

static void f32_to_float(float *dst, const void *src, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void f16_to_float_scalar(float *dst, const void *src, int64_t n) {
    const uint16_t *s = (const uint16_t *)src;
    for (int64_t i = 0; i < n; i++) {
        dst[i] = sd_f16_to_f32(s[i]);
    }
}

static void bf16_to_float_scalar(float *dst, const void *src, int64_t n) {
    const uint16_t *s = (const uint16_t *)src;
    for (int64_t i = 0; i < n; i++) {
        dst[i] = sd_bf16_to_f32(s[i]);
    }
}

/* Eight partial sums keep the scalar path's rounding close to the SIMD path's. */
static float dot_f32_scalar(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; j++) {
            acc[j] += a[i + j] * b[i + j];
        }
    }
    float s = 0.0f;
    for (; i < n; i++) {
        s += a[i] * b[i];
    }
    for (int j = 0; j < 8; j++) {
        s += acc[j];
    }
    return s;
}

static float (*g_dot_f32)(const float *, const float *, int64_t) = dot_f32_scalar;

static float dot_f32_row(const void *w, const float *x, int64_t n) {
    return g_dot_f32((const float *)w, x, n);
}

static float dot_f16_scalar(const void *w, const float *x, int64_t n) {
    const uint16_t *h = (const uint16_t *)w;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        s += sd_f16_to_f32(h[i]) * x[i];
    }
    return s;
}

static float dot_bf16_scalar(const void *w, const float *x, int64_t n) {
    const uint16_t *h = (const uint16_t *)w;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        s += sd_bf16_to_f32(h[i]) * x[i];
    }
    return s;
}

static void axpy_f32_scalar(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        y[i] += a * x[i];
    }
}

/* The scalar tile: one dot product per (row, token). */
static inline void tile_generic(sd_dot_fn dot, float *y, int64_t ldy, const void *w,
                                size_t row_bytes, int64_t nrows, const float *x, int64_t ldx, int T,
                                int64_t n, const float *bias, int accumulate) {
    for (int64_t r = 0; r < nrows; r++) {
        const void *row = (const unsigned char *)w + (size_t)r * row_bytes;
        for (int t = 0; t < T; t++) {
            float v = dot(row, x + (size_t)t * (size_t)ldx, n) + (bias != NULL ? bias[r] : 0.0f);
            float *dst = &y[(size_t)t * (size_t)ldy + (size_t)r];
            *dst = accumulate ? *dst + v : v;
        }
    }
}

/* One scalar tile and (on x86-64) one AVX2 tile per type, with the tile_fn signature. */
#define SD_DEFINE_TILES(suffix, scalar_dot, type_id)                                               \
    static void tile_##suffix(float *y, int64_t ldy, const void *w, size_t row_bytes,              \
                              int64_t nrows, const float *x, int64_t ldx, int T, int64_t n,        \
                              const float *bias, int accumulate) {                                 \
        tile_generic(scalar_dot, y, ldy, w, row_bytes, nrows, x, ldx, T, n, bias, accumulate);     \
    }                                                                                              \
    SD_DEFINE_AVX2_TILE(suffix, type_id)

#ifdef SD_HAVE_X86_SIMD
#define SD_DEFINE_AVX2_TILE(suffix, type_id)                                                       \
    static void tile_##suffix##_avx2(float *y, int64_t ldy, const void *w, size_t row_bytes,       \
                                     int64_t nrows, const float *x, int64_t ldx, int T, int64_t n, \
                                     const float *bias, int accumulate) {                          \
        sd_matmul_tile_avx2(type_id, y, ldy, w, row_bytes, nrows, x, ldx, T, n, bias, accumulate); \
    }
#else
#define SD_DEFINE_AVX2_TILE(suffix, type_id)
#endif

SD_DEFINE_TILES(f32, dot_f32_row, SD_TYPE_F32)
SD_DEFINE_TILES(f16, dot_f16_scalar, SD_TYPE_F16)
SD_DEFINE_TILES(bf16, dot_bf16_scalar, SD_TYPE_BF16)

/* ---- the table ------------------------------------------------------------------------------- */

/* A type whose geometry is known (files using it validate) but whose arithmetic is not. */
#define GEOM(name_, block_, size_)                                                                 \
    { .name = name_, .block_size = block_, .type_size = size_ }

/* Indexed by ggml type id. Geometry from ggml's block definitions (ggml-common.h). */
static sd_type_traits g_types[40] = {
    [SD_TYPE_F32] = {"F32", 1, 4, f32_to_float, dot_f32_row, tile_f32},
    [SD_TYPE_F16] = {"F16", 1, 2, f16_to_float_scalar, dot_f16_scalar, tile_f16},
    [SD_TYPE_Q4_0] = GEOM("Q4_0", 32, 18),
    [SD_TYPE_Q4_1] = GEOM("Q4_1", 32, 20),
    [SD_TYPE_Q5_0] = GEOM("Q5_0", 32, 22),
    [SD_TYPE_Q5_1] = GEOM("Q5_1", 32, 24),
    [SD_TYPE_Q8_0] = GEOM("Q8_0", 32, 34),
    [9] = GEOM("Q8_1", 32, 36),
    [10] = GEOM("Q2_K", 256, 84),
    [11] = GEOM("Q3_K", 256, 110),
    [SD_TYPE_Q4_K] = GEOM("Q4_K", 256, 144),
    [SD_TYPE_Q5_K] = GEOM("Q5_K", 256, 176),
    [SD_TYPE_Q6_K] = GEOM("Q6_K", 256, 210),
    [15] = GEOM("Q8_K", 256, 292),
    [24] = GEOM("I8", 1, 1),
    [25] = GEOM("I16", 1, 2),
    [26] = GEOM("I32", 1, 4),
    [27] = GEOM("I64", 1, 8),
    [28] = GEOM("F64", 1, 8),
    [SD_TYPE_BF16] = {"BF16", 1, 2, bf16_to_float_scalar, dot_bf16_scalar, tile_bf16},
};

static void (*g_axpy_f32)(float *, float, const float *, int64_t) = axpy_f32_scalar;
static const char *g_simd_name = "scalar";

static pthread_once_t g_kernels_once = PTHREAD_ONCE_INIT;

static void kernels_init_once(void) {
#ifdef SD_HAVE_X86_SIMD
    /* SPECDEC_SIMD=scalar keeps the portable kernels: the tests run both paths this way. */
    const char *force = getenv("SPECDEC_SIMD");
    int want_simd = force == NULL || strcmp(force, "scalar") != 0;
    if (want_simd && sd_cpu_has_avx2_fma_f16c()) {
        g_types[SD_TYPE_F16].to_float = sd_f16_to_f32_avx2;
        g_types[SD_TYPE_BF16].to_float = sd_bf16_to_f32_avx2;
        g_types[SD_TYPE_F32].tile = tile_f32_avx2;
        g_types[SD_TYPE_F16].tile = tile_f16_avx2;
        g_types[SD_TYPE_BF16].tile = tile_bf16_avx2;
        g_dot_f32 = sd_dot_f32_avx2;
        g_axpy_f32 = sd_axpy_f32_avx2;
        g_simd_name = "avx2+fma+f16c";
    }
#endif
}

void sd_kernels_init(void) {
    pthread_once(&g_kernels_once, kernels_init_once);
}

const char *sd_simd_name(void) {
    sd_kernels_init();
    return g_simd_name;
}

const sd_type_traits *sd_type_get(int type) {
    if (type < 0 || type >= (int)(sizeof(g_types) / sizeof(g_types[0])) ||
        g_types[type].name == NULL) {
        return NULL;
    }
    return &g_types[type];
}

size_t sd_row_bytes(int type, int64_t n) {
    const sd_type_traits *t = sd_type_get(type);
    if (t == NULL || n % t->block_size != 0) {
        return 0;
    }
    return (size_t)(n / t->block_size) * (size_t)t->type_size;
}

const char *sd_type_name(int type) {
    static __thread char buf[24];
    const sd_type_traits *t = sd_type_get(type);
    if (t != NULL) {
        return t->name;
    }
    snprintf(buf, sizeof(buf), "type#%d", type);
    return buf;
}

float sd_dot_f32(const float *a, const float *b, int64_t n) {
    return g_dot_f32(a, b, n);
}

void sd_axpy_f32(float *y, float a, const float *x, int64_t n) {
    g_axpy_f32(y, a, x, n);
}
