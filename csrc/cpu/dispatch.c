/* dispatch.c — the one place that chooses this CPU's kernels: at the first model load (or the
 * first kernel call) it asks the CPU for AVX2/FMA/F16C, AVX512-VNNI and AMX-INT8, honours the
 * SPECDEC_SIMD cap, and puts the x86 twins (cpu/x86/) in place of the portable kernels: the row
 * kernels of the type table (quant.c) and the dispatched entry points declared with their
 * portable twins in quant.h and ops_cpu.h, defined here. */
#include "cpu/dispatch.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops_cpu.h"
#include "cpu/quant.h"
#include "cpu/quant_blocks.h"
#include "cpu/x86/simd.h"

/* The table entry of a type the dispatcher fills (always one of the computed types). */
static sd_type_traits *slot(int type) {
    return sd_type_slot(type);
}

#define SD_TILE_ARGS                                                                               \
    float *y, int64_t ldy, const void *w, size_t row_bytes, int64_t nrows, const sd_acts *a,       \
        int T, int64_t n, const float *bias, int accumulate
#define SD_TILE_PASS y, ldy, w, row_bytes, nrows, a, T, n, bias, accumulate

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

static int g_repack = 0;  /* the repacked tiles are selected: 1 AVX2, 2 AVX512-VNNI, 3 AMX */
static int g_avxvnni = 0; /* the copies that no wider tile takes go through the AVX-VNNI one */

static float (*g_dot_f32)(const float *, const float *, int64_t) = sd_dot_f32_ref;
static void (*g_axpy_f32)(float *, float, const float *, int64_t) = sd_axpy_f32_ref;
static sd_quantize_q8_fn g_quantize_q8 = sd_quantize_q8_ref;
static void (*g_swiglu)(float *, const float *, const float *, int64_t) = sd_swiglu_ref;
static void (*g_geglu)(float *, const float *, const float *, int64_t) = sd_geglu_ref;
static void (*g_attend)(const sd_attn_group *, const void *, const void *, int, int, int, float,
                        float *) = sd_attend_ref;
static void (*g_to_f16)(uint16_t *, const float *, int64_t) = sd_f32_to_f16_row_ref;
static double (*g_softmax_exp)(float *, const float *, int64_t, float, float) = sd_softmax_exp_ref;
static int64_t (*g_argmax_f32)(const float *, int64_t) = sd_argmax_f32_ref;
static double (*g_sum_f32)(const float *, int64_t) = sd_sum_f32_ref;
static const char *g_simd_name = "scalar";

static pthread_once_t g_kernels_once = PTHREAD_ONCE_INIT;

