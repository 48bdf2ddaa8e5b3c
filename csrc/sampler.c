/* sampler.c — argmax, temperature sampling and the counter-based RNG (SplitMix64 finaliser over
 * the key, the construction of Steele et al., "Fast splittable pseudorandom number generators",
 * OOPSLA 2014). */
#include "sampler.h"

#include <math.h>

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double sd_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    uint64_t h = mix64(mix64(mix64(seed) ^ stream) ^ index);
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
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
