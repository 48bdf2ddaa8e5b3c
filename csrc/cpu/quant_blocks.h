/* quant_blocks.h — ggml's quantized block formats: portable dequantization, dot products with
 * quantized activations and matmul tiles (the twins of the AVX2 kernels in simd_avx2_q.c), and
 * the quantization of activations. Layouts as in ggml-common.h; every f16 field is read with
 * memcpy (blocks are not aligned). */
#ifndef SD_QUANT_BLOCKS_H
#define SD_QUANT_BLOCKS_H

#include "format/blocks.h"
#include "cpu/acts.h"

/* The portable quantization of activation blocks (an sd_quantize_q8_fn; sd_quantize_q8 of
 * quant.h picks this or its AVX2 twin, which gives the same bytes). */
void sd_quantize_q8_ref(int8_t *q, float *d, float *s, float *e, const float *x, int64_t nb);

/* Decode sub-block `sub` (0 <= sub < block_size / 32) of the block at `blk`. */
typedef void (*sd_decode_fn)(sd_sub32 *out, const uint8_t *blk, int sub);

#define SD_DECLARE_QUANT(sfx)                                                                      \
    void sd_decode_##sfx(sd_sub32 *out, const uint8_t *blk, int sub);                              \
    void sd_to_float_##sfx(float *dst, const void *src, int64_t n);                                \
    float sd_dot_q8_##sfx(const void *w, sd_q8_row x, int64_t n);                                  \
    void sd_tile_##sfx(float *y, int64_t ldy, const void *w, size_t row_bytes, int64_t nrows,      \
                       const sd_acts *a, int T, int64_t n, const float *bias, int accumulate);

SD_DECLARE_QUANT(q4_0)
SD_DECLARE_QUANT(q4_1)
SD_DECLARE_QUANT(q5_0)
SD_DECLARE_QUANT(q5_1)
SD_DECLARE_QUANT(q8_0)
SD_DECLARE_QUANT(q4_K)
SD_DECLARE_QUANT(q5_K)
SD_DECLARE_QUANT(q6_K)

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block's 12 packed bytes. */
void sd_k4_scale_min(int j, const uint8_t *scales, uint8_t *sc, uint8_t *m);

#endif /* SD_QUANT_BLOCKS_H */
