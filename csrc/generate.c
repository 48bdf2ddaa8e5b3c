/* generate.c — the decoding loop in C: prefill the prompt, then pick a token from the last
 * logits, feed it back, repeat. Speculative decoding will replace the one-token step with
 * draft -> verify -> accept; this plain loop is its reference. */
#include <stdlib.h>
#include <string.h>

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
    p.stop_strings = NULL;
    p.stop_lens = NULL;
    p.n_stop_strings = 0;
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

/* The output text so far, to watch for stop strings: bytes of the emitted tokens' pieces. */
typedef struct {
    char *buf;
    size_t len, cap, longest; /* longest: of the stop strings */
} text_watch;

/* Append token `tok`'s piece; 1 if a stop string now occurs in text that this piece touches. */
static int watch_token(text_watch *w, const sd_model *m, const sd_generate_params *p, int32_t tok,
                       sd_status *st) {
    const size_t a = m->piece_off[tok], n = m->piece_off[tok + 1] - a;
    if (w->len + n > w->cap) {
        size_t cap = (w->len + n) * 2 + 64;
        char *b = realloc(w->buf, cap);
        if (b == NULL) {
            *st = sd_set_error(SD_ERR_NOMEM, "out of memory watching for stop strings");
            return 0;
        }
        w->buf = b;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, m->pieces + a, n);
    const size_t old = w->len;
    w->len += n;
    /* a new occurrence must end inside the new piece: start looking longest - 1 bytes back */
    const size_t from = old >= w->longest ? old - w->longest + 1 : 0;
    for (int i = 0; i < p->n_stop_strings; i++) {
        if (p->stop_lens[i] > 0 &&
            memmem(w->buf + from, w->len - from, p->stop_strings[i], p->stop_lens[i]) != NULL) {
            return 1;
        }
    }
    return 0;
}

sd_status sd_generate(int32_t *out, int *n_out, sd_finish_reason *reason, sd_model *m,
                      const int32_t *prompt, int n_prompt, const sd_generate_params *p) {
    *n_out = 0;
    if (reason != NULL) {
        *reason = SD_FINISH_LENGTH;
    }
    text_watch watch = {NULL, 0, 0, 0};
    for (int i = 0; i < p->n_stop_strings; i++) {
        watch.longest = p->stop_lens[i] > watch.longest ? p->stop_lens[i] : watch.longest;
    }
    if (p->n_stop_strings > 0 && m->piece_off == NULL) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "stop strings need the token pieces (sd_model_set_token_pieces): "
                            "does the model have a tokenizer?");
    }
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
        if (is_stop(p, tok)) {
            if (reason != NULL) {
                *reason = SD_FINISH_STOP_TOKEN;
            }
            break;
        }
        if (p->n_stop_strings > 0 && watch_token(&watch, m, p, tok, &st)) {
            if (reason != NULL) {
                *reason = SD_FINISH_STOP_STRING;
            }
            break;
        }
        if (st != SD_OK || n >= p->max_new_tokens) {
            break;
        }
        b.n_tokens = 1;
        b.tokens = &out[n - 1];
        st = sd_forward(m, kv, &b, logits);
    }
    *n_out = n;
    sd_kv_cache_free(kv);
    free(logits);
    free(watch.buf);
    return st;
}
