/* sampler.c — argmax, temperature sampling and the counter-based RNG (hd.h: the same function
 * the CUDA kernels draw with). */
#include "spec/sampler.h"

#include <math.h>

#include "util/hd.h"

double sd_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return sd_hd_uniform(seed, stream, index);
}

int sd_argmax(const float *logits, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

int sd_sample_temperature(const float *logits, int n, float temperature, double u) {
    float mx = logits[sd_argmax(logits, n)];
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        sum += exp((double)(logits[i] - mx) / temperature);
    }
    double target = u * sum, acc = 0.0;
    int last = 0;
    for (int i = 0; i < n; i++) {
        double p = exp((double)(logits[i] - mx) / temperature);
        if (p > 0.0) {
            last = i;
        }
        acc += p;
        if (acc > target) {
            return i;
        }
    }
    return last; /* rounding left target just above the total: the last nonzero entry */
}
