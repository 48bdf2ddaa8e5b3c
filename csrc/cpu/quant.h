/* quant.h — tensor element types: block geometry of every ggml type we can validate, and the
 * row kernels (to-float, and tiles of a batched matmul) of the types the forward pass computes
 * with.
 * One table entry per type; the forward pass never switches on types itself. */
#ifndef SD_QUANT_H
#define SD_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "specdec.h"

/* Activations quantized for the integer kernels of quantized weights, one row per token: n
 * int8 quants, then n/32 f32 scales d, then n/32 f32 values s = d * sum(q) (which multiply the
 * per-block offsets of Q4_1, Q5_1 and K-quants), then n/32 f32 values e = d * sum(q) unrounded;
 * x[i] ~ d[i/32] * q[i]. d and s are rounded to f16 precision as llama.cpp's Q8_0/Q8_1
 * activations are, so products with a quantized model track llama.cpp's arithmetic; e serves
 * kernels that shift signed weights to unsigned ones (sum (w + c) x - c sum x). Keeping the
 * arrays apart lets a kernel load the scales of eight blocks with one instruction. */
#define SD_Q8_ROW_BYTES(n) ((size_t)(n) + 3 * sizeof(float) * (size_t)((n) / 32))

typedef struct {
    const int8_t *q; /* (n) */
    const float *d;  /* (n / 32) */
    const float *s;  /* (n / 32) */
    const float *e;  /* (n / 32) */
} sd_q8_row;

static inline sd_q8_row sd_q8_row_at(const unsigned char *rows, int64_t n, int64_t t) {
    const unsigned char *r = rows + (size_t)t * SD_Q8_ROW_BYTES(n);
    sd_q8_row v;
    v.q = (const int8_t *)r;
    v.d = (const float *)(r + n);
    v.s = v.d + n / 32;
    v.e = v.s + n / 32;
    return v;
}

/* Quantize n floats (n % 32 == 0) into one row of SD_Q8_ROW_BYTES(n) bytes at `dst`. */
void sd_quantize_q8(unsigned char *dst, const float *x, int64_t n);
/* A kernel of that quantization: nb blocks of x (32 nb floats) -> the blocks' quants q (32 nb),
 * scales d, sums s = f16(d * sum q) and e = d * sum q (nb each). */
typedef void (*sd_quantize_q8_fn)(int8_t *q, float *d, float *s, float *e, const float *x,
                                  int64_t nb);

/* The per-block scalars of a batch of quantized rows, gathered batch-major for the AMX tiles:
 * for chunk c of 16 tokens and block b, 64 floats at xt + (c * n/32 + b) * 64, one cache line
 * (16 floats) per group of 4 tokens: their d at SD_Q8_XT_D(t), s at + 4, e at + 8, 4 unused.
 * Threads that quantize different groups of 4 tokens write different lines. */
#define SD_Q8_SCALARS_FLOATS(T, n) ((((size_t)(T) + 15) / 16) * (size_t)((n) / 32) * 64)
#define SD_Q8_XT_D(t) (16 * ((t) % 16 / 4) + (t) % 4)
/* Row t's scalars into such an array. */
void sd_q8_scatter_scalars(float *xt, const unsigned char *row, int t, int64_t n);
/* Whether this CPU's kernels read gathered scalars for a batch of T tokens. */
int sd_kernels_want_scalars(int T);
/* Bytes of a quantized batch: T rows, then (64-byte aligned) room for the gathered scalars. */
#define SD_Q8_BATCH_BYTES(T, n)                                                                    \
    (((size_t)(T)*SD_Q8_ROW_BYTES(n) + 63) / 64 * 64 + 64 +                                        \
     SD_Q8_SCALARS_FLOATS(T, n) * sizeof(float))
/* Where a quantized batch buffer `xq` of SD_Q8_BATCH_BYTES keeps the gathered scalars. */
static inline float *sd_q8_scalars_at(unsigned char *xq, int T, int64_t n) {
    uintptr_t p = (uintptr_t)(xq + (size_t)T * SD_Q8_ROW_BYTES(n));
    return (float *)((p + 63) / 64 * 64);
}

