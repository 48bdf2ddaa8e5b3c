/* sampler.c — argmax, a row's top ids and the counter-based RNG (hd.h: the same function
 * the CUDA kernels draw with). */
#include "spec/sampler.h"

#include "cpu/ops_cpu.h"
#include "specdec.h"
#include "util/hd.h"

_Static_assert(SD_RECYCLE_MAX_TOP <= SD_TOP_IDS_MAX && SD_MEDUSA_MAX_RANK <= SD_TOP_IDS_MAX &&
                   SD_MAX_TOP_LOGPROBS <= SD_TOP_IDS_MAX,
               "sd_top_ids's callers ask for at most SD_TOP_IDS_MAX ids");

double sd_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return sd_hd_uniform(seed, stream, index);
}

int sd_argmax(const float *logits, int n) {
    return (int)sd_argmax_f32(logits, n);
}

void sd_top_ids(int32_t *best, int top, const float *row, int V) {
    float val[SD_TOP_IDS_MAX];
    int n = 0;
    for (int i = 0; i < V; i++) {
        if (n == top && (i & 31) == 0 && i + 32 <= V && !sd_any_above32(row + i, val[top - 1])) {
            i += 31; /* nothing above the last kept value: the block changes nothing */
            continue;
        }
        const float x = row[i];
        if (n == top && !(x > val[top - 1])) {
            continue;
        }
        int j = n < top ? n++ : top - 1;
        while (j > 0 && x > val[j - 1]) {
            val[j] = val[j - 1];
            best[j] = best[j - 1];
            j--;
        }
        val[j] = x;
        best[j] = i;
    }
    for (int j = n; j < top; j++) {
        best[j] = -1;
    }
}
