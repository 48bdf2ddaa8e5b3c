/* decode.c — the pieces every decoding loop shares: the checks of a call's parameters, and the
 * emitter, which appends each token and decides whether generation ends after it. */
#include "spec/decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/ops_cpu.h"
#include "model/config.h"
#include "model/forward.h"
#include "spec/sampler.h"
#include "util/status.h"

sd_generate_params sd_generate_default_params(void) {
    sd_generate_params p;
    memset(&p, 0, sizeof(p));
    p.max_new_tokens = 16;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

void sd_prefill_next(const sd_prefill *pf, const sd_model *m, sd_kv_cache *kv, const int32_t *toks,
                     int n, float *logits, sd_fwd *f) {
    memset(f, 0, sizeof(*f));
    const int left = n - pf->fed;
    if (left <= 0) {
        return;
    }
    int take = left;
    if (m->cuda == NULL) {
        /* a first step short enough on any model */
        const int chunk = pf->chunk > 0 ? pf->chunk : 32;
        take = chunk < left ? chunk : left;
    }
    f->kv = kv;
    f->b.n_tokens = take;
    f->b.tokens = toks + pf->fed;
    f->b.n_logits = take == left && logits != NULL ? 1 : 0;
    f->logits = f->b.n_logits ? logits : NULL;
}

void sd_prefill_fed(sd_prefill *pf, const sd_fwd *f) {
    pf->fed += f->b.n_tokens;
    /* the next step: as many tokens as fit in SD_PREFILL_STEP_S at this step's speed (that of
     * all the forward's tokens, when it was shared), in multiples of 16 (the kernels' widest
     * pass), 16 .. 1024 */
    const int all = f->n_all > f->b.n_tokens ? f->n_all : f->b.n_tokens;
    const double per_token = f->seconds / all > 1e-7 ? f->seconds / all : 1e-7;
    const double fit = SD_PREFILL_STEP_S / per_token;
    pf->chunk = fit < 16.0 ? 16 : fit > 1024.0 ? 1024 : (int)fit / 16 * 16;
}

sd_status sd_prefill_step(sd_prefill *pf, sd_model *m, sd_kv_cache *kv, const int32_t *toks, int n,
                          float *logits) {
    sd_fwd f;
    sd_prefill_next(pf, m, kv, toks, n, logits, &f);
    if (f.b.n_tokens == 0) {
        return SD_OK;
    }
    const double t0 = sd_now_s();
    SD_TRY(sd_forward(m, kv, &f.b, f.logits));
    f.seconds = sd_now_s() - t0;
    f.n_all = f.b.n_tokens;
    sd_prefill_fed(pf, &f);
    return SD_OK;
}

/* Whether p asks for a logit bias, penalties or min_tokens (the emitter's penalties state). */
static int penalized(const sd_generate_params *p) {
    return p->n_bias > 0 || p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f ||
           p->presence_penalty != 0.0f || p->min_tokens > 0;
}

sd_status sd_decode_check(const sd_model *m, const int32_t *prompt, int n_prompt,
                          const sd_generate_params *p, sd_sampling *s) {
    if (p->n_stop_strings > 0 && m->piece_off == NULL) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "stop strings need the text of every token, and the model has no "
                            "tokenizer (no sd_model_set_token_pieces)");
    }
    if (n_prompt < 1 || prompt == NULL) {
        return sd_set_error(SD_ERR_INVALID_ARG, "the prompt must hold at least one token");
    }
    for (int i = 0; i < n_prompt; i++) { /* before a drafter reads one (a table indexed by id) */
        SD_TRY(sd_check_token(m, prompt[i], i));
    }
    if (p->max_new_tokens < 0) {
        return sd_set_error(SD_ERR_INVALID_ARG, "max_new_tokens must be >= 0, got %d",
                            p->max_new_tokens);
    }
    if (p->logprobs != 0 && p->logprobs != 1) {
        return sd_set_error(SD_ERR_INVALID_ARG, "logprobs must be 0 or 1, got %d", p->logprobs);
    }
    if (p->top_logprobs < 0 || p->top_logprobs > SD_MAX_TOP_LOGPROBS) {
        return sd_set_error(SD_ERR_INVALID_ARG, "top_logprobs must be in [0, %d], got %d",
                            SD_MAX_TOP_LOGPROBS, p->top_logprobs);
    }
    if (p->top_logprobs > 0 && !p->logprobs) {
        return sd_set_error(SD_ERR_INVALID_ARG, "top_logprobs needs logprobs");
    }
    if (p->min_tokens < 0) {
        return sd_set_error(SD_ERR_INVALID_ARG, "min_tokens must be >= 0, got %d", p->min_tokens);
    }
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "repetition_penalty must be > 0 and finite, got %g",
                            (double)p->repetition_penalty);
    }
    if (!(fabsf(p->frequency_penalty) <= 2.0f)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "frequency_penalty must be in [-2, 2], got %g",
                            (double)p->frequency_penalty);
    }
    if (!(fabsf(p->presence_penalty) <= 2.0f)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "presence_penalty must be in [-2, 2], got %g",
                            (double)p->presence_penalty);
    }
    if (p->n_bias < 0 || (p->n_bias > 0 && (p->bias_ids == NULL || p->bias_values == NULL))) {
        return sd_set_error(SD_ERR_INVALID_ARG, "logit_bias: %d entries without their arrays",
                            p->n_bias);
    }
    for (int i = 0; i < p->n_bias; i++) {
        const int32_t id = p->bias_ids[i];
        if (id < 0 || id >= m->cfg.vocab_size) {
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "logit_bias names token id %d, out of range "
                                "[0, %d)",
                                id, m->cfg.vocab_size);
        }
        if (!(fabsf(p->bias_values[i]) <= 100.0f)) {
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "logit_bias for token id %d must be in [-100, 100], got %g", id,
                                (double)p->bias_values[i]);
        }
        for (int j = 0; j < i; j++) {
            if (p->bias_ids[j] == id) {
                return sd_set_error(SD_ERR_INVALID_ARG, "logit_bias names token id %d twice", id);
            }
        }
    }
    if (penalized(p) && m->cuda != NULL) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "logit_bias, penalties and min_tokens are applied on CPU models only "
                            "so far (a CUDA model picks its tokens on the device)");
    }
    if (p->logprobs && m->cuda != NULL) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "logprobs are computed for CPU models only so far (a CUDA model's "
                            "logits stay on the device)");
    }
    s->temperature = p->temperature;
    s->top_k = p->top_k;
    s->top_p = p->top_p;
    s->min_p = p->min_p;
    SD_TRY(sd_sampling_check(s));
    if ((int64_t)n_prompt + p->max_new_tokens > m->cfg.context_length) {
        char note[160];
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "prompt (%d tokens) + max_new_tokens (%d) exceeds the context length "
                            "%d%s",
                            n_prompt, p->max_new_tokens, m->cfg.context_length,
                            sd_config_context_note(&m->cfg, note, sizeof(note)));
    }
    return SD_OK;
}

