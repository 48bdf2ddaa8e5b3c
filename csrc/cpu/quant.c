/* quant.c — the type table: geometry of ggml block formats (for validating files) and the
 * scalar row kernels of F32, F16 and BF16, replaced by their AVX2 twins when the CPU has them.
 * Quantized block formats get their kernels in this table too; until then their entries carry
 * geometry only and the loader reports them as unsupported. */
#include "cpu/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/hd.h"
#include "cpu/ops_cpu.h"
#include "cpu/quant_blocks.h"
#include "util/status.h"
#include "cpu/x86/simd.h"

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

#ifdef SD_HAVE_X86_SIMD
static void tile_float_avx2(SD_TILE_ARGS, int type) {
    sd_matmul_tile_avx2(type, y, ldy, w, row_bytes, nrows, a->x, a->ldx, T, n, bias, accumulate);
}
static void tile_f32_avx2(SD_TILE_ARGS) {
    tile_float_avx2(SD_TILE_PASS, SD_TYPE_F32);
}
static void tile_f16_avx2(SD_TILE_ARGS) {
    tile_float_avx2(SD_TILE_PASS, SD_TYPE_F16);
}
static void tile_bf16_avx2(SD_TILE_ARGS) {
    tile_float_avx2(SD_TILE_PASS, SD_TYPE_BF16);
}
#endif

/* ---- the table ------------------------------------------------------------------------------- */

/* A quantized type: geometry, and its portable kernels (quant_blocks.c). */
#define QUANT(name_, block_, size_, sfx)                                                           \
    {                                                                                              \
        .name = name_, .block_size = block_, .type_size = size_, .to_float = sd_to_float_##sfx,    \
        .tile = sd_tile_##sfx, .dot_q8 = sd_dot_q8_##sfx                                           \
    }

/* A type whose geometry is known (files using it validate) but whose arithmetic is not. */
#define GEOM(name_, block_, size_)                                                                 \
    { .name = name_, .block_size = block_, .type_size = size_ }

/* Indexed by ggml type id. Geometry from ggml's block definitions (ggml-common.h). */
static sd_type_traits g_types[40] = {
    [SD_TYPE_F32] = {"F32", 1, 4, f32_to_float, tile_f32, dot_f32_row, NULL},
    [SD_TYPE_F16] = {"F16", 1, 2, f16_to_float_scalar, tile_f16, dot_f16_scalar, NULL},
    [SD_TYPE_BF16] = {"BF16", 1, 2, bf16_to_float_scalar, tile_bf16, dot_bf16_scalar, NULL},
    [SD_TYPE_Q4_0] = QUANT("Q4_0", 32, 18, q4_0),
    [SD_TYPE_Q4_1] = QUANT("Q4_1", 32, 20, q4_1),
    [SD_TYPE_Q5_0] = QUANT("Q5_0", 32, 22, q5_0),
    [SD_TYPE_Q5_1] = QUANT("Q5_1", 32, 24, q5_1),
    [SD_TYPE_Q8_0] = QUANT("Q8_0", 32, 34, q8_0),
    [SD_TYPE_Q4_K] = QUANT("Q4_K", 256, 144, q4_K),
    [SD_TYPE_Q5_K] = QUANT("Q5_K", 256, 176, q5_K),
    [SD_TYPE_Q6_K] = QUANT("Q6_K", 256, 210, q6_K),
    [9] = GEOM("Q8_1", 32, 36),
    [10] = GEOM("Q2_K", 256, 84),
    [11] = GEOM("Q3_K", 256, 110),
    [15] = GEOM("Q8_K", 256, 292),
    [24] = GEOM("I8", 1, 1),
    [25] = GEOM("I16", 1, 2),
    [26] = GEOM("I32", 1, 4),
    [27] = GEOM("I64", 1, 8),
    [28] = GEOM("F64", 1, 8),
};

static int g_repack = 0; /* the repacked tiles are selected: 1 AVX2, 2 AVX512-VNNI, 3 AMX */

static void (*g_axpy_f32)(float *, float, const float *, int64_t) = axpy_f32_scalar;
static sd_quantize_q8_fn g_quantize_q8 = sd_quantize_q8_ref;
static void (*g_swiglu)(float *, const float *, const float *, int64_t) = sd_swiglu_ref;
static void (*g_attend)(const sd_attn_group *, const void *, const void *, int, int, int, float,
                        float *) = sd_attend_ref;
static void (*g_to_f16)(uint16_t *, const float *, int64_t) = sd_f32_to_f16_row_ref;
static const char *g_simd_name = "scalar";

static pthread_once_t g_kernels_once = PTHREAD_ONCE_INIT;

