/* quant.h — the row kernels (to-float, and tiles of a batched matmul) of the types the forward
 * pass computes with, a weight matrix as the kernels see it, and the quantized activations.
 * One table entry per type (quant.c); the forward pass never switches on types itself. */
#ifndef SD_QUANT_H
#define SD_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "format/types.h"
#include "specdec.h"

#include "cpu/acts.h"

/* Quantize n floats (n % 32 == 0) into one row of SD_Q8_ROW_BYTES(n) bytes at `dst`. */
void sd_quantize_q8(unsigned char *dst, const float *x, int64_t n);
/* Row t's scalars into such an array. */
void sd_q8_scatter_scalars(float *xt, const unsigned char *row, int t, int64_t n);
/* Whether this CPU's kernels read gathered scalars for a batch of T tokens. */
int sd_kernels_want_scalars(int T);

typedef struct {
    const char *name;
    int block_size;          /* elements per block */
    int type_size;           /* bytes per block */
    sd_to_float_fn to_float; /* NULL: geometry known, arithmetic not implemented */
    sd_tile_fn tile;         /* NULL likewise */
    sd_dot_fn dot;           /* float types: the scalar dot the portable tile uses */
    sd_dot_q8_fn dot_q8;     /* quantized types: likewise, against quantized activations */
} sd_type_traits;

/* Traits of a ggml type id (its geometry from format/types.h, and its kernels: this CPU's once
 * cpu/dispatch.c has run), or NULL when the id is unknown. */
const sd_type_traits *sd_type_get(int type);
/* The same entry, writable: for the dispatcher alone. */
sd_type_traits *sd_type_slot(int type);
/* The portable tile of a type whatever the table holds (kernel checks), NULL without one. */
sd_tile_fn sd_portable_tile(int type);

/* A 2-D weight: `rows` rows of `cols` elements of `type`, rows contiguous. 1-D vectors are
 * rows == 1. */
typedef struct {
    const void *data;
    int type; /* sd_type */
    int64_t rows;
    int64_t cols;
    size_t row_bytes;
    const void *packed; /* repacked 8-row interleaved copy (sd_repack), or NULL */
    int tensor_id;      /* dummy models: the id its random values are drawn with; else -1 */
} sd_mat;

/* Scalar conversions used across the core. */
float sd_f16_to_f32(uint16_t h);
uint16_t sd_f32_to_f16(float f);
float sd_bf16_to_f32(uint16_t h);
/* A row to halves for the KV cache: round to nearest, ties to even; finite values beyond the
 * half range saturate to +-65504 rather than becoming infinite (NaN stays NaN). SIMD-dispatched,
 * the same bits on every path (NaN payloads aside). */
void sd_f32_to_f16_row(uint16_t *dst, const float *x, int64_t n);
void sd_f32_to_f16_row_ref(uint16_t *dst, const float *x, int64_t n);

/* Repacked copies of quantized matrices (8 rows interleaved, for the AVX2 and AVX512-VNNI
 * tiles; same size as the originals). sd_repack_bytes is 0 when this CPU or this matrix has no
 * repacked kernel (type, rows % 8, row length). sd_tile_repacked computes rows [r0, r0 + nrows) of
 * the matrix, r0 and nrows multiples of 8, from the copy `packed`. */
size_t sd_repack_bytes(int type, int64_t rows, int64_t cols);
void sd_repack(void *dst, int type, const void *w, size_t row_bytes, int64_t rows, int64_t cols);
void sd_tile_repacked(int type, float *y, int64_t ldy, const void *packed, int64_t r0,
                      int64_t nrows, const sd_acts *a, int T, int64_t n, const float *bias,
                      int accumulate);

/* Plain f32 kernels, SIMD-dispatched (cpu/dispatch.c), and their portable twins. */
float sd_dot_f32(const float *a, const float *b, int64_t n);
float sd_dot_f32_ref(const float *a, const float *b, int64_t n);
/* y[i] += a * x[i] */
void sd_axpy_f32(float *y, float a, const float *x, int64_t n);
void sd_axpy_f32_ref(float *y, float a, const float *x, int64_t n);

#endif /* SD_QUANT_H */
