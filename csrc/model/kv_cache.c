/* kv_cache.c — the slot-addressed KV cache: per layer, the post-RoPE key and the value of each
 * slot, plus the RoPE position written there. Rollback is setting the length; accepting a path
 * of a draft tree is copying its slots together. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "cpu/ops_cpu.h"
#include "util/mapfile.h"
#include "util/status.h"
#ifdef SD_WITH_CUDA
#include "../cuda/sd_cuda.h"
#endif

sd_status sd_kv_cache_create(sd_kv_cache **out, const sd_model *m, int n_slots) {
    *out = NULL;
    const sd_config *c = &m->cfg;
    if (n_slots < 1 || n_slots > c->context_length) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "cache size %d is out of range: must be in [1, %d] (the model's "
                            "context length)",
                            n_slots, c->context_length);
    }
    sd_kv_cache *kv = calloc(1, sizeof(*kv));
    if (kv == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory allocating a KV cache");
    }
    kv->capacity = n_slots;
    kv->stride = sd_kv_slots(n_slots);
    kv->n_layers = c->n_layers;
    kv->n_kv_heads = c->n_kv_heads;
    kv->head_dim = c->head_dim;
    size_t n =
        (size_t)c->n_layers * (size_t)kv->stride * (size_t)c->n_kv_heads * (size_t)c->head_dim;
    kv->pos = calloc((size_t)n_slots, sizeof(int32_t));
#ifdef SD_WITH_CUDA
    if (m->cuda != NULL) { /* keys and values on the device, positions here */
        sd_status st = kv->pos == NULL ? sd_set_error(SD_ERR_NOMEM, "out of memory")
                                       : sd_cuda_cache_create(&kv->cuda, m->cuda, n_slots);
        if (st != SD_OK) {
            sd_kv_cache_free(kv);
            return st;
        }
        *out = kv;
        return SD_OK;
    }
#endif
    /* zeroed: a slot never written (attended only by a caller's mask) holds finite values */
    kv->f16 = m->kv_f16;
    kv->bytes = n * sd_kv_elt(kv);
    kv->k = sd_alloc_zeroed(kv->bytes);
    kv->v = sd_alloc_zeroed(kv->bytes);
    if (kv->k == NULL || kv->v == NULL || kv->pos == NULL) {
        sd_kv_cache_free(kv);
        return sd_set_error(SD_ERR_NOMEM,
                            "out of memory allocating a KV cache of %d slots "
                            "(%zu MiB)",
                            n_slots, 2 * n * sd_kv_elt(kv) >> 20);
    }
    *out = kv;
    return SD_OK;
}

void sd_kv_cache_free(sd_kv_cache *kv) {
    if (kv == NULL) {
        return;
    }
#ifdef SD_WITH_CUDA
    sd_cuda_cache_free(kv->cuda);
#endif
    sd_free_zeroed(kv->k, kv->bytes);
    sd_free_zeroed(kv->v, kv->bytes);
    free(kv->pos);
    free(kv);
}

int sd_kv_cache_length(const sd_kv_cache *kv) {
    return kv->length;
}

int sd_kv_cache_capacity(const sd_kv_cache *kv) {
    return kv->capacity;
}

sd_status sd_kv_cache_set_length(sd_kv_cache *kv, int n) {
    if (n < 0 || n > kv->length) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "cannot roll the cache back to length %d: must be in [0, %d]", n,
                            kv->length);
    }
    kv->length = n;
    return SD_OK;
}

sd_status sd_kv_cache_skip(sd_kv_cache *kv, int n) {
    if (n < kv->length || n > kv->capacity) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "cannot skip the cache to length %d: must be in [%d, %d]", n,
                            kv->length, kv->capacity);
    }
    for (int s = kv->length; s < n; s++) {
        kv->pos[s] = s;
    }
    kv->length = n;
    return SD_OK;
}

sd_status sd_kv_cache_copy_slot(sd_kv_cache *kv, int dst, int src) {
    if (dst < 0 || src < 0 || dst >= kv->capacity || src >= kv->capacity) {
        return sd_set_error(SD_ERR_INVALID_ARG, "slot copy %d -> %d outside the cache of %d slots",
                            src, dst, kv->capacity);
    }
    if (dst == src) {
        return SD_OK;
    }
#ifdef SD_WITH_CUDA
    if (kv->cuda != NULL) {
        SD_TRY(sd_cuda_cache_copy_slot(kv->cuda, dst, src));
        kv->pos[dst] = kv->pos[src];
        return SD_OK;
    }
#endif
    const size_t row = (size_t)kv->head_dim * sd_kv_elt(kv);
    for (int l = 0; l < kv->n_layers; l++) {
        for (int h = 0; h < kv->n_kv_heads; h++) {
            const size_t d = sd_kv_row(kv, l, h, dst), s = sd_kv_row(kv, l, h, src);
            sd_key_copy(sd_kv_at(kv, kv->k, sd_kv_row(kv, l, h, 0)), kv->f16, dst, src,
                        kv->head_dim);
            memcpy(sd_kv_at(kv, kv->v, d), sd_kv_at(kv, kv->v, s), row);
        }
    }
    kv->pos[dst] = kv->pos[src];
    return SD_OK;
}

