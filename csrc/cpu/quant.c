/* quant.c — the kernel table of the types the CPU computes with: the portable row kernels of
 * F32, F16 and BF16 and, from quant_blocks.c, of the quantized block formats, keyed by ggml type
 * id. cpu/dispatch.c replaces entries with this CPU's SIMD kernels; the types' geometry comes
 * from format/types.c. */
#include "cpu/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/hd.h"
#include "cpu/quant_blocks.h"
#include "format/types.h"

/* ---- scalar conversions ---------------------------------------------------------------------- */

float sd_f16_to_f32(uint16_t h) {
    return sd_hd_f16_to_f32(h);
}

uint16_t sd_f32_to_f16(float f) {
    return sd_hd_f32_to_f16(f);
}

float sd_bf16_to_f32(uint16_t h) {
    return sd_hd_bf16_to_f32(h);
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

float sd_dot_f32_ref(const float *a, const float *b, int64_t n) {
    return dot_f32_scalar(a, b, n);
}

/* the F32 row dot of the portable tile: this CPU's (sd_dot_f32 is dispatched) */
static float dot_f32_row(const void *w, const float *x, int64_t n) {
    return sd_dot_f32((const float *)w, x, n);
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

void sd_axpy_f32_ref(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        y[i] += a * x[i];
    }
}

/* The portable tile of float types: one dot product per (row, token). */
static inline void tile_float(sd_dot_fn dot, float *y, int64_t ldy, const void *w, size_t row_bytes,
                              int64_t nrows, const sd_acts *a, int T, int64_t n, const float *bias,
                              int accumulate) {
    for (int64_t r = 0; r < nrows; r++) {
        const void *row = (const unsigned char *)w + (size_t)r * row_bytes;
        for (int t = 0; t < T; t++) {
            float v = dot(row, a->x + (size_t)t * (size_t)a->ldx, n);
            v += bias != NULL ? bias[r] : 0.0f;
            float *dst = &y[(size_t)t * (size_t)ldy + (size_t)r];
            *dst = accumulate ? *dst + v : v;
        }
    }
}

#define SD_TILE_ARGS                                                                               \
    float *y, int64_t ldy, const void *w, size_t row_bytes, int64_t nrows, const sd_acts *a,       \
        int T, int64_t n, const float *bias, int accumulate
#define SD_TILE_PASS y, ldy, w, row_bytes, nrows, a, T, n, bias, accumulate

/* One portable tile per float type with the sd_tile_fn signature. */
#define SD_FLOAT_TILE(suffix, dot)                                                                 \
    static void tile_##suffix(SD_TILE_ARGS) {                                                      \
        tile_float(dot, SD_TILE_PASS);                                                             \
    }
SD_FLOAT_TILE(f32, dot_f32_row)
SD_FLOAT_TILE(f16, dot_f16_scalar)
SD_FLOAT_TILE(bf16, dot_bf16_scalar)

/* ---- the table ------------------------------------------------------------------------------- */

/* A quantized type's portable kernels (quant_blocks.c). */
#define QUANT(sfx)                                                                                 \
    { .to_float = sd_to_float_##sfx, .tile = sd_tile_##sfx, .dot_q8 = sd_dot_q8_##sfx }

/* Indexed by ggml type id: the portable kernels; cpu/dispatch.c puts this CPU's SIMD kernels in
 * their place. The geometry is format/types.c's, copied in once; a type with geometry and no
 * kernels validates in files and is refused by the loader. */
static sd_type_traits g_types[40] = {
    [SD_TYPE_F32] = {.to_float = f32_to_float, .tile = tile_f32, .dot = dot_f32_row},
    [SD_TYPE_F16] = {.to_float = f16_to_float_scalar, .tile = tile_f16, .dot = dot_f16_scalar},
    [SD_TYPE_BF16] = {.to_float = bf16_to_float_scalar, .tile = tile_bf16, .dot = dot_bf16_scalar},
    [SD_TYPE_Q4_0] = QUANT(q4_0),
    [SD_TYPE_Q4_1] = QUANT(q4_1),
    [SD_TYPE_Q5_0] = QUANT(q5_0),
    [SD_TYPE_Q5_1] = QUANT(q5_1),
    [SD_TYPE_Q8_0] = QUANT(q8_0),
    [SD_TYPE_Q4_K] = QUANT(q4_K),
    [SD_TYPE_Q5_K] = QUANT(q5_K),
    [SD_TYPE_Q6_K] = QUANT(q6_K),
};

static pthread_once_t g_geometry_once = PTHREAD_ONCE_INIT;

static void geometry_once(void) {
    for (int t = 0; t < (int)(sizeof(g_types) / sizeof(g_types[0])); t++) {
        const sd_type_info *info = sd_type_info_get(t);
        if (info != NULL) {
            g_types[t].name = info->name;
            g_types[t].block_size = info->block_size;
            g_types[t].type_size = info->type_size;
        }
    }
}

sd_type_traits *sd_type_slot(int type) {
    pthread_once(&g_geometry_once, geometry_once);
    if (type < 0 || type >= (int)(sizeof(g_types) / sizeof(g_types[0])) ||
        g_types[type].name == NULL) {
        return NULL;
    }
    return &g_types[type];
}

const sd_type_traits *sd_type_get(int type) {
    return sd_type_slot(type);
}

/* The portable tile of each type, whatever the table holds after SIMD selection. */
sd_tile_fn sd_portable_tile(int type) {
    switch (type) {
    case SD_TYPE_F32: return tile_f32;
    case SD_TYPE_F16: return tile_f16;
    case SD_TYPE_BF16: return tile_bf16;
    case SD_TYPE_Q4_0: return sd_tile_q4_0;
    case SD_TYPE_Q4_1: return sd_tile_q4_1;
    case SD_TYPE_Q5_0: return sd_tile_q5_0;
    case SD_TYPE_Q5_1: return sd_tile_q5_1;
    case SD_TYPE_Q8_0: return sd_tile_q8_0;
    case SD_TYPE_Q4_K: return sd_tile_q4_K;
    case SD_TYPE_Q5_K: return sd_tile_q5_K;
    case SD_TYPE_Q6_K: return sd_tile_q6_K;
    default: return NULL;
    }
}

void sd_q8_scatter_scalars(float *xt, const unsigned char *row, int t, int64_t n) {
    const int64_t nb = n / 32;
    const sd_q8_row r = sd_q8_row_at(row, n, 0);
    float *dst = xt + (size_t)(t / 16) * (size_t)nb * 64 + SD_Q8_XT_D(t);
    for (int64_t b = 0; b < nb; b++, dst += 64) {
        dst[0] = r.d[b];
        dst[4] = r.s[b];
        dst[8] = r.e[b];
    }
}

void sd_f32_to_f16_row_ref(uint16_t *dst, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float f = x[i] > 65504.0f ? 65504.0f : x[i] < -65504.0f ? -65504.0f : x[i];
        dst[i] = sd_f32_to_f16(f);
    }
}