/* Token tok's log-probability in row (V raw logits), log softmax at temperature 1, and the top
 * ids' into e's arrays at output index i. The exponentials and their sum are the sampler's
 * (sd_softmax_exp: the same bits from every kernel). */
static sd_status emit_logprobs(sd_emitter *e, int i, int32_t tok, const float *row) {
    if (row == NULL) {
        return sd_set_error(SD_ERR_INTERNAL, "a token was emitted without its logits");
    }
    const int V = e->m->cfg.vocab_size, top = e->p->top_logprobs;
    if (i >= e->lp_cap) { /* room for twice as many (at most max_new_tokens) */
        const int cap = i < 32 ? 64 : 2 * i < e->p->max_new_tokens ? 2 * i : e->p->max_new_tokens;
        float *lp = realloc(e->lp, (size_t)cap * sizeof(float));
        if (lp != NULL) {
            e->lp = lp;
        }
        if (lp != NULL && top > 0) {
            int32_t *ids = realloc(e->top_id, (size_t)cap * (size_t)top * sizeof(int32_t));
            e->top_id = ids != NULL ? ids : e->top_id;
            float *lps = realloc(e->top_lp, (size_t)cap * (size_t)top * sizeof(float));
            e->top_lp = lps != NULL ? lps : e->top_lp;
            lp = ids != NULL && lps != NULL ? lp : NULL;
        }
        if (lp == NULL) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory for %d tokens' logprobs", cap);
        }
        e->lp_cap = cap;
    }
    const float mx = row[sd_argmax(row, V)];
    const double lse = (double)mx + log(sd_softmax_exp(e->work, row, V, mx, 1.0f));
    e->lp[i] = (float)((double)row[tok] - lse);
    if (top > 0) {
        int32_t *ids = e->top_id + (size_t)i * (size_t)top;
        float *lps = e->top_lp + (size_t)i * (size_t)top;
        sd_top_ids(ids, top, row, V);
        for (int j = 0; j < top; j++) {
            lps[j] = ids[j] >= 0 ? (float)((double)row[ids[j]] - lse) : -INFINITY;
        }
    }
    return SD_OK;
}

