/* acts.h — the data the CPU row kernels share: activations quantized for the integer kernels,
 * a batch of activations, and the kernel signatures. Types only, so the portable kernels
 * (quant_blocks.c), the x86 twins and the kernel table (quant.c) all build on it. */
#ifndef SD_ACTS_H
#define SD_ACTS_H

#include <stddef.h>
#include <stdint.h>

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

#endif /* SD_ACTS_H */