static void kernels_init_once(void) {
#ifdef SD_HAVE_X86_SIMD
    /* SPECDEC_SIMD=scalar keeps the portable kernels, SPECDEC_SIMD=avx2 stops at AVX2,
     * SPECDEC_SIMD=avx512vnni before AMX: the tests run every path this way. */
    const char *force = getenv("SPECDEC_SIMD");
    int want_simd = force == NULL || strcmp(force, "scalar") != 0;
    if (want_simd && sd_cpu_has_avx2_fma_f16c()) {
        g_types[SD_TYPE_F16].to_float = sd_f16_to_f32_avx2;
        g_types[SD_TYPE_BF16].to_float = sd_bf16_to_f32_avx2;
        g_types[SD_TYPE_F32].tile = tile_f32_avx2;
        g_types[SD_TYPE_F16].tile = tile_f16_avx2;
        g_types[SD_TYPE_BF16].tile = tile_bf16_avx2;
        g_types[SD_TYPE_Q4_0].tile = sd_tile_q4_0_avx2;
        g_types[SD_TYPE_Q4_1].tile = sd_tile_q4_1_avx2;
        g_types[SD_TYPE_Q5_0].tile = sd_tile_q5_0_avx2;
        g_types[SD_TYPE_Q5_1].tile = sd_tile_q5_1_avx2;
        g_types[SD_TYPE_Q8_0].tile = sd_tile_q8_0_avx2;
        g_types[SD_TYPE_Q4_K].tile = sd_tile_q4_K_avx2;
        g_types[SD_TYPE_Q5_K].tile = sd_tile_q5_K_avx2;
        g_types[SD_TYPE_Q6_K].tile = sd_tile_q6_K_avx2;
        g_dot_f32 = sd_dot_f32_avx2;
        g_axpy_f32 = sd_axpy_f32_avx2;
        g_quantize_q8 = sd_quantize_q8_avx2;
        g_swiglu = sd_swiglu_avx2;
        g_attend = sd_attend_avx2;
        g_to_f16 = sd_f32_to_f16_row_avx2;
        g_simd_name = "avx2+fma+f16c";
        g_repack = 1;
        if (force == NULL || strcmp(force, "avx2") != 0) {
            if (sd_cpu_has_avx512vnni()) {
                g_types[SD_TYPE_Q4_0].tile = sd_tile_q4_0_vnni;
                g_types[SD_TYPE_Q4_1].tile = sd_tile_q4_1_vnni;
                g_types[SD_TYPE_Q5_0].tile = sd_tile_q5_0_vnni;
                g_types[SD_TYPE_Q5_1].tile = sd_tile_q5_1_vnni;
                g_types[SD_TYPE_Q8_0].tile = sd_tile_q8_0_vnni;
                g_attend = sd_attend_avx512;
                g_simd_name = "avx2+fma+f16c+avx512vnni";
                g_repack = 2;
                if ((force == NULL || strcmp(force, "avx512vnni") != 0) && sd_cpu_has_amx_int8()) {
                    g_simd_name = "avx2+fma+f16c+avx512vnni+amx";
                    g_repack = 3;
                }
            }
        }
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

void sd_quantize_q8(unsigned char *dst, const float *x, int64_t n) {
    float *d = (float *)(dst + n);
    g_quantize_q8((int8_t *)dst, d, d + n / 32, d + 2 * (n / 32), x, n / 32);
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

int sd_kernels_want_scalars(int T) {
#ifdef SD_HAVE_X86_SIMD
    return g_repack == 3 && T >= SD_AMX_MIN_TOKENS;
#else
    (void)T;
    return 0;
#endif
}

void sd_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    g_swiglu(out, gate, up, n);
}

void sd_attend(const sd_attn_group *g, const void *k, const void *v, int kv_f16, int n_attn, int Dh,
               float scale, float *sc) {
    /* the SIMD kernels take head sizes in whole 8-float vectors */
    (Dh % 8 == 0 ? g_attend : sd_attend_ref)(g, k, v, kv_f16, n_attn, Dh, scale, sc);
}

void sd_f32_to_f16_row_ref(uint16_t *dst, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float f = x[i] > 65504.0f ? 65504.0f : x[i] < -65504.0f ? -65504.0f : x[i];
        dst[i] = sd_f32_to_f16(f);
    }
}

void sd_f32_to_f16_row(uint16_t *dst, const float *x, int64_t n) {
    g_to_f16(dst, x, n);
}

/* ---- repacked matrices ------------------------------------------------------------------------
 */

size_t sd_repack_bytes(int type, int64_t rows, int64_t cols) {
    sd_kernels_init();
#ifdef SD_HAVE_X86_SIMD
    return g_repack ? sd_packed_bytes(type, rows, cols) : 0;
#else
    (void)type;
    (void)rows;
    (void)cols;
    return 0;
#endif
}

void sd_repack(void *dst, int type, const void *w, size_t row_bytes, int64_t rows, int64_t cols) {
#ifdef SD_HAVE_X86_SIMD
    sd_pack_rows8(dst, type, w, row_bytes, rows, cols);
#else
    (void)dst;
    (void)type;
    (void)w;
    (void)row_bytes;
    (void)rows;
    (void)cols;
#endif
}

void sd_tile_repacked(int type, float *y, int64_t ldy, const void *packed, int64_t r0,
                      int64_t nrows, const sd_acts *a, int T, int64_t n, const float *bias,
                      int accumulate) {
#ifdef SD_HAVE_X86_SIMD
    const size_t group = sd_packed_bytes(type, 8, n);
    const void *p = (const unsigned char *)packed + (size_t)(r0 / 8) * group;
    if (g_repack == 3) {
        sd_tile_packed_amx(type, y, ldy, p, nrows, a, T, n, bias, accumulate);
    } else if (g_repack == 2) {
        sd_tile_packed_vnni(type, y, ldy, p, nrows, a, T, n, bias, accumulate);
    } else {
        sd_tile_packed_avx2(type, y, ldy, p, nrows, a, T, n, bias, accumulate);
    }
#else
    (void)type;
    (void)y;
    (void)ldy;
    (void)packed;
    (void)r0;
    (void)nrows;
    (void)a;
    (void)T;
    (void)n;
    (void)bias;
    (void)accumulate;
#endif
}

/* ---- kernel checks ------------------------------------------------------------------------- */

/* The portable tile of each type, whatever the table holds after SIMD selection. */
static sd_tile_fn portable_tile(int type) {
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

static sd_status check_type(int type, int64_t n, const sd_type_traits **out) {
    sd_kernels_init();
    const sd_type_traits *tr = sd_type_get(type);
    if (tr == NULL || tr->tile == NULL) {
        return sd_set_error(SD_ERR_UNSUPPORTED, "type %s has no kernels", sd_type_name(type));
    }
    if (n <= 0 || n % tr->block_size != 0) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "row length %lld is not a positive multiple of the %s block size %d",
                            (long long)n, tr->name, tr->block_size);
    }
    *out = tr;
    return SD_OK;
}

