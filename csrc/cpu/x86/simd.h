/* simd.h — x86-64 AVX2/FMA/F16C versions of the row kernels, compiled with a per-function
 * target attribute so the rest of the core builds for any x86-64 (or other) CPU.
 * cpu/dispatch.c picks them at run time when the CPU has all three extensions. */
#ifndef SD_SIMD_H
#define SD_SIMD_H

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SD_HAVE_X86_SIMD 1
int sd_cpu_has_avx2_fma_f16c(void);
float sd_dot_f32_avx2(const float *a, const float *b, int64_t n);
void sd_f16_to_f32_avx2(float *dst, const void *src, int64_t n);
void sd_bf16_to_f32_avx2(float *dst, const void *src, int64_t n);
void sd_axpy_f32_avx2(float *y, float a, const float *x, int64_t n);
/* Twins of sd_swiglu_ref, sd_geglu_ref and sd_attend_ref (ops_cpu.h). */
void sd_swiglu_avx2(float *out, const float *gate, const float *up, int64_t n);
void sd_geglu_avx2(float *out, const float *gate, const float *up, int64_t n);
#include "cpu/ops_cpu.h"
void sd_attend_avx2(const sd_attn_group *g, const void *k, const void *v, int kv_f16, int n_attn,
                    int Dh, float scale, float *sc);
/* Twins of sd_softmax_exp_ref, sd_argmax_f32_ref and sd_sum_f32_ref (ops_cpu.h), the same
 * bits. */
double sd_softmax_exp_avx2(float *e, const float *x, int64_t n, float mx, float t);
double sd_softmax_exp_avx512(float *e, const float *x, int64_t n, float mx, float t);
int64_t sd_argmax_f32_avx2(const float *x, int64_t n);
double sd_sum_f32_avx2(const float *x, int64_t n);
/* The same bits on AVX-512F/VL, the work shared across more queries. */
void sd_attend_avx512(const sd_attn_group *g, const void *k, const void *v, int kv_f16, int n_attn,
                      int Dh, float scale, float *sc);
/* dst[i] = x[i] rounded to the nearest half (ties to even), finite values beyond the half range
 * saturating to +-65504 (sd_f32_to_f16_row's twin). */
void sd_f32_to_f16_row_avx2(uint16_t *dst, const float *x, int64_t n);
/* y[t*ldy + r] (= or +=) dot(row r of w, x_t) (+ bias[r]) for r < nrows, t < T; w rows of
 * `type` (F32, F16 or BF16), row_bytes apart; x rows ldx floats apart. */
void sd_matmul_tile_avx2(int type, float *y, int64_t ldy, const void *w, size_t row_bytes,
                         int64_t nrows, const float *x, int64_t ldx, int T, int64_t n,
                         const float *bias, int accumulate);

/* Quantized tiles (simd_avx2_q.c), with the sd_tile_fn signature of quant.h. */
#include "cpu/quant.h"
#define SD_DECLARE_AVX2_QTILE(sfx)                                                                 \
    void sd_tile_##sfx##_avx2(float *y, int64_t ldy, const void *w, size_t row_bytes,              \
                              int64_t nrows, const sd_acts *a, int T, int64_t n,                   \
                              const float *bias, int accumulate);
SD_DECLARE_AVX2_QTILE(q4_0)
SD_DECLARE_AVX2_QTILE(q4_1)
SD_DECLARE_AVX2_QTILE(q5_0)
SD_DECLARE_AVX2_QTILE(q5_1)
SD_DECLARE_AVX2_QTILE(q8_0)
SD_DECLARE_AVX2_QTILE(q4_K)
SD_DECLARE_AVX2_QTILE(q5_K)
SD_DECLARE_AVX2_QTILE(q6_K)

/* The activation quantization of quant.h, byte for byte the portable one's. */
void sd_quantize_q8_avx2(int8_t *q, float *d, float *s, float *e, const float *x, int64_t nb);

/* AVX512-VNNI tiles of the 32-element formats (simd_vnni_q.c). */
int sd_cpu_has_avx512vnni(void);
#define SD_DECLARE_VNNI_QTILE(sfx)                                                                 \
    void sd_tile_##sfx##_vnni(float *y, int64_t ldy, const void *w, size_t row_bytes,              \
                              int64_t nrows, const sd_acts *a, int T, int64_t n,                   \
                              const float *bias, int accumulate);
