/* lookup_history.c — earlier requests' outputs for prompt lookup (see lookup_history.h): a ring
 * of tokens and a hash table of its n-grams, under one lock. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "spec/drafters/lookup_history.h"
#include "util/status.h"

/* Slots probed from an n-gram's hash; when all hold other n-grams still in the history, an
 * insert overwrites the one seen longest ago (a cache: an n-gram lost so drafts nothing). */
#define SD_HISTORY_PROBES 16

struct sd_lookup_history {
    pthread_mutex_t lock;
    int64_t cap;    /* tokens kept, a power of two */
    int32_t *ring;  /* (cap) the token at absolute position p is ring[p & (cap - 1)]; -1 ends a
                     * request */
    int64_t end;    /* absolute positions written so far */
    int64_t slots;  /* table size, a power of two (4 cap: three n-grams a token) */
    int64_t *table; /* (slots) an n-gram's latest occurrence: (1 + the absolute position after
                     * it) << 3 | its length; 0 empty */
};

sd_status sd_lookup_history_create(sd_lookup_history **out, int tokens) {
    *out = NULL;
    if (tokens < 1 || tokens > SD_LOOKUP_HISTORY_MAX_TOKENS) {
        return sd_set_error(SD_ERR_INVALID_ARG, "history must be in [1, %d] tokens, got %d",
                            SD_LOOKUP_HISTORY_MAX_TOKENS, tokens);
    }
    int64_t cap = 64;
    while (cap < (int64_t)tokens) {
        cap *= 2;
    }
    sd_lookup_history *hs = calloc(1, sizeof(*hs));
    if (hs != NULL) {
        hs->cap = cap;
        hs->slots = 4 * cap;
        hs->ring = malloc((size_t)cap * sizeof(int32_t));
        hs->table = calloc((size_t)hs->slots, sizeof(int64_t));
    }
    if (hs == NULL || hs->ring == NULL || hs->table == NULL ||
        pthread_mutex_init(&hs->lock, NULL) != 0) {
        if (hs != NULL) {
            free(hs->ring);
            free(hs->table);
        }
        free(hs);
        return sd_set_error(SD_ERR_NOMEM, "out of memory for a lookup history of %d tokens",
                            tokens);
    }
    *out = hs;
    return SD_OK;
}

void sd_lookup_history_free(sd_lookup_history *hs) {
    if (hs != NULL) {
        pthread_mutex_destroy(&hs->lock);
        free(hs->ring);
        free(hs->table);
        free(hs);
    }
}

/* The hash of the n tokens g[0 .. n) (n folded in: a 2-gram and a 3-gram never share an
 * entry's meaning, only, rarely, a slot). */
static uint64_t ngram_hash(const int32_t *g, int n) {
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(n + 1);
    for (int i = 0; i < n; i++) {
        x = (x ^ (uint32_t)g[i]) * 0xFF51AFD7ED558CCDull;
        x ^= x >> 33;
    }
    return x;
}

static int32_t at(const sd_lookup_history *hs, int64_t p) {
    return hs->ring[p & (hs->cap - 1)];
}

/* Whether the history still holds an occurrence of g[0 .. n) ending before position v. */
static int holds(const sd_lookup_history *hs, int64_t v, const int32_t *g, int n) {
    if (v - n < hs->end - hs->cap + 1 || v > hs->end) { /* overwritten, or not yet written */
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (at(hs, v - n + i) != g[i]) {
            return 0;
        }
    }
    return 1;
}

/* Whether table entry e is an occurrence of g[0 .. n) the history still holds. */
static int entry_is(const sd_lookup_history *hs, int64_t e, const int32_t *g, int n) {
    return e != 0 && (int)(e & 7) == n && holds(hs, (e >> 3) - 1, g, n);
}

/* Whether table entry e (nonzero) points into tokens the history no longer holds. */
static int entry_stale(const sd_lookup_history *hs, int64_t e) {
    return (e >> 3) - 1 - (e & 7) < hs->end - hs->cap + 1;
}

void sd_lookup_history_add(sd_lookup_history *hs, const int32_t *t, int n) {
    if (n > hs->cap - 1) {
        t += n - (hs->cap - 1);
        n = (int)(hs->cap - 1);
    }
    if (n < 1) {
        return;
    }
    pthread_mutex_lock(&hs->lock);
    const int64_t start = hs->end, mask = hs->slots - 1;
    for (int i = 0; i < n; i++) {
        hs->ring[(start + i) & (hs->cap - 1)] = t[i];
    }
    hs->ring[(start + n) & (hs->cap - 1)] = -1;
    hs->end = start + n + 1;
    /* every n-gram with a token after it, earliest first, so the latest occurrence wins: into
     * the first probed slot that is empty, holds the same n-gram or a stale one; else over the
     * probed entry seen longest ago */
    for (int v = SD_LOOKUP_HISTORY_MIN; v < n; v++) {
        for (int g = SD_LOOKUP_HISTORY_MIN; g <= SD_LOOKUP_HISTORY_MAX && g <= v; g++) {
            const int32_t *gram = t + v - g;
            const int64_t home = (int64_t)(ngram_hash(gram, g) & (uint64_t)mask);
            int64_t put = -1, oldest = home;
            for (int j = 0; j < SD_HISTORY_PROBES && put < 0; j++) {
                const int64_t slot = (home + j) & mask, e = hs->table[slot];
                if (e == 0 || entry_stale(hs, e) || entry_is(hs, e, gram, g)) {
                    put = slot;
                } else if (e < hs->table[oldest]) {
                    oldest = slot;
                }
            }
            put = put >= 0 ? put : oldest;
            hs->table[put] = (start + v + 1) << 3 | g;
        }
    }
    pthread_mutex_unlock(&hs->lock);
}

int sd_lookup_history_draft(sd_lookup_history *hs, int32_t *draft, int *n_match, const int32_t *h,
                            int len, int k) {
    *n_match = 0;
    int got = 0;
    pthread_mutex_lock(&hs->lock);
    for (int g = SD_LOOKUP_HISTORY_MAX; g >= SD_LOOKUP_HISTORY_MIN && got == 0; g--) {
        if (g > len) {
            continue;
        }
        const int32_t *tail = h + len - g;
        const int64_t slot = (int64_t)(ngram_hash(tail, g) & (uint64_t)(hs->slots - 1));
        for (int j = 0; j < SD_HISTORY_PROBES; j++) {
            const int64_t e = hs->table[(slot + j) & (hs->slots - 1)];
            if (e == 0) {
                break;
            }
            if (entry_is(hs, e, tail, g)) {
                for (int64_t p = (e >> 3) - 1; got < k && p < hs->end && at(hs, p) >= 0; p++) {
                    draft[got++] = at(hs, p);
                }
                *n_match = got > 0 ? g : 0;
                break;
            }
        }
    }
    pthread_mutex_unlock(&hs->lock);
    return got;
}
