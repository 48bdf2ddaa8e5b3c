/* sampler.c — argmax and the counter-based RNG (hd.h: the same function
 * the CUDA kernels draw with). */
#include "spec/sampler.h"

#include "cpu/ops_cpu.h"
#include "util/hd.h"

double sd_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return sd_hd_uniform(seed, stream, index);
}

int sd_argmax(const float *logits, int n) {
    return (int)sd_argmax_f32(logits, n);
}
