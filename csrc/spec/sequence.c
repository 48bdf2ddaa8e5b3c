/* sequence.c — one request decoded a step at a time (specdec.h's sd_sequence): plain decoding
 * (plain.c) or the speculative loop with a drafter (loop.c) behind one handle, and
 * sd_generate / sd_generate_speculative, which step a sequence until it ends. */
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/model.h"
#include "model/sched.h"
#include "spec/decode.h"
#include "spec/drafter.h"
#include "spec/loop.h"
#include "util/status.h"

struct sd_sequence {
    sd_model *m;
    const sd_drafter *d; /* NULL: plain decoding */
    /* the call's parameters, its arrays copied into the sequence */
    sd_generate_params p;
    int32_t *prompt; /* (n_prompt) */
    int n_prompt;
    int32_t *stop_ids; /* (p.n_stop_ids) */
    int32_t *bias_ids; /* (p.n_bias) */
    float *bias_values;
    char *stop_bytes; /* the stop strings, one after another */
    const char **stop_strings;
    size_t *stop_lens;
    int32_t *out; /* (max(max_new_tokens, 1)) */
    double t_start;
    int started;     /* the loop's state below exists */
    int ended;       /* done, or a step failed */
    int failed;      /* a step failed: the caches may be half written */
    int reused;      /* prompt tokens whose keys and values came from the prefix pool */
    sd_feat_kind fk; /* the features the drafter reads, pooled with the cache */
    int has_fk;      /* it reads some (fk is set) */
    int joined;      /* counted among the scheduler's running requests (until it ends) */
    sd_spec_stats ss;
    sd_plain P;     /* plain decoding's state */
    sd_spec_loop L; /* the speculative loop's */
};

static const sd_emitter *emitter(const sd_sequence *q) {
    return q->d != NULL ? &q->L.e : &q->P.e;
}

/* Copies the arrays p points to, so that the caller's may go. */
static sd_status copy_params(sd_sequence *q, const int32_t *prompt, int n_prompt,
                             const sd_generate_params *p) {
    q->p = *p;
    q->n_prompt = n_prompt;
    q->prompt = malloc((size_t)n_prompt * sizeof(int32_t));
    q->out = malloc((size_t)(p->max_new_tokens > 0 ? p->max_new_tokens : 1) * sizeof(int32_t));
    if (q->prompt == NULL || q->out == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    memcpy(q->prompt, prompt, (size_t)n_prompt * sizeof(int32_t));
    if (p->n_stop_ids > 0) {
        if ((q->stop_ids = malloc((size_t)p->n_stop_ids * sizeof(int32_t))) == NULL) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory");
        }
        memcpy(q->stop_ids, p->stop_ids, (size_t)p->n_stop_ids * sizeof(int32_t));
        q->p.stop_ids = q->stop_ids;
    }
    if (p->n_bias > 0) {
        q->bias_ids = malloc((size_t)p->n_bias * sizeof(int32_t));
        q->bias_values = malloc((size_t)p->n_bias * sizeof(float));
        if (q->bias_ids == NULL || q->bias_values == NULL) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory");
        }
        memcpy(q->bias_ids, p->bias_ids, (size_t)p->n_bias * sizeof(int32_t));
        memcpy(q->bias_values, p->bias_values, (size_t)p->n_bias * sizeof(float));
        q->p.bias_ids = q->bias_ids;
        q->p.bias_values = q->bias_values;
    }
    if (p->n_stop_strings > 0) {
        const int n = p->n_stop_strings;
        size_t total = 0;
        for (int i = 0; i < n; i++) {
            total += p->stop_lens[i];
        }
        q->stop_bytes = malloc(total > 0 ? total : 1);
        q->stop_strings = malloc((size_t)n * sizeof(*q->stop_strings));
        q->stop_lens = malloc((size_t)n * sizeof(size_t));
        if (q->stop_bytes == NULL || q->stop_strings == NULL || q->stop_lens == NULL) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory");
        }
        size_t at = 0;
        for (int i = 0; i < n; i++) {
            memcpy(q->stop_bytes + at, p->stop_strings[i], p->stop_lens[i]);
            q->stop_strings[i] = q->stop_bytes + at;
            q->stop_lens[i] = p->stop_lens[i];
            at += p->stop_lens[i];
        }
        q->p.stop_strings = q->stop_strings;
        q->p.stop_lens = q->stop_lens;
    }
    return SD_OK;
}

/* Gives the target cache to the model's prefix pool with the tokens its slots hold (the prompt,
 * then the output), detaching it from the loop. */
