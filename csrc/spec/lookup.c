/* lookup.c — the n-gram matcher of prompt lookup (see lookup.h), a pure function of the text;
 * the drafter around it is spec/drafters/prompt_lookup.c. */
#include "spec/lookup.h"

#include <string.h>

#include "spec/drafters/lookup_history.h"

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

int sd_lookup_draft_or_history(int32_t *draft, int *n_match, int *extent, int *from_history,
                               const int32_t *h, int len, int max_ngram, int min_ngram, int k,
                               struct sd_lookup_history *hs) {
    const int n = sd_lookup_draft(draft, n_match, extent, h, len, max_ngram, min_ngram, k);
    *from_history = 0;
    if (hs != NULL && *n_match < SD_LOOKUP_HISTORY_MIN) {
        int nh = 0;
        const int kh = sd_lookup_history_draft(hs, draft, &nh, h, len, k);
        if (kh > 0) { /* (a search without a match writes nothing) */
            *from_history = 1;
            return kh;
        }
    }
    return n;
}

/* The continuation of the occurrence ending at `from` (< len), periodic past the text's end. */
static void continuation(int32_t *draft, const int32_t *h, int len, int from, int k) {
    const int p = len - from; /* >= 1 */
    for (int j = 0; j < k; j++) {
        draft[j] = j < p ? h[from + j] : draft[j - p];
    }
}

int sd_lookup_branches(int32_t *draft, int *lens, int *n_match, int *extent, const int32_t *h,
                       int len, int max_ngram, int min_ngram, int k, int b) {
    int found = sd_lookup_draft(draft, n_match, extent, h, len, max_ngram, min_ngram, k) > 0;
    if (!found) {
        return 0;
    }
    lens[0] = k;
    /* each further branch: one pass over the occurrences, the best whose first continuation
     * token is new (n first, then extent, then the latest) */
    while (found < b) {
        int best = -1, best_n = 0, best_e = 0;
        for (int n = max_ngram; n >= min_ngram && best < 0; n--) {
            if (n >= len) {
                continue;
            }
            const int32_t *tail = h + len - n;
            for (int i = len - n - 1; i >= 0; i--) {
                if (h[i] != tail[0] || memcmp(h + i, tail, (size_t)n * sizeof(int32_t)) != 0) {
                    continue;
                }
                int fresh = 1;
                for (int j = 0; j < found && fresh; j++) {
                    fresh = draft[(size_t)j * (size_t)k] != h[i + n];
                }
                const int e = fresh ? extent_of(h, len, i + n, n) : 0;
                if (fresh && e > best_e) {
                    best = i;
                    best_n = n;
                    best_e = e;
                }
            }
        }
        if (best < 0) {
            break;
        }
        continuation(draft + (size_t)found * (size_t)k, h, len, best + best_n, k);
        lens[found++] = k;
    }
    return found;
}

int sd_lookup_bucket(int n_match, int extent, int max_ngram) {
    return extent < SD_LOOKUP_LONG ? n_match : max_ngram + (extent < SD_LOOKUP_LONG_MAX ? 1 : 2);
}

double sd_lookup_rate(double accepted, double rejected, int bucket, int max_ngram, double *prior) {
    const double w = bucket > max_ngram ? SD_LOOKUP_LONG * (bucket - max_ngram) : 0.0;
    if (prior != NULL) {
        *prior = w;
    }
    return (accepted + w + 1.0) / (accepted + rejected + w + 2.0);
}

int sd_lookup_side_draft(const sd_lookup_side *s, struct sd_lookup_history *hs, int32_t *draft,
                         const int32_t *h, int len, int k, int *bucket, double *rate) {
    int n_match = 0, extent = 0, from_history = 0;
    const int n = sd_lookup_draft_or_history(draft, &n_match, &extent, &from_history, h, len,
                                             SD_LOOKUP_SIDE_NGRAM, 1, k, hs);
    if (from_history) {
        const int b = SD_LOOKUP_SIDE_HISTORY;
        *bucket = b;
        *rate = (s->acc[b] + 1.0) / (s->acc[b] + s->rej[b] + 2.0);
        return n;
    }
    *bucket = sd_lookup_bucket(n_match, extent, SD_LOOKUP_SIDE_NGRAM);
    *rate = sd_lookup_rate(s->acc[*bucket], s->rej[*bucket], *bucket, SD_LOOKUP_SIDE_NGRAM, NULL);
    return n;
}

void sd_lookup_side_count(sd_lookup_side *s, int bucket, int accepted, int drafted) {
    s->acc[bucket] += accepted;
    s->rej[bucket] += accepted < drafted ? 1.0 : 0.0;
}
