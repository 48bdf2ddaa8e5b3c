/* head_logits.c — a drafter head's teacher-forced logits (sd_head_draft_logits): the target
 * run once over a text for the features the head reads, then the head over every position at
 * once (an EAGLE head as a one-layer model with its own cache, Medusa's heads at the final
 * hidden states). The tests' and users' check of a head against its published statement. */
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/head.h"
#include "util/status.h"

/* Medusa's (heads, n, V): head i at every position's final-normed hidden state. */
static sd_status medusa_draft_logits(const sd_head *h, sd_model *target, const int32_t *tokens,
                                     int n, float *out) {
    sd_kv_cache *kv = NULL;
    float *hid = malloc((size_t)n * (size_t)target->cfg.hidden_size * sizeof(float));
    sd_status st =
        hid != NULL ? SD_OK : sd_set_error(SD_ERR_NOMEM, "out of memory for draft logits");
    if (st == SD_OK) {
        st = sd_kv_cache_create(&kv, target, n);
    }
    if (st == SD_OK) {
        sd_batch b = {0};
        b.n_tokens = n;
        b.tokens = tokens;
        b.hidden = hid;
        st = sd_forward(target, kv, &b, NULL);
    }
    if (st == SD_OK) {
        st = sd_head_medusa_logits(h, target, n, hid, out);
    }
    sd_kv_cache_free(kv);
    free(hid);
    return st;
}

sd_status sd_head_draft_logits(const sd_head *h, sd_model *target, const int32_t *tokens, int n,
                               int window, float *out) {
    if (window < 0) {
        return sd_set_error(SD_ERR_INVALID_ARG, "window must be >= 0 (0: the whole text), got %d",
                            window);
    }
    if (n < 2) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "draft logits need at least 2 tokens (row t predicts token t + 2)");
    }
    SD_TRY(sd_head_check(h, target));
    if (sd_head_kind_of(h) == SD_HEAD_MEDUSA) {
        return medusa_draft_logits(h, target, tokens, n, out);
    }
    const int D = target->cfg.hidden_size, V = target->cfg.vocab_size;
    const int W = sd_head_feature_width(h, target);
    int32_t aux_layers[3];
    const int n_aux = sd_head_aux_layers(h, target, aux_layers);
    sd_kv_cache *kv = NULL, *hkv = NULL;
    sd_model *hm = NULL;
    float *fbuf = malloc((size_t)n * (size_t)(D + 3 * D) * sizeof(float));
    float *feat = malloc((size_t)n * (size_t)W * sizeof(float));
    float *x = malloc((size_t)n * (size_t)D * sizeof(float));
    sd_status st = fbuf != NULL && feat != NULL && x != NULL
                       ? SD_OK
                       : sd_set_error(SD_ERR_NOMEM, "out of memory for draft logits");
    if (st == SD_OK) {
        st = sd_kv_cache_create(&kv, target, n);
    }
    if (st == SD_OK) { /* the target's features of every position */
        sd_batch b = {0};
        b.n_tokens = n;
        b.tokens = tokens;
        b.hidden = n_aux == 0 ? fbuf : NULL;
        b.aux = n_aux > 0 ? fbuf : NULL;
        b.aux_layers = aux_layers;
        b.n_aux = n_aux;
        st = sd_forward(target, kv, &b, NULL);
    }
    if (st == SD_OK) {
        for (int t = 0; t < n; t++) { /* position-major rows */
            for (int i = 0; i < (n_aux > 0 ? n_aux : 1); i++) {
                memcpy(feat + (size_t)t * (size_t)W + (size_t)i * (size_t)D,
                       fbuf + ((size_t)i * (size_t)n + (size_t)t) * (size_t)D,
                       (size_t)D * sizeof(float));
            }
        }
        st = sd_head_bind(&hm, h, target);
    }
    if (st == SD_OK) {
        hm->cfg.sliding_window = window;
        st = sd_kv_cache_create(&hkv, hm, n - 1);
    }
    if (st == SD_OK) {
        st = sd_head_rows(h, hm, n - 1, tokens + 1, feat, 1, x);
    }
    if (st == SD_OK) {
        sd_batch b = {0};
        b.n_tokens = n - 1;
        b.tokens = tokens + 1;
        b.embd = x;
        b.n_logits = n - 1;
        st = sd_forward(hm, hkv, &b, out); /* (n - 1, Vd), spread to V below */
    }
    if (st == SD_OK) {
        st = sd_head_map_logits(h, V, out, n - 1, out);
    }
    sd_kv_cache_free(hkv);
    sd_model_free(hm);
    sd_kv_cache_free(kv);
    free(fbuf);
    free(feat);
    free(x);
    return st;
}