static void kernels_init_once(void) {
#ifdef SD_HAVE_X86_SIMD
    /* SPECDEC_SIMD=scalar keeps the portable kernels, SPECDEC_SIMD=avx2 stops at AVX2,
     * SPECDEC_SIMD=avxvnni at AVX-VNNI (the level of Intel's client cores, which have no
     * AVX-512), SPECDEC_SIMD=avx512vnni before AMX: the tests run every path this way. */
    const char *force = getenv("SPECDEC_SIMD");
    int want_simd = force == NULL || strcmp(force, "scalar") != 0;
    if (want_simd && sd_cpu_has_avx2_fma_f16c()) {
        slot(SD_TYPE_F16)->to_float = sd_f16_to_f32_avx2;
        slot(SD_TYPE_BF16)->to_float = sd_bf16_to_f32_avx2;
        slot(SD_TYPE_F32)->tile = tile_f32_avx2;
        slot(SD_TYPE_F16)->tile = tile_f16_avx2;
        slot(SD_TYPE_BF16)->tile = tile_bf16_avx2;
        slot(SD_TYPE_Q4_0)->tile = sd_tile_q4_0_avx2;
        slot(SD_TYPE_Q4_1)->tile = sd_tile_q4_1_avx2;
        slot(SD_TYPE_Q5_0)->tile = sd_tile_q5_0_avx2;
        slot(SD_TYPE_Q5_1)->tile = sd_tile_q5_1_avx2;
        slot(SD_TYPE_Q8_0)->tile = sd_tile_q8_0_avx2;
        slot(SD_TYPE_Q4_K)->tile = sd_tile_q4_K_avx2;
        slot(SD_TYPE_Q5_K)->tile = sd_tile_q5_K_avx2;
        slot(SD_TYPE_Q6_K)->tile = sd_tile_q6_K_avx2;
        g_dot_f32 = sd_dot_f32_avx2;
        g_axpy_f32 = sd_axpy_f32_avx2;
        g_quantize_q8 = sd_quantize_q8_avx2;
        g_swiglu = sd_swiglu_avx2;
        g_geglu = sd_geglu_avx2;
        g_attend = sd_attend_avx2;
        g_to_f16 = sd_f32_to_f16_row_avx2;
        g_softmax_exp = sd_softmax_exp_avx2;
        g_argmax_f32 = sd_argmax_f32_avx2;
        g_sum_f32 = sd_sum_f32_avx2;
        g_simd_name = "avx2+fma+f16c";
        g_repack = 1;
        if (force == NULL || strcmp(force, "avx2") != 0) {
            if (sd_cpu_has_avxvnni()) {
                /* the repacked copies go through vpdpbusd; with AVX-512 below, the Q4_0, Q4_1
                 * and Q8_0 ones go through its tiles instead */
                g_avxvnni = 1;
                g_simd_name = "avx2+fma+f16c+avxvnni";
            }
            if ((force == NULL || strcmp(force, "avxvnni") != 0) && sd_cpu_has_avx512vnni()) {
                slot(SD_TYPE_Q4_0)->tile = sd_tile_q4_0_vnni;
                slot(SD_TYPE_Q4_1)->tile = sd_tile_q4_1_vnni;
                slot(SD_TYPE_Q5_0)->tile = sd_tile_q5_0_vnni;
                slot(SD_TYPE_Q5_1)->tile = sd_tile_q5_1_vnni;
                slot(SD_TYPE_Q8_0)->tile = sd_tile_q8_0_vnni;
                g_attend = sd_attend_avx512;
                g_softmax_exp = sd_softmax_exp_avx512;
                g_simd_name = "avx2+fma+f16c+avx512vnni";
                g_repack = 2;
                /* Sixteen rows per step halve the instructions per row, which paid on a Xeon
                 * for every batch size. On Zen 4 (family 25), whose 512-bit instructions run
                 * as two halves, they pay from 8 tokens only: one token took 7.5 ms over the
                 * 16-row step against 4.7 ms over the 8-row one (SmolLM2 Q4_1, one thread;
                 * benchmarks/RESULTS.md). Neither a farther prefetch nor a copy with each
                 * pair's blocks alternating (one stream, not two) made the 16-row step as
                 * cheap for one token. Zen 5 (family 26) runs them whole: there, at one
                 * thread, 4 and 6 tokens cost 27 % and 37 % less over the 16-row step, while one
                 * and two tokens at two threads cost 6-13 % more (two memory streams a thread),
                 * so it takes the 16-row step from 3 tokens. The bits are the same either way. */
                sd_tile_vnni_set_pair_tokens(!sd_cpu_is_amd() ? 1 : sd_cpu_family() < 26 ? 8 : 3);
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

void sd_geglu(float *out, const float *gate, const float *up, int64_t n) {
    g_geglu(out, gate, up, n);
}

void sd_attend(const sd_attn_group *g, const void *k, const void *v, int kv_f16, int n_attn, int Dh,
               float scale, float *sc) {
    /* the SIMD kernels take head sizes in whole 8-float vectors */
    (Dh % 8 == 0 ? g_attend : sd_attend_ref)(g, k, v, kv_f16, n_attn, Dh, scale, sc);
}

void sd_f32_to_f16_row(uint16_t *dst, const float *x, int64_t n) {
    g_to_f16(dst, x, n);
}

double sd_softmax_exp(float *e, const float *x, int64_t n, float mx, float t) {
    sd_kernels_init();
    return g_softmax_exp(e, x, n, mx, t);
}

double sd_sum_f32(const float *x, int64_t n) {
    return g_sum_f32(x, n); /* the same bits before sd_kernels_init as after */
}

int64_t sd_argmax_f32(const float *x, int64_t n) {
    sd_kernels_init();
    return g_argmax_f32(x, n);
}

/* ---- repacked matrices ------------------------------------------------------------------------
 */

/* Q4_0, Q4_1 and Q8_0 copies go through the best tile over the copy; Q5_0, Q5_1 and the
 * K-quants have only the AVX-VNNI and AVX2 ones, which serve them at every level (over rows as
 * stored, the AVX2 tiles took a third longer for one Gemma-3 token on Zen 5, and the VNNI tiles
 * of Q5_0/Q5_1 do not unpack a block once for a batch: benchmarks/RESULTS.md). */
static int repacked_on_every_path(int type) {
    return type == SD_TYPE_Q4_0 || type == SD_TYPE_Q4_1 || type == SD_TYPE_Q8_0;
}

size_t sd_repack_bytes(int type, int64_t rows, int64_t cols) {
    sd_kernels_init();
#ifdef SD_HAVE_X86_SIMD
    if (g_repack == 0) {
        return 0;
    }
    return sd_packed_bytes(type, rows, cols);
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
    const int every = repacked_on_every_path(type);
    if (every && g_repack == 3) {
        sd_tile_packed_amx(type, y, ldy, p, nrows, a, T, n, bias, accumulate);
    } else if (every && g_repack == 2) {
        sd_tile_packed_vnni(type, y, ldy, p, nrows, a, T, n, bias, accumulate);
    } else if (g_avxvnni) {
        sd_tile_packed_avxvnni(type, y, ldy, p, nrows, a, T, n, bias, accumulate);
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