/* ---- prefix reuse: the caches of finished requests ------------------------------------------ */

#define SD_PREFIX_MIN 8 /* the shortest prefix worth taking a pooled cache for */

typedef struct {
    sd_kv_cache *kv;
    int32_t *toks; /* (kv->length) the tokens its slots hold */
    float *feat;   /* a drafter's features of those slots (kind fk), or NULL */
    sd_feat_kind fk;
    uint64_t used; /* when it was put, for least-recently-used eviction */
} pool_entry;

struct sd_kv_pool {
    pthread_mutex_t lock; /* guards everything below */
    int max;              /* the most entries kept (the model's prefix_cache) */
    pool_entry e[SD_PREFIX_CACHE_MAX];
    int n;
    uint64_t clock;
};

static void entry_free(pool_entry *e) {
    sd_kv_cache_free(e->kv);
    free(e->toks);
    free(e->feat);
    memset(e, 0, sizeof(*e));
}

static int same_kind(const sd_feat_kind *a, const sd_feat_kind *b) {
    if (a->hidden != b->hidden || a->n_aux != b->n_aux) {
        return 0;
    }
    for (int i = 0; i < a->n_aux; i++) {
        if (a->aux[i] != b->aux[i]) {
            return 0;
        }
    }
    return 1;
}

sd_status sd_kv_pool_create(struct sd_kv_pool **out, int max) {
    struct sd_kv_pool *pool = calloc(1, sizeof(*pool));
    if (pool == NULL || pthread_mutex_init(&pool->lock, NULL) != 0) {
        free(pool);
        *out = NULL;
        return sd_set_error(SD_ERR_NOMEM, "out of memory making the prefix cache");
    }
    pool->max = max;
    *out = pool;
    return SD_OK;
}

/* The least recently used entry (pool->n > 0). */
static int lru(const struct sd_kv_pool *pool) {
    int at = 0;
    for (int i = 1; i < pool->n; i++) {
        at = pool->e[i].used < pool->e[at].used ? i : at;
    }
    return at;
}

/* Removes entry i, moving the last into its place. */
static void remove_entry(struct sd_kv_pool *pool, int i) {
    pool->e[i] = pool->e[--pool->n];
    memset(&pool->e[pool->n], 0, sizeof(pool->e[pool->n]));
}

void sd_kv_pool_resize(struct sd_kv_pool *pool, int max) {
    pool_entry gone[SD_PREFIX_CACHE_MAX];
    int n_gone = 0;
    pthread_mutex_lock(&pool->lock);
    pool->max = max;
    while (pool->n > max) {
        const int at = lru(pool);
        gone[n_gone++] = pool->e[at];
        remove_entry(pool, at);
    }
    pthread_mutex_unlock(&pool->lock);
    for (int i = 0; i < n_gone; i++) { /* freed outside the lock, as in put */
        entry_free(&gone[i]);
    }
}

int sd_kv_pool_max(struct sd_kv_pool *pool) {
    pthread_mutex_lock(&pool->lock);
    const int max = pool->max;
    pthread_mutex_unlock(&pool->lock);
    return max;
}

void sd_kv_pool_free(struct sd_kv_pool *pool) {
    if (pool == NULL) {
        return;
    }
    for (int i = 0; i < pool->n; i++) {
        entry_free(&pool->e[i]);
    }
    pthread_mutex_destroy(&pool->lock);
    free(pool);
}

/* Copies slots [0, n) of src into dst (the same model's caches): each KV head's values row by
 * row, its keys as whole tiles (a tile's layout does not depend on the cache's size). */