static sd_status check_size(const sd_type_traits *tr, size_t have, int64_t rows, int64_t n) {
    size_t need = (size_t)rows * (size_t)(n / tr->block_size) * (size_t)tr->type_size;
    if (have != need) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "%lld rows of %lld %s elements take %zu bytes, got %zu",
                            (long long)rows, (long long)n, tr->name, need, have);
    }
    return SD_OK;
}

sd_status sd_dequantize(float *dst, int type, const void *src, size_t src_bytes, int64_t n) {
    const sd_type_traits *tr = NULL;
    SD_TRY(check_type(type, n, &tr));
    SD_TRY(check_size(tr, src_bytes, 1, n));
    tr->to_float(dst, src, n);
    return SD_OK;
}

size_t sd_quantized_activation_bytes(int64_t n) {
    return SD_Q8_ROW_BYTES(n);
}

sd_status sd_quantize_activations(unsigned char *dst, size_t dst_bytes, const float *x, int64_t n) {
    sd_kernels_init();
    if (n <= 0 || n % 32 != 0) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "length must be a positive multiple of 32, got %lld", (long long)n);
    }
    if (dst_bytes != SD_Q8_ROW_BYTES(n)) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "%lld quantized activations take %zu bytes, got %zu", (long long)n,
                            SD_Q8_ROW_BYTES(n), dst_bytes);
    }
    sd_quantize_q8(dst, x, n);
    return SD_OK;
}

sd_status sd_matmul_rows(float *y, int type, const void *w, size_t w_bytes, int64_t nrows,
                         int64_t n, const float *x, int T, int kernel) {
    const sd_type_traits *tr = NULL;
    SD_TRY(check_type(type, n, &tr));
    if (nrows < 1 || T < 1) {
        return sd_set_error(SD_ERR_INVALID_ARG, "need nrows >= 1 and T >= 1");
    }
    SD_TRY(check_size(tr, w_bytes, nrows, n));
    sd_acts a = {x, n, NULL, NULL};
    unsigned char *xq = NULL;
    if (tr->dot_q8 != NULL) {
        if (n % 32 != 0) {
            return sd_set_error(SD_ERR_INVALID_ARG, "row length %lld is not a multiple of 32",
                                (long long)n);
        }
        xq = malloc(SD_Q8_BATCH_BYTES(T, n));
        if (xq == NULL) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory");
        }
        float *xt = sd_kernels_want_scalars(T) ? sd_q8_scalars_at(xq, T, n) : NULL;
        for (int t = 0; t < T; t++) {
            unsigned char *row = xq + (size_t)t * SD_Q8_ROW_BYTES(n);
            sd_quantize_q8(row, x + (size_t)t * (size_t)n, n);
            if (xt != NULL) {
                sd_q8_scatter_scalars(xt, row, t, n);
            }
        }
        a.xq = xq;
        a.xt = xt;
    }
    const size_t packed_bytes = sd_repack_bytes(type, nrows, n);
    if (kernel == SD_KERNEL_FORWARD && packed_bytes > 0) {
        void *packed = malloc(packed_bytes);
        if (packed == NULL) {
            free(xq);
            return sd_set_error(SD_ERR_NOMEM, "out of memory");
        }
        sd_repack(packed, type, w, sd_row_bytes(type, n), nrows, n);
        sd_tile_repacked(type, y, nrows, packed, 0, nrows, &a, T, n, NULL, 0);
        free(packed);
    } else {
        sd_tile_fn tile = kernel == SD_KERNEL_PORTABLE ? portable_tile(type) : tr->tile;
        tile(y, nrows, w, sd_row_bytes(type, n), nrows, &a, T, n, NULL, 0);
    }
    free(xq);
    return SD_OK;
}
