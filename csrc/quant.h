/* quant.h — tensor element types: block geometry of every ggml type we can validate, and the
 * row kernels (to-float and dot with an f32 vector) of the types the forward pass computes with.
 * One table entry per type; the forward pass never switches on types itself. */
#ifndef SD_QUANT_H
#define SD_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "specdec.h"

/* Convert n elements (n a multiple of the block size) of one row to f32. */
typedef void (*sd_to_float_fn)(float *dst, const void *src, int64_t n);
/* sum_i w[i] * x[i] over n elements of one row of this type and an f32 vector. */
typedef float (*sd_dot_fn)(const void *w, const float *x, int64_t n);

/* y[t*ldy + r] (= or +=) dot(row r of w, x_t) (+ bias[r]) for r < nrows, t < T: a tile of a
 * batched matmul, rows row_bytes apart, activation rows ldx floats apart. */
typedef void (*sd_tile_fn)(float *y, int64_t ldy, const void *w, size_t row_bytes, int64_t nrows,
                           const float *x, int64_t ldx, int T, int64_t n, const float *bias,
                           int accumulate);

typedef struct {
    const char *name;
    int block_size;          /* elements per block */
    int type_size;           /* bytes per block */
    sd_to_float_fn to_float; /* NULL: geometry known, arithmetic not implemented */
    sd_dot_fn dot;           /* NULL likewise */
    sd_tile_fn tile;         /* NULL likewise */
} sd_type_traits;

/* Traits of a ggml type id, or NULL when the id is unknown. */
const sd_type_traits *sd_type_get(int type);
/* Bytes of a row of n elements (n % block_size == 0), 0 on unknown types. */
size_t sd_row_bytes(int type, int64_t n);

/* Scalar conversions used across the core. */
float sd_f16_to_f32(uint16_t h);
uint16_t sd_f32_to_f16(float f);
float sd_bf16_to_f32(uint16_t h);

/* Select SIMD kernels for this CPU (idempotent, thread-safe). Called by model load. */
void sd_kernels_init(void);

/* Plain f32 kernels, SIMD-dispatched. */
float sd_dot_f32(const float *a, const float *b, int64_t n);
/* y[i] += a * x[i] */
void sd_axpy_f32(float *y, float a, const float *x, int64_t n);

#endif /* SD_QUANT_H */
