/* dummy.h — random weights of any shape, for benchmarks without a file (the idea of vLLM's
 * load_format="dummy"). Byte i of tensor `tensor` is a pure function of (seed, tensor, i), so
 * the CPU fill (dummy.c) and the CUDA kernel (cuda/ops.cu) build the same model on either
 * device. Float types hold uniform values in [-scale, scale]; quantized blocks hold random
 * quants with their scale fields set so values span about the same range. */
#ifndef SD_DUMMY_H
#define SD_DUMMY_H

#include <stdint.h>

#include "util/hd.h"

/* Element i of a float-typed tensor (F32, F16 or BF16) as float. */
SD_HD float sd_dummy_value(uint64_t seed, uint64_t tensor, uint64_t i, float scale) {
    return (float)((2.0 * sd_hd_uniform(seed, tensor, i) - 1.0) * (double)scale);
}

SD_HD void sd_dummy_put_f16(uint8_t *p, float v) {
    const uint16_t h = sd_hd_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* Block `b` (type_size bytes) of a quantized tensor of ggml type `type`: random bytes, then
 * the f16 scales of the format so that the values lie in about [-scale, scale]. Returns 0 for
 * a type it does not know (nothing written). */
SD_HD int sd_dummy_block(uint8_t *blk, int type, int type_size, uint64_t seed, uint64_t tensor,
                         uint64_t b, float scale) {
    for (int j = 0; j < type_size; j += 8) {
        const uint64_t r = sd_hd_random64(seed, tensor, b * 32u + (uint64_t)(j / 8));
        for (int k = 0; k < 8 && j + k < type_size; k++) {
            blk[j + k] = (uint8_t)(r >> (8 * k));
        }
    }
    switch (type) {
    case 2: sd_dummy_put_f16(blk, scale / 8.0f); return 1; /* Q4_0: d (q - 8) */
    case 3:                                                /* Q4_1: d q + m */
        sd_dummy_put_f16(blk, 2.0f * scale / 15.0f);
        sd_dummy_put_f16(blk + 2, -scale);
        return 1;
    case 6: sd_dummy_put_f16(blk, scale / 16.0f); return 1; /* Q5_0 */
    case 7:                                                 /* Q5_1 */
        sd_dummy_put_f16(blk, 2.0f * scale / 31.0f);
        sd_dummy_put_f16(blk + 2, -scale);
        return 1;
    case 8: sd_dummy_put_f16(blk, scale / 127.0f); return 1; /* Q8_0 */
    case 12:                                                 /* Q4_K: d sc q - dmin m */
        sd_dummy_put_f16(blk, 2.0f * scale / (15.0f * 63.0f));
        sd_dummy_put_f16(blk + 2, scale / 63.0f);
        return 1;
    case 13: /* Q5_K */
        sd_dummy_put_f16(blk, 2.0f * scale / (31.0f * 63.0f));
        sd_dummy_put_f16(blk + 2, scale / 63.0f);
        return 1;
    case 14: sd_dummy_put_f16(blk + 208, scale / 4096.0f); return 1; /* Q6_K: d sc (q - 32) */
    default: return 0;
    }
}

#endif /* SD_DUMMY_H */
