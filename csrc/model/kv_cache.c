/* kv_cache.c — the slot-addressed KV cache: per layer, the post-RoPE key and the value of each
 * slot, plus the RoPE position written there. Rollback is setting the length; accepting a path
 * of a draft tree is copying its slots together. */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "cpu/ops_cpu.h"
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
    kv->k = calloc(n, sd_kv_elt(kv));
    kv->v = calloc(n, sd_kv_elt(kv));
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
    free(kv->k);
    free(kv->v);
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