SD_DECLARE_VNNI_QTILE(q4_0)
SD_DECLARE_VNNI_QTILE(q4_1)
SD_DECLARE_VNNI_QTILE(q5_0)
SD_DECLARE_VNNI_QTILE(q5_1)
SD_DECLARE_VNNI_QTILE(q8_0)

/* Repacked matrices (simd_vnni_q.c): bytes of the 8-row interleaved copy (0 when the matrix
 * cannot be repacked: other type, rows % 8, row too long), filling it, and the tile over it
 * (nrows a multiple of 8, `packed` at the first of them). Q4_0, Q4_1 and Q8_0 copies serve every
 * tile below; Q5_0, Q5_1, Q4_K, Q5_K and Q6_K copies the AVX2 and AVX-VNNI ones alone. */
size_t sd_packed_bytes(int type, int64_t rows, int64_t cols);
int sd_pack_rows8(void *dst, int type, const void *w, size_t row_bytes, int64_t rows, int64_t cols);
/* The copies of Q5_0, Q5_1 and the K-quants (simd_kpack.c): format f of simd_packed.h, rows a
 * multiple of 8, sd_packed_bytes(type, rows, cols) bytes at dst. */
void sd_kpack_rows8(void *dst, int f, const void *w, size_t row_bytes, int64_t rows, int64_t cols);
void sd_tile_packed_vnni(int type, float *y, int64_t ldy, const void *packed, int64_t nrows,
                         const sd_acts *a, int T, int64_t n, const float *bias, int accumulate);
/* The fewest tokens of a group that the VNNI tile passes over sixteen rows at a time (two 8-row
 * groups side by side in 512-bit registers, the same bits as the 8-row step); below it, eight.
 * Set once by the dispatcher, before any tile runs (default 1: always sixteen). */
void sd_tile_vnni_set_pair_tokens(int tokens);
/* Whether the CPU is AMD's, and its x86 family (base plus extended: 25 for Zen 3 and Zen 4, 26
 * for Zen 5); the dispatcher sets the pairing above by them. */
int sd_cpu_is_amd(void);
int sd_cpu_family(void);
/* The same over AVX2 alone. */
void sd_tile_packed_avx2(int type, float *y, int64_t ldy, const void *packed, int64_t nrows,
                         const sd_acts *a, int T, int64_t n, const float *bias, int accumulate);
/* AVX-VNNI (vpdpbusd in 256-bit VEX form; simd_avxvnni_q.c): whether the CPU has it, and the
 * tile over every repacked copy with it: the bits of sd_tile_packed_vnni for Q4_0, Q4_1 and Q8_0,
 * of sd_tile_packed_avx2 for the others. */
int sd_cpu_has_avxvnni(void);
void sd_tile_packed_avxvnni(int type, float *y, int64_t ldy, const void *packed, int64_t nrows,
                            const sd_acts *a, int T, int64_t n, const float *bias, int accumulate);

/* AMX-INT8 (simd_amx_q.c): whether this CPU has it and the OS lets this process use it (asks
 * once), and the tile over the repacked copy for batches of tokens, with the VNNI tile's bits
 * (it hands single tokens to that tile). */
int sd_cpu_has_amx_int8(void);
/* Batches of fewer tokens stay on the VNNI tile: each block of 16 rows costs the AMX tile
 * about 15-30 cycles of unpacking and tile stores whatever the batch, the 16-row VNNI tile
 * (which passes over the weights once for up to 8 tokens) about 5 per token. Measured on a
 * Xeon with AMX (benchmarks/RESULTS.md), the VNNI tile is faster up to 8 tokens and the AMX
 * tile from 9, where the VNNI tile would pass over the weights twice. The AMX tile reads the
 * scalars gathered in a->xt (quant.h) and hands the batch to the VNNI tile when they are
 * missing. */
#define SD_AMX_MIN_TOKENS 9
void sd_tile_packed_amx(int type, float *y, int64_t ldy, const void *packed, int64_t nrows,
                        const sd_acts *a, int T, int64_t n, const float *bias, int accumulate);
#endif

#endif /* SD_SIMD_H */
