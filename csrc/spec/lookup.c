/* lookup.c — the n-gram matcher of prompt lookup (see lookup.h), a pure function of the text;
 * the drafter around it is spec/drafters/prompt_lookup.c. */
#include "spec/lookup.h"

#include <string.h>

/* The length of the common suffix of h[0 .. end) and h[0 .. len), end < len, counted from n
 * (the first n tokens are known to agree) up to SD_LOOKUP_EXTENT_MAX. */
static int extent_of(const int32_t *h, int len, int end, int n) {
    int e = n;
    while (e < SD_LOOKUP_EXTENT_MAX && end - e - 1 >= 0 && h[end - e - 1] == h[len - e - 1]) {
        e++;
    }
    return e;
}

int sd_lookup_draft(int32_t *draft, int *n_match, int *extent, const int32_t *h, int len,
                    int max_ngram, int min_ngram, int k) {
    *n_match = 0;
    *extent = 0;
    for (int n = max_ngram; n >= min_ngram; n--) {
        if (n >= len) {
            continue;
        }
        const int32_t *tail = h + len - n;
        int best = -1, best_e = 0;
        for (int i = len - n - 1; i >= 0; i--) { /* latest first: it wins ties */
            if (h[i] == tail[0] && memcmp(h + i, tail, (size_t)n * sizeof(int32_t)) == 0) {
                const int e = extent_of(h, len, i + n, n);
                if (e > best_e) {
                    best = i;
                    best_e = e;
                    if (e == SD_LOOKUP_EXTENT_MAX) {
                        break;
                    }
                }
            }
        }
        if (best >= 0) {
            const int from = best + n, p = len - from; /* p >= 1 */
            for (int j = 0; j < k; j++) {
                draft[j] = j < p ? h[from + j] : draft[j - p];
            }
            *n_match = n;
            *extent = best_e;
            return k;
        }
    }
    return 0;
}