static void keep_cache(sd_sequence *q) {
    sd_kv_cache **kv = q->d != NULL ? &q->L.kv : &q->P.kv;
    if (*kv == NULL || q->m->prefix == NULL) {
        return;
    }
    const int n = sd_kv_cache_length(*kv);
    int32_t *toks = q->d != NULL ? q->L.hist : malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (toks == NULL) {
        return; /* no memory to keep it: it is freed with the loop */
    }
    if (q->d == NULL) { /* plain: the prompt, then the output fed back */
        for (int i = 0; i < n; i++) {
            toks[i] = i < q->n_prompt ? q->prompt[i] : q->out[i - q->n_prompt];
        }
    }
    /* the drafter's features go with it: those of every slot, or, before a step set them up,
     * the ones that came from the pool (its slots are still just those) */
    float *feat = NULL;
    if (q->has_fk) {
        float **f = q->L.feat != NULL ? &q->L.feat : &q->L.feat_pool;
        feat = *f;
        *f = NULL;
    }
    /* it owns the cache now, also on failure */
    (void)sd_kv_pool_put(q->m, *kv, toks, feat, &q->fk);
    *kv = NULL;
    if (q->d == NULL) {
        free(toks);
    }
}

/* The request ends for the scheduler (once). */
static void leave(sd_sequence *q) {
    if (q->joined) {
        q->joined = 0;
        sd_sched_leave(q->m->sched);
    }
}

void sd_sequence_free(sd_sequence *q) {
    if (q == NULL) {
        return;
    }
    leave(q);
    if (q->started) {
        /* between steps the target cache holds exactly the text's first tokens: the model
         * keeps it for a later request that starts the same way */
        if (!q->failed) {
            keep_cache(q);
        }
        int n_out = 0;
        if (q->d != NULL) {
            (void)sd_spec_loop_end(&q->L, SD_OK, &n_out, NULL);
        } else {
            sd_plain_end(&q->P);
        }
    }
    free(q->prompt);
    free(q->stop_ids);
    free(q->bias_ids);
    free(q->bias_values);
    free(q->stop_bytes);
    free(q->stop_strings);
    free(q->stop_lens);
    free(q->out);
    free(q);
}