static void copy_prefix(sd_kv_cache *dst, const sd_kv_cache *src, int n) {
    const size_t Dh = (size_t)src->head_dim, elt = sd_kv_elt(src);
    const size_t tiles = ((size_t)n + SD_KV_TILE - 1) / SD_KV_TILE;
    for (int l = 0; l < src->n_layers; l++) {
        for (int h = 0; h < src->n_kv_heads; h++) {
            memcpy(sd_kv_at(dst, dst->k, sd_kv_row(dst, l, h, 0)),
                   sd_kv_at(src, src->k, sd_kv_row(src, l, h, 0)), tiles * SD_KV_TILE * Dh * elt);
            memcpy(sd_kv_at(dst, dst->v, sd_kv_row(dst, l, h, 0)),
                   sd_kv_at(src, src->v, sd_kv_row(src, l, h, 0)), (size_t)n * Dh * elt);
        }
    }
    memcpy(dst->pos, src->pos, (size_t)n * sizeof(int32_t));
    dst->length = n;
}

sd_status sd_kv_pool_put(sd_model *m, sd_kv_cache *kv, const int32_t *toks, float *feat,
                         const sd_feat_kind *fk) {
    struct sd_kv_pool *pool = m->prefix;
    if (pool == NULL || kv->cuda != NULL || kv->length == 0) {
        sd_kv_cache_free(kv);
        free(feat);
        return SD_OK;
    }
    int32_t *copy = malloc((size_t)kv->length * sizeof(int32_t));
    if (copy == NULL) {
        sd_kv_cache_free(kv);
        free(feat);
        return sd_set_error(SD_ERR_NOMEM, "out of memory keeping a cache for prefix reuse");
    }
    memcpy(copy, toks, (size_t)kv->length * sizeof(int32_t));
    pool_entry old = {0};
    pthread_mutex_lock(&pool->lock);
    if (pool->max > 0) {
        int at = pool->n;
        if (pool->n >= pool->max) { /* full: the least recently used goes */
            at = lru(pool);
            old = pool->e[at];
        } else {
            pool->n++;
        }
        pool_entry *e = &pool->e[at];
        memset(e, 0, sizeof(*e));
        e->kv = kv;
        e->toks = copy;
        e->feat = feat;
        if (feat != NULL) {
            e->fk = *fk;
        }
        e->used = ++pool->clock;
        kv = NULL;
        copy = NULL;
        feat = NULL;
    }
    pthread_mutex_unlock(&pool->lock);
    entry_free(&old); /* outside the lock */
    sd_kv_cache_free(kv);
    free(copy);
    free(feat);
    return SD_OK;
}

sd_status sd_kv_pool_take(sd_model *m, const int32_t *toks, int n, int max_reuse, int capacity,
                          const sd_feat_kind *want, sd_kv_cache **out, int *reused, float **feat) {
    *out = NULL;
    *reused = 0;
    if (feat != NULL) {
        *feat = NULL;
    }
    struct sd_kv_pool *pool = m->prefix;
    if (pool == NULL || max_reuse <= 0) {
        return SD_OK;
    }
    pthread_mutex_lock(&pool->lock);
    int best = -1, best_len = 0;
    for (int i = 0; i < pool->n; i++) {
        const pool_entry *e = &pool->e[i];
        const int lim = e->kv->length < n ? e->kv->length : n;
        int j = 0;
        while (j < lim && e->toks[j] == toks[j]) {
            j++;
        }
        const int fits = want == NULL || (e->feat != NULL && same_kind(&e->fk, want));
        if (j > best_len && e->kv->f16 == m->kv_f16 && fits) {
            best = i;
            best_len = j;
        }
    }
    /* a short match (a shared start-of-text token) would cost another conversation its cache
     * for little: only a prefix of SD_PREFIX_MIN tokens, or all the request can reuse */
    if (best_len < SD_PREFIX_MIN && best_len < max_reuse) {
        best = -1;
    }
    pool_entry e = {0};
    if (best >= 0) { /* it leaves the pool: the request owns it */
        e = pool->e[best];
        remove_entry(pool, best);
    }
    pthread_mutex_unlock(&pool->lock);
    if (best < 0) {
        return SD_OK;
    }
    const int keep = best_len < max_reuse ? best_len : max_reuse;
    free(e.toks);
    if (want != NULL) { /* the request's now, with the cache */
        *feat = e.feat;
        e.feat = NULL;
    }
    free(e.feat);
    if (e.kv->capacity >= capacity) {
        e.kv->length = keep;
        *out = e.kv;
        *reused = keep;
        return SD_OK;
    }
    /* into a larger cache; without the memory for both, no reuse (a fresh cache may fit) */
    if (sd_kv_cache_create(out, m, capacity) == SD_OK) {
        copy_prefix(*out, e.kv, keep);
        *reused = keep;
    } else if (want != NULL) {
        free(*feat);
        *feat = NULL;
    }
    sd_kv_cache_free(e.kv);
    return SD_OK;
}
