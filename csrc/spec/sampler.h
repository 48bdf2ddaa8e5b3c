/* sampler.h — greedy argmax, and the counter-based random numbers behind every draw: a draw is
 * a pure function of seed and counters, so runs reproduce whatever the thread count or device.
 * Drawing from a processed distribution is verify.h's sd_sample_probs. */
#ifndef SD_SAMPLER_H
#define SD_SAMPLER_H

#include <stdint.h>

/* Uniform in [0, 1) keyed by (seed, stream, index); 53 random bits. */
double sd_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);

/* Index of the largest logit; the lowest index wins ties. */
int sd_argmax(const float *logits, int n);

#endif /* SD_SAMPLER_H */