sd_status sd_emit(sd_emitter *e, int32_t tok, const float *row) {
    const sd_generate_params *p = e->p;
    if (e->logprobs) {
        SD_TRY(emit_logprobs(e, e->n, tok, row));
    }
    if (e->count != NULL) {
        e->count[tok]++;
        if (!e->listed[tok]) {
            e->listed[tok] = 1;
            e->ids[e->n_ids++] = tok;
        }
    }
    e->out[e->n++] = tok;
    if (p->on_token != NULL && p->on_token(p->on_token_user, tok) != 0) {
        e->reason = SD_FINISH_CANCELLED;
        e->done = 1;
        return SD_OK;
    }
    for (int i = 0; i < p->n_stop_ids; i++) {
        if (p->stop_ids[i] == tok) {
            e->reason = SD_FINISH_STOP_TOKEN;
            e->done = 1;
            return SD_OK;
        }
    }
    if (p->n_stop_strings > 0) {
        const size_t a = e->m->piece_off[tok], n = e->m->piece_off[tok + 1] - a;
        if (e->len + n > e->cap) {
            size_t cap = (e->len + n) * 2 + 64;
            char *b = realloc(e->text, cap);
            if (b == NULL) {
                return sd_set_error(SD_ERR_NOMEM, "out of memory watching for stop strings");
            }
            e->text = b;
            e->cap = cap;
        }
        memcpy(e->text + e->len, e->m->pieces + a, n);
        const size_t old = e->len;
        e->len += n;
        /* a new occurrence ends inside the new piece: start looking longest - 1 bytes back */
        const size_t from = old >= e->longest ? old - e->longest + 1 : 0;
        for (int i = 0; i < p->n_stop_strings; i++) {
            if (p->stop_lens[i] > 0 && memmem(e->text + from, e->len - from, p->stop_strings[i],
                                              p->stop_lens[i]) != NULL) {
                e->reason = SD_FINISH_STOP_STRING;
                e->done = 1;
                return SD_OK;
            }
        }
    }
    if (e->n >= p->max_new_tokens) {
        e->reason = SD_FINISH_LENGTH;
        e->done = 1;
    }
    return SD_OK;
}

void sd_emitter_init(sd_emitter *e, const sd_model *m, const sd_generate_params *p, int32_t *out) {
    memset(e, 0, sizeof(*e));
    e->m = m;
    e->p = p;
    e->out = out;
    e->reason = SD_FINISH_LENGTH;
    for (int i = 0; i < p->n_stop_strings; i++) {
        e->longest = p->stop_lens[i] > e->longest ? p->stop_lens[i] : e->longest;
    }
}

sd_status sd_emitter_want_logprobs(sd_emitter *e) {
    const sd_generate_params *p = e->p;
    if (!p->logprobs || p->max_new_tokens < 1) {
        return SD_OK;
    }
    /* the rows come as tokens do (emit_logprobs): a long max_new_tokens costs nothing ahead */
    e->work = malloc((size_t)e->m->cfg.vocab_size * sizeof(float));
    if (e->work == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory for logprobs");
    }
    e->logprobs = 1;
    return SD_OK;
}

void sd_emitter_free(sd_emitter *e) {
    free(e->text);
    free(e->lp);
    free(e->top_id);
    free(e->top_lp);
    free(e->work);
    free(e->count);
    free(e->listed);
    free(e->ids);
    e->text = NULL;
    e->lp = e->top_lp = e->work = NULL;
    e->top_id = e->count = e->ids = NULL;
    e->listed = NULL;
}

sd_status sd_emitter_want_penalties(sd_emitter *e, const int32_t *prompt, int n_prompt) {
    const sd_generate_params *p = e->p;
    if (!penalized(p)) {
        return SD_OK;
    }
    const size_t V = (size_t)e->m->cfg.vocab_size;
    e->count = calloc(V, sizeof(int32_t));
    e->listed = calloc(V, 1);
    e->ids = malloc(V * sizeof(int32_t));
    if (e->count == NULL || e->listed == NULL || e->ids == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory for the penalties");
    }
    for (int i = 0; i < n_prompt; i++) {
        if (!e->listed[prompt[i]]) {
            e->listed[prompt[i]] = 1;
            e->ids[e->n_ids++] = prompt[i];
        }
    }
    return SD_OK;
}

void sd_emitter_penalize(sd_emitter *e, float *row, const int32_t *path, int n_path) {
    if (e->count == NULL) {
        return;
    }
    const sd_generate_params *p = e->p;
    for (int i = 0; i < p->n_bias; i++) {
        row[p->bias_ids[i]] += p->bias_values[i];
    }
    /* the path's tokens counted in for this row, and listed if new (taken out again below) */
    const int listed = e->n_ids;
    for (int j = 0; j < n_path; j++) {
        e->count[path[j]]++;
        if (!e->listed[path[j]]) {
            e->listed[path[j]] = 1;
            e->ids[e->n_ids++] = path[j];
        }
    }
    const float rep = p->repetition_penalty, freq = p->frequency_penalty;
    const float pres = p->presence_penalty;
    for (int i = 0; i < e->n_ids; i++) {
        const int32_t t = e->ids[i];
        float x = row[t];
        if (rep != 1.0f) {
            x = x > 0.0f ? x / rep : x * rep;
        }
        const int c = e->count[t];
        if (c > 0) {
            x -= freq * (float)c + pres;
        }
        row[t] = x;
    }
    for (int j = 0; j < n_path; j++) {
        e->count[path[j]]--;
    }
    for (int i = listed; i < e->n_ids; i++) {
        e->listed[e->ids[i]] = 0;
    }
    e->n_ids = listed;
    if (e->n + n_path < p->min_tokens) { /* this row's token would be output number n + n_path */
        for (int i = 0; i < p->n_stop_ids; i++) {
            row[p->stop_ids[i]] = -INFINITY;
        }
    }
}
