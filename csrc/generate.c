/* generate.c — the decoding loop in C: prefill the prompt, then pick a token from the last
 * logits, feed it back, repeat. Speculative decoding will replace the one-token step with
 * draft -> verify -> accept; this plain loop is its reference. */
#include <stdlib.h>

#include "model.h"
#include "sampler.h"
#include "status.h"

sd_generate_params sd_generate_default_params(void) {
    sd_generate_params p;
    p.max_new_tokens = 16;
    p.temperature = 0.0f;
    p.seed = 0;
    p.stop_ids = NULL;
    p.n_stop_ids = 0;
    return p;
}

static int is_stop(const sd_generate_params *p, int32_t tok) {
    for (int i = 0; i < p->n_stop_ids; i++) {
        if (p->stop_ids[i] == tok) {
            return 1;
        }
    }
    return 0;
}

sd_status sd_generate(int32_t *out, int *n_out, sd_model *m, const int32_t *prompt, int n_prompt,
                      const sd_generate_params *p) {
    *n_out = 0;
    const sd_config *c = &m->cfg;
    if (n_prompt < 1 || prompt == NULL) {
        return sd_set_error(SD_ERR_INVALID_ARG, "the prompt must hold at least one token");
    }
    if (p->max_new_tokens < 0) {
        return sd_set_error(SD_ERR_INVALID_ARG, "max_new_tokens must be >= 0, got %d",
                            p->max_new_tokens);
    }
    if (!(p->temperature >= 0.0f)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "temperature must be >= 0, got %g",
                            (double)p->temperature);
    }
    if ((int64_t)n_prompt + p->max_new_tokens > c->context_length) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "prompt (%d tokens) + max_new_tokens (%d) exceeds the context length "
                            "%d",
                            n_prompt, p->max_new_tokens, c->context_length);
    }
    if (p->max_new_tokens == 0) {
        return SD_OK;
    }
    sd_kv_cache *kv = NULL;
    float *logits = malloc((size_t)c->vocab_size * sizeof(float));
    sd_status st = logits == NULL ? sd_set_error(SD_ERR_NOMEM, "out of memory") : SD_OK;
    if (st == SD_OK) {
        /* the last emitted token is never fed back, so one slot fewer suffices */
        st = sd_kv_cache_create(&kv, m, n_prompt + p->max_new_tokens - 1);
    }
    sd_batch b = {0};
    b.n_tokens = n_prompt;
    b.tokens = prompt;
    b.n_logits = 1;
    if (st == SD_OK) {
        st = sd_forward(m, kv, &b, logits);
    }
    int n = 0;
    while (st == SD_OK) {
        int32_t tok;
        if (p->temperature == 0.0f) {
            tok = sd_argmax(logits, c->vocab_size);
        } else {
            double u = sd_rng_uniform(p->seed, 0, (uint64_t)n);
            tok = sd_sample_temperature(logits, c->vocab_size, p->temperature, u);
        }
        out[n++] = tok;
        if (n >= p->max_new_tokens || is_stop(p, tok)) {
            break;
        }
        b.n_tokens = 1;
        b.tokens = &out[n - 1];
        st = sd_forward(m, kv, &b, logits);
    }
    *n_out = n;
    sd_kv_cache_free(kv);
    free(logits);
    return st;
}
