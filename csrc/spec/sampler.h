/* sampler.h — greedy argmax, a row's top ids, and the counter-based random numbers behind every
 * draw: a draw is a pure function of seed and counters, so runs reproduce whatever the thread
 * count or device. Drawing from a processed distribution is verify.h's sd_sample_probs. */
#ifndef SD_SAMPLER_H
#define SD_SAMPLER_H

#include <stdint.h>

/* Uniform in [0, 1) keyed by (seed, stream, index); 53 random bits. */
double sd_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);

/* Index of the largest logit; the lowest index wins ties. */
int sd_argmax(const float *logits, int n);

/* The ids of the `top` (1 .. SD_TOP_IDS_MAX) largest of row[0 .. V), the larger first, ties to
 * the lower id, -1 past V (the CPU's computation, and the twin of the device's
 * sd_cuda_row_top). */
#define SD_TOP_IDS_MAX 32
void sd_top_ids(int32_t *best, int top, const float *row, int V);

/* Whether any of x[0 .. 32) is above thr (a NaN is not): a scan for a row's largest values
 * passes such a block at once, one vectorised test in place of 32 branches, when nothing in it
 * could enter. */
static inline int sd_any_above32(const float *x, float thr) {
    int any = 0;
    for (int l = 0; l < 32; l++) {
        any |= x[l] > thr;
    }
    return any;
}

#endif /* SD_SAMPLER_H */