/* The activations of one batched matmul: T rows of n floats, and the same rows quantized when
 * the weights are of a quantized type (xq NULL otherwise). */
typedef struct {
    const float *x; /* (T, ldx) */
    int64_t ldx;
    const unsigned char *xq; /* T rows of SD_Q8_ROW_BYTES(n) */
    const float *xt;         /* NULL, or their scalars gathered (SD_Q8_SCALARS_FLOATS) */
} sd_acts;

/* Convert n elements (n a multiple of the block size) of one row to f32. */
typedef void (*sd_to_float_fn)(float *dst, const void *src, int64_t n);
/* sum_i w[i] * x[i] over n elements of one row of a float type and an f32 vector. */
typedef float (*sd_dot_fn)(const void *w, const float *x, int64_t n);
/* The same for a quantized row and quantized activations (n / 32 blocks). */
typedef float (*sd_dot_q8_fn)(const void *w, sd_q8_row x, int64_t n);

/* y[t*ldy + r] (= or +=) dot(row r of w, activation row t) (+ bias[r]) for r < nrows, t < T: a
 * tile of a batched matmul, rows row_bytes apart. Each weight row is read once for all T. */
typedef void (*sd_tile_fn)(float *y, int64_t ldy, const void *w, size_t row_bytes, int64_t nrows,
                           const sd_acts *a, int T, int64_t n, const float *bias, int accumulate);

typedef struct {
    const char *name;
    int block_size;          /* elements per block */
    int type_size;           /* bytes per block */
    sd_to_float_fn to_float; /* NULL: geometry known, arithmetic not implemented */
    sd_tile_fn tile;         /* NULL likewise */
    sd_dot_fn dot;           /* float types: the scalar dot the portable tile uses */
    sd_dot_q8_fn dot_q8;     /* quantized types: likewise, against quantized activations */
} sd_type_traits;

/* Traits of a ggml type id, or NULL when the id is unknown. */
const sd_type_traits *sd_type_get(int type);
/* Bytes of a row of n elements (n % block_size == 0), 0 on unknown types. */
size_t sd_row_bytes(int type, int64_t n);

/* Scalar conversions used across the core. */
float sd_f16_to_f32(uint16_t h);
uint16_t sd_f32_to_f16(float f);
float sd_bf16_to_f32(uint16_t h);
/* A row to halves for the KV cache: round to nearest, ties to even; finite values beyond the
 * half range saturate to +-65504 rather than becoming infinite (NaN stays NaN). SIMD-dispatched,
 * the same bits on every path (NaN payloads aside). */
void sd_f32_to_f16_row(uint16_t *dst, const float *x, int64_t n);
void sd_f32_to_f16_row_ref(uint16_t *dst, const float *x, int64_t n);

/* Select SIMD kernels for this CPU (idempotent, thread-safe). Called by model load. */
void sd_kernels_init(void);

/* Repacked copies of quantized matrices (8 rows interleaved, for the AVX2 and AVX512-VNNI
 * tiles; same size as the originals). sd_repack_bytes is 0 when this CPU or this matrix has no
 * repacked kernel (type, rows % 8, row length). sd_tile_repacked computes rows [r0, r0 + nrows) of
 * the matrix, r0 and nrows multiples of 8, from the copy `packed`. */
size_t sd_repack_bytes(int type, int64_t rows, int64_t cols);
void sd_repack(void *dst, int type, const void *w, size_t row_bytes, int64_t rows, int64_t cols);
void sd_tile_repacked(int type, float *y, int64_t ldy, const void *packed, int64_t r0,
                      int64_t nrows, const sd_acts *a, int T, int64_t n, const float *bias,
                      int accumulate);

/* Plain f32 kernels, SIMD-dispatched. */
float sd_dot_f32(const float *a, const float *b, int64_t n);
/* y[i] += a * x[i] */
void sd_axpy_f32(float *y, float a, const float *x, int64_t n);

#endif /* SD_QUANT_H */