sd_status sd_sequence_create(sd_sequence **out, sd_model *m, const sd_drafter *d,
                             const int32_t *prompt, int n_prompt, const sd_generate_params *p) {
    *out = NULL;
    sd_sampling s;
    SD_TRY(sd_decode_check(m, prompt, n_prompt, p, &s));
    if (d != NULL) {
        SD_TRY(d->ops->check(d, m, n_prompt, p->max_new_tokens));
    }
    sd_sequence *q = calloc(1, sizeof(*q));
    if (q == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    q->m = m;
    q->d = d;
    q->t_start = sd_now_s();
    sd_status st = copy_params(q, prompt, n_prompt, p);
    if (st == SD_OK && p->max_new_tokens == 0) {
        q->ended = 1; /* nothing to do: a finished sequence with no tokens */
        sd_emitter_init(d != NULL ? &q->L.e : &q->P.e, m, &q->p, q->out);
    } else if (st == SD_OK) {
        const int ctx =
            d == NULL || m->cfg.context_length < d->context ? m->cfg.context_length : d->context;
        const int capacity = d != NULL
                                 ? sd_spec_capacity(n_prompt, p->max_new_tokens, d->max_nodes, ctx)
                                 : n_prompt + p->max_new_tokens - 1;
        /* a finished request's cache that holds the prompt's first tokens (all but the last,
         * which both loops feed themselves) */
        sd_kv_cache *kv = NULL;
        float *feat = NULL;
        if (d != NULL && d->ops->features != NULL) { /* a reused prefix needs its features */
            q->fk.hidden = d->ops->features(d, m, q->fk.aux, &q->fk.n_aux) != 0;
            q->has_fk = 1;
        }
        st = sd_kv_pool_take(m, q->prompt, n_prompt, n_prompt - 1, capacity,
                             q->has_fk ? &q->fk : NULL, &kv, &q->reused, &feat);
        if (st == SD_OK) {
            q->started = 1;
            if (d != NULL) {
                st = sd_spec_loop_begin(&q->L, m, q->prompt, n_prompt, &q->p, &s, d->max_nodes, ctx,
                                        d->wants_q, q->out, &q->ss, q->t_start, kv, q->reused);
                q->L.d = d;
                q->L.feat_pool = feat; /* the loop's to free from here on */
                feat = NULL;
            } else {
                st =
                    sd_plain_begin(&q->P, m, q->prompt, n_prompt, &q->p, &s, q->out, kv, q->reused);
            }
        }
    }
    if (st != SD_OK) {
        q->failed = 1; /* a half-made loop's cache is not the prompt's: not for the pool */
        sd_sequence_free(q);
        return st;
    }
    if (!q->ended) {
        q->joined = 1;
        sd_sched_join(m->sched);
    }
    *out = q;
    return SD_OK;
}

/* The halves of a step, as the model's scheduler runs them (sched.h). */
static sd_status step_before(void *ctx, sd_fwd *f) {
    sd_sequence *q = ctx;
    return q->d == NULL ? sd_plain_step_before(&q->P, f) : sd_spec_step_before(&q->L, f);
}

static sd_status step_after(void *ctx, const sd_fwd *f, sd_status forward) {
    sd_sequence *q = ctx;
    const sd_status st = q->d == NULL ? sd_plain_step_after(&q->P, f, forward)
                                      : sd_spec_step_after(&q->L, f, forward);
    if (st != SD_OK || emitter(q)->done) {
        leave(q); /* now: the next leader does not wait for a request that has ended */
    }
    return st;
}

sd_status sd_sequence_step(sd_sequence *q, int *n_new) {
    *n_new = 0;
    if (q->ended) {
        return sd_set_error(SD_ERR_INVALID_ARG, "the sequence has ended: no more steps");
    }
    sd_sched_job job;
    memset(&job, 0, sizeof(job));
    job.before = step_before;
    job.after = step_after;
    job.ctx = q;
    const int before = emitter(q)->n;
    const sd_status st = sd_sched_run(q->m->sched, q->m, sd_forward_multi, &job);
    q->ss.time_total_s = sd_now_s() - q->t_start;
    *n_new = emitter(q)->n - before;
    q->failed = st != SD_OK;
    q->ended = q->failed || emitter(q)->done;
    if (q->ended) {
        leave(q);
    }
    return st;
}

int sd_sequence_done(const sd_sequence *q) {
    return q->ended;
}

sd_finish_reason sd_sequence_finish_reason(const sd_sequence *q) {
    return emitter(q)->reason;
}

const int32_t *sd_sequence_tokens(const sd_sequence *q, int *n) {
    *n = emitter(q)->n;
    return q->out;
}

const float *sd_sequence_logprobs(const sd_sequence *q, int *n, const int32_t **top_ids,
                                  const float **top_lps) {
    const sd_emitter *e = emitter(q);
    *n = e->n;
    *top_ids = e->top_id;
    *top_lps = e->top_lp;
    return e->lp;
}

int sd_sequence_reused(const sd_sequence *q) {
    return q->reused;
}

const sd_spec_stats *sd_sequence_stats(const sd_sequence *q) {
    return q->d != NULL ? &q->ss : NULL;
}

/* Steps q to its end, and hands out what sd_generate and sd_generate_speculative report. */
static sd_status run(sd_sequence *q, int32_t *out, int *n_out, sd_finish_reason *reason,
                     sd_spec_stats *stats) {
    sd_status st = SD_OK;
    while (st == SD_OK && !q->ended) {
        int n_new = 0;
        st = sd_sequence_step(q, &n_new);
    }
    int n = 0;
    const int32_t *toks = sd_sequence_tokens(q, &n);
    memcpy(out, toks, (size_t)n * sizeof(int32_t));
    *n_out = n;
    if (reason != NULL) {
        *reason = sd_sequence_finish_reason(q);
    }
    if (stats != NULL) {
        *stats = q->ss;
    }
    sd_sequence_free(q);
    return st;
}

sd_status sd_generate(int32_t *out, int *n_out, sd_finish_reason *reason, sd_model *m,
                      const int32_t *prompt, int n_prompt, const sd_generate_params *p) {
    *n_out = 0;
    if (reason != NULL) {
        *reason = SD_FINISH_LENGTH;
    }
    sd_sequence *q = NULL;
    SD_TRY(sd_sequence_create(&q, m, NULL, prompt, n_prompt, p));
    return run(q, out, n_out, reason, NULL);
}

sd_status sd_generate_speculative(int32_t *out, int *n_out, sd_finish_reason *reason,
                                  sd_spec_stats *stats, sd_model *m, const sd_drafter *d,
                                  const int32_t *prompt, int n_prompt,
                                  const sd_generate_params *p) {
    *n_out = 0;
    if (reason != NULL) {
        *reason = SD_FINISH_LENGTH;
    }
    if (stats != NULL) {
        memset(stats, 0, sizeof(*stats));
    }
    if (d == NULL) {
        return sd_set_error(SD_ERR_INVALID_ARG, "speculative decoding needs a drafter");
    }
    sd_sequence *q = NULL;
    SD_TRY(sd_sequence_create(&q, m, d, prompt, n_prompt, p));
    return run(q, out, n_out, reason, stats);
}
