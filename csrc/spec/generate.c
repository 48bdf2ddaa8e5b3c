/* generate.c — the decoding loops in C.
 *
 * sd_generate: prefill the prompt, then pick a token from the last logits, feed it back, repeat:
 * the plain loop, and the reference the speculative loop is tested against.
 * sd_generate_lookup: speculative decoding with prompt-lookup drafts; per step
 *   draft  — propose up to K tokens that followed the latest earlier match of the text's tail;
 *   verify — one target forward over [last, d1 .. dK] gives K + 1 distributions at once;
 *   accept — the chain rule of verify.h picks the accepted prefix and one more token;
 *   roll back — the cache keeps the accepted slots, forgets the rest (setting its length). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/forward.h"
#include "util/hd.h"
#include "spec/lookup.h"
#include "model/model.h"
#include "cpu/ops_cpu.h"
#include "spec/sampler.h"
#include "util/status.h"
#include "check/twins.h"
#include "spec/verify.h"
#ifdef SD_WITH_CUDA
#include "../cuda/sd_cuda.h"
#endif

sd_generate_params sd_generate_default_params(void) {
    sd_generate_params p;
    memset(&p, 0, sizeof(p));
    p.max_new_tokens = 16;
    p.top_p = 1.0f;
    return p;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- emitting tokens: stop tokens, stop strings, the length limit ------------------------------
 */

typedef struct {
    const sd_model *m;
    const sd_generate_params *p;
    int32_t *out;
    int n;
    sd_finish_reason reason;
    int done;
    char *text; /* output bytes so far, to watch for stop strings */
    size_t len, cap, longest;
} emitter;

static sd_status check_params(const sd_model *m, const int32_t *prompt, int n_prompt,
                              const sd_generate_params *p, sd_sampling *s) {
    if (p->n_stop_strings > 0 && m->piece_off == NULL) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "stop strings need the token pieces (sd_model_set_token_pieces): "
                            "does the model have a tokenizer?");
    }
    if (n_prompt < 1 || prompt == NULL) {
        return sd_set_error(SD_ERR_INVALID_ARG, "the prompt must hold at least one token");
    }
    if (p->max_new_tokens < 0) {
        return sd_set_error(SD_ERR_INVALID_ARG, "max_new_tokens must be >= 0, got %d",
                            p->max_new_tokens);
    }
    s->temperature = p->temperature;
    s->top_k = p->top_k;
    s->top_p = p->top_p;
    s->min_p = p->min_p;
    SD_TRY(sd_sampling_check(s));
    if ((int64_t)n_prompt + p->max_new_tokens > m->cfg.context_length) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "prompt (%d tokens) + max_new_tokens (%d) exceeds the context length "
                            "%d",
                            n_prompt, p->max_new_tokens, m->cfg.context_length);
    }
    return SD_OK;
}

/* Append `tok`; sets e->done when generation must end after it. */
static sd_status emit(emitter *e, int32_t tok) {
    const sd_generate_params *p = e->p;
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

static void emitter_init(emitter *e, const sd_model *m, const sd_generate_params *p, int32_t *out) {
    memset(e, 0, sizeof(*e));
    e->m = m;
    e->p = p;
    e->out = out;
    e->reason = SD_FINISH_LENGTH;
    for (int i = 0; i < p->n_stop_strings; i++) {
        e->longest = p->stop_lens[i] > e->longest ? p->stop_lens[i] : e->longest;
    }
}

/* ---- the plain loop -------------------------------------------------------------------------- */

#ifdef SD_WITH_CUDA
static sd_cuda_sampling cuda_sampling(const sd_sampling *s) {
    sd_cuda_sampling c;
    c.temperature = s->temperature;
    c.top_k = s->top_k;
    c.top_p = s->top_p;
    c.min_p = s->min_p;
    return c;
}

/* The plain loop of a CUDA model: the prompt's last token goes through its own one-token
 * forward, as in the speculative loops (a long prefill may take cuBLAS, which is not
 * batch-invariant: this way both loops see the same prefill and the same one-token steps);
 * each token is picked on the device and copied back, the one synchronisation per token. */
static sd_status generate_cuda(emitter *e, sd_model *m, const int32_t *prompt, int n_prompt,
                               const sd_generate_params *p, const sd_sampling *s) {
    sd_kv_cache *kv = NULL;
    SD_TRY(sd_kv_cache_create(&kv, m, n_prompt + p->max_new_tokens - 1));
    const sd_cuda_sampling cs = cuda_sampling(s);
    sd_batch b = {0};
    sd_status st = SD_OK;
    if (n_prompt > 1) {
        b.n_tokens = n_prompt - 1;
        b.tokens = prompt;
        st = sd_forward_ex(m, kv, &b, NULL, NULL);
    }
    b.n_tokens = 1;
    b.tokens = &prompt[n_prompt - 1];
    b.n_logits = 1;
    if (st == SD_OK) {
        st = sd_forward_ex(m, kv, &b, NULL, NULL);
    }
    while (st == SD_OK) {
        int32_t tok = 0;
        st = sd_cuda_pick(m->cuda, 0, &cs, p->seed, (uint64_t)e->n, &tok);
        if (st == SD_OK) {
            st = emit(e, tok);
        }
        if (st != SD_OK || e->done) {
            break;
        }
        b.tokens = &e->out[e->n - 1];
        st = sd_forward_ex(m, kv, &b, NULL, NULL);
    }
    sd_kv_cache_free(kv);
    return st;
}
#endif

sd_status sd_generate(int32_t *out, int *n_out, sd_finish_reason *reason, sd_model *m,
                      const int32_t *prompt, int n_prompt, const sd_generate_params *p) {
    *n_out = 0;
    if (reason != NULL) {
        *reason = SD_FINISH_LENGTH;
    }
    sd_sampling s;
    SD_TRY(check_params(m, prompt, n_prompt, p, &s));
    if (p->max_new_tokens == 0) {
        return SD_OK;
    }
    const int V = m->cfg.vocab_size;
    emitter e;
    emitter_init(&e, m, p, out);
#ifdef SD_WITH_CUDA
    if (m->cuda != NULL) {
        const sd_status cst = generate_cuda(&e, m, prompt, n_prompt, p, &s);
        *n_out = e.n;
        if (reason != NULL) {
            *reason = e.reason;
        }
        free(e.text);
        return cst;
    }
#endif
    sd_kv_cache *kv = NULL;
    float *logits = malloc((size_t)V * 2 * sizeof(float));
    int32_t *work = malloc((size_t)V * sizeof(int32_t));
    sd_status st =
        logits == NULL || work == NULL ? sd_set_error(SD_ERR_NOMEM, "out of memory") : SD_OK;
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
    while (st == SD_OK) {
        int32_t tok;
        if (s.temperature == 0.0f) {
            tok = sd_argmax(logits, V);
        } else {
            float *probs = logits + V;
            sd_process_logits(probs, logits, V, &s, work);
            tok =
                sd_sample_probs(probs, V, sd_rng_uniform(p->seed, SD_STREAM_PLAIN, (uint64_t)e.n));
        }
        st = emit(&e, tok);
        if (st != SD_OK || e.done) {
            break;
        }
        b.n_tokens = 1;
        b.tokens = &out[e.n - 1];
        st = sd_forward(m, kv, &b, logits);
    }
    *n_out = e.n;
    if (reason != NULL) {
        *reason = e.reason;
    }
    sd_kv_cache_free(kv);
    free(logits);
    free(work);
    free(e.text);
    return st;
}

/* ---- prompt lookup --------------------------------------------------------------------------- */

/* The adaptive draft length counts acceptance apart for a match that extends this many tokens
 * back (sd_lookup_draft's extent), where the text repeats itself, and apart again for one this
 * long (at most SD_LOOKUP_EXTENT_MAX). */
#define SD_LOOKUP_LONG 16
#define SD_LOOKUP_LONG_MAX 32

/* The draft length that maximises expected tokens per verify cost given an acceptance rate
 * measured as `accepted` of `trials` (a Beta(1, 1)-smoothed count, so it starts at 0.5; prompt
 * lookup counts as trials the accepted tokens and the rejected drafts, the model drafters all
 * drafted tokens); when no length pays, 1 on every fourth step (`step`), to keep measuring,
 * else 0. */
static int adaptive_k(double accepted, double trials, float slope, int kmax, int step) {
    const double a = (accepted + 1.0) / (trials + 2.0);
    double best_v = 1.0, ak = a; /* k = 0: one token per unit cost */
    int best = 0;
    for (int k = 1; k <= kmax; k++) {
        ak *= a; /* a^(k+1) */
        const double v = (1.0 - ak) / ((1.0 - a) * (1.0 + (double)slope * k));
        if (v > best_v) {
            best_v = v;
            best = k;
        }
    }
    return best > 0 ? best : (step % 4 == 0 ? 1 : 0);
}

/* The state shared by the speculative loops: the target and its cache, the text so far, the
 * verify batch and its scratch rows, the emitter and the statistics. */
typedef struct {
    sd_model *m;
    sd_kv_cache *kv; /* holds hist[0 .. len - 2]: all but the last token */
    sd_sampling s;
    uint64_t seed;
    int n_prompt;
    int32_t *hist;  /* [n_prompt + max_new_tokens]: prompt + output */
    int len;        /* tokens in hist */
    int32_t *batch; /* [K + 1]: last, d1 .. dK */
    float *logits;  /* [K + 1][V] */
    float *probs;   /* [K + 1][V] */
    float *fwork;   /* [V] */
    float *q;       /* [K][V] the drafts' distributions (drafters that have them), else NULL */
    float *dlog;    /* [V] a draft forward's logits, with q */
    int32_t *iwork; /* [V] */
    emitter e;
    sd_spec_stats *ss;
    double t_start;
    int check_cache; /* sd_generate_params.check_cache */
#ifdef SD_WITH_CUDA
    sd_cuda_spec *sp; /* a CUDA target's device state of the call, else NULL */
#endif
} spec_loop;

/* The check_cache self-check: kv must hold toks[0 .. n) in slots [0, n) exactly as a fresh
 * forward over them writes it: the first n_first tokens in one batch (the loop's prefill: a
 * long prefill may take other kernels on a GPU), the rest in batches of at most
 * SD_MAX_DRAFT + 1 (which, the kernels' results not depending on the batch size, is bit for
 * bit what any sequence of correct steps leaves); `who` and `step` name the failure. */
static sd_status check_cache(sd_model *m, const sd_kv_cache *kv, const int32_t *toks, int n,
                             int n_first, const char *who, int step) {
    if (kv->length != n) {
        return sd_set_error(SD_ERR_INTERNAL,
                            "cache check after step %d: the %s cache holds %d slots, expected %d",
                            step, who, kv->length, n);
    }
    if (n == 0) {
        return SD_OK;
    }
    sd_kv_cache *fresh = NULL;
    SD_TRY(sd_kv_cache_create(&fresh, m, n));
    sd_status st = SD_OK;
    if (fresh->f16 != kv->f16) {
        st = sd_set_error(SD_ERR_INVALID_ARG,
                          "cache check after step %d: the model's KV cache type changed during "
                          "the call",
                          step);
    }
    for (int done = 0; st == SD_OK && done < n;) {
        sd_batch b = {0};
        const int chunk = n - done < SD_MAX_DRAFT + 1 ? n - done : SD_MAX_DRAFT + 1;
        b.n_tokens = done == 0 && n_first > 0 ? (n_first < n ? n_first : n) : chunk;
        b.tokens = toks + done;
        st = sd_forward(m, fresh, &b, NULL);
        done += b.n_tokens;
    }
    const void *ka = kv->k, *va = kv->v, *kf = fresh->k, *vf = fresh->v;
    /* a host cache's heads are kv->stride slots apart, its keys in tiles; a downloaded one's
     * capacity slots apart, its keys in rows */
    size_t sa = (size_t)kv->stride, sf = (size_t)fresh->stride;
    int tiled = 1;
    float *dl = NULL;
#ifdef SD_WITH_CUDA
    if (st == SD_OK && kv->cuda != NULL) { /* both caches to the host */
        const size_t floats = (size_t)kv->n_layers * (size_t)kv->n_kv_heads * (size_t)kv->head_dim;
        dl = malloc(2 * floats * ((size_t)kv->capacity + (size_t)fresh->capacity) * sizeof(float));
        if (dl == NULL) {
            st = sd_set_error(SD_ERR_NOMEM, "out of memory in the cache check");
        } else {
            float *k1 = dl, *v1 = k1 + floats * (size_t)kv->capacity;
            float *k2 = v1 + floats * (size_t)kv->capacity,
                  *v2 = k2 + floats * (size_t)fresh->capacity;
            st = sd_cuda_cache_download(kv->cuda, k1, v1);
            if (st == SD_OK) {
                st = sd_cuda_cache_download(fresh->cuda, k2, v2);
            }
            ka = k1;
            va = v1;
            kf = k2;
            vf = v2;
            sa = (size_t)kv->capacity;
            sf = (size_t)fresh->capacity;
            tiled = 0;
        }
    }
#endif
    /* the same model: both caches hold the same element type (f32 when downloaded) */
    const size_t elt = sd_kv_elt(kv), Dh = (size_t)kv->head_dim, row = Dh * elt;
    for (int l = 0; st == SD_OK && l < kv->n_layers * kv->n_kv_heads; l++) {
        /* where head l begins in each */
        const char *ha = (const char *)ka + (size_t)l * sa * row;
        const char *hf = (const char *)kf + (size_t)l * sf * row;
        for (int i = 0; i < n; i++) {
            const size_t a = ((size_t)l * sa + (size_t)i) * row;
            const size_t f = ((size_t)l * sf + (size_t)i) * row;
            int same = memcmp((const char *)va + a, (const char *)vf + f, row) == 0 &&
                       kv->pos[i] == fresh->pos[i];
            for (size_t d = 0; same && d < Dh; d++) {
                const size_t at = tiled ? sd_key_at(i, (int)d, (int)Dh) : (size_t)i * Dh + d;
                same = memcmp(ha + at * elt, hf + at * elt, elt) == 0;
            }
            if (!same) {
                st = sd_set_error(SD_ERR_INTERNAL,
                                  "cache check after step %d: the %s cache's slot %d (token %d) "
                                  "differs from a fresh forward in layer %d",
                                  step, who, i, (int)toks[i], l / kv->n_kv_heads);
                break;
            }
        }
    }
    free(dl);
    sd_kv_cache_free(fresh);
    return st;
}

/* Allocates a loop for drafts of up to K tokens (with rows for their distributions when
 * draft_rows) over a target cache of prompt + output + K slots, at most ctx, and prefills all of
 * the prompt but its last token. On failure the loop still needs spec_loop_end. */
static sd_status spec_loop_begin(spec_loop *L, sd_model *m, const int32_t *prompt, int n_prompt,
                                 const sd_generate_params *p, const sd_sampling *s, int K, int ctx,
                                 int draft_rows, int32_t *out, sd_spec_stats *ss, double t_start) {
    const int V = m->cfg.vocab_size;
    memset(L, 0, sizeof(*L));
    L->m = m;
    L->s = *s;
    L->seed = p->seed;
    L->n_prompt = n_prompt;
    L->len = n_prompt;
    L->ss = ss;
    L->t_start = t_start;
    L->check_cache = p->check_cache;
    emitter_init(&L->e, m, p, out);
    L->hist = malloc((size_t)(n_prompt + p->max_new_tokens) * sizeof(int32_t));
    L->batch = malloc((size_t)(K + 1) * sizeof(int32_t));
    if (L->hist == NULL || L->batch == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
#ifdef SD_WITH_CUDA
    if (m->cuda != NULL) { /* rows and distributions live on the device */
        SD_TRY(sd_cuda_spec_create(&L->sp, m->cuda, K));
        draft_rows = -1;
    }
#endif
    if (draft_rows >= 0) {
        L->logits = malloc((size_t)(K + 1) * (size_t)V * sizeof(float));
        L->probs = malloc((size_t)(K + 1) * (size_t)V * sizeof(float));
        L->fwork = malloc((size_t)V * sizeof(float));
        L->iwork = malloc((size_t)V * sizeof(int32_t));
        if (draft_rows) {
            L->q = malloc((size_t)K * (size_t)V * sizeof(float));
            L->dlog = malloc((size_t)V * sizeof(float));
        }
        if (L->logits == NULL || L->probs == NULL || L->fwork == NULL || L->iwork == NULL ||
            (draft_rows && (L->q == NULL || L->dlog == NULL))) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory");
        }
    }
    const int total = n_prompt + p->max_new_tokens;
    SD_TRY(sd_kv_cache_create(&L->kv, m, total + K < ctx ? total + K : ctx));
    memcpy(L->hist, prompt, (size_t)n_prompt * sizeof(int32_t));
    if (n_prompt > 1) {
        sd_batch b = {0};
        b.n_tokens = n_prompt - 1;
        b.tokens = prompt;
        SD_TRY(sd_forward(m, L->kv, &b, NULL));
    }
    return SD_OK;
}

/* Reports what was emitted, frees the loop and passes on its status. */
static sd_status spec_loop_end(spec_loop *L, sd_status st, int *n_out, sd_finish_reason *reason) {
    *n_out = L->e.n;
    if (reason != NULL) {
        *reason = L->e.reason;
    }
    L->ss->time_total_s = now_s() - L->t_start;
#ifdef SD_WITH_CUDA
    sd_cuda_spec_free(L->sp);
#endif
    sd_kv_cache_free(L->kv);
    free(L->hist);
    free(L->batch);
    free(L->logits);
    free(L->probs);
    free(L->fwork);
    free(L->iwork);
    free(L->q);
    free(L->dlog);
    free(L->e.text);
    return st;
}

/* The most drafts the next step may carry: no more than can be emitted, nor past the cache. */
static int spec_room(const spec_loop *L, const sd_generate_params *p, int K) {
    int k = p->max_new_tokens - L->e.n - 1;
    k = k < K ? k : K;
    k = k < L->kv->capacity - L->len ? k : L->kv->capacity - L->len;
    return k < 0 ? 0 : k;
}

/* After a verify step: the statistics, the kept drafts (batch[1 .. n_acc]) and the next token
 * appended to hist and emitted (stopping where the emitter says), the target cache rolled
 * back to all but the last token, and the self-check when asked. k: drafts verified. */
static sd_status spec_finish_step(spec_loop *L, int k, int n_acc, int32_t next) {
    sd_spec_stats *ss = L->ss;
    ss->steps++;
    ss->drafted += k;
    ss->accepted += n_acc;
    for (int i = 0; i < k; i++) {
        ss->drafted_at[i]++;
        ss->accepted_at[i] += i < n_acc;
    }
    for (int i = 0; i <= n_acc && !L->e.done; i++) {
        const int32_t tok = i < n_acc ? L->batch[1 + i] : next;
        L->hist[L->len++] = tok;
        SD_TRY(emit(&L->e, tok));
    }
    /* roll back: keep last + the accepted drafts that were emitted */
    SD_TRY(sd_kv_cache_set_length(L->kv, L->len - 1));
    return L->check_cache
               ? check_cache(L->m, L->kv, L->hist, L->len - 1, L->n_prompt - 1, "target", ss->steps)
               : SD_OK;
}

#ifdef SD_WITH_CUDA
/* The verify step of a CUDA target: the forward over [last, d1 .. dk] (drafts from the
 * device batch for model drafters, else from L->batch), the processing and the chain rule on
 * the device, and one copy of the result back: the step's one synchronisation. */
static sd_status spec_verify_cuda(spec_loop *L, int k, int with_q) {
    sd_batch b = {0};
    b.n_tokens = k + 1;
    b.tokens = L->batch;
    b.n_logits = k + 1;
    SD_TRY(sd_forward_ex(L->m, L->kv, &b, NULL, with_q ? sd_cuda_spec_batch(L->sp) : NULL));
    const sd_cuda_sampling cs = cuda_sampling(&L->s);
    const uint64_t pos = (uint64_t)(L->len - L->n_prompt); /* output index of d1 */
    int n_acc = 0, k_used = k;
    int32_t next = 0;
    SD_TRY(sd_cuda_spec_verify(L->sp, L->m->cuda, k, with_q, &cs, L->seed, pos, &n_acc,
                               with_q ? L->batch + 1 : NULL, &next, &k_used));
    return spec_finish_step(L, k_used, n_acc, next);
}
#endif

/* Where the next run of a verify batch's rows to process ends, after `have` of its k + 1: runs
 * of 2, 2, 4, 8, ... rows, so the chain rule runs a few times at most. */
static int rows_next(int have, int k) {
    const int run = have < 2 ? 2 : have;
    return have + run < k + 1 ? have + run : k + 1;
}

/* One verify step: the target scores L->batch = [last, d1 .. dk] in one forward; the chain rule
 * of verify.h keeps a prefix of the drafts (with_q: their distributions are L->q [k][V], else
 * the drafts are deterministic). */
static sd_status spec_verify(spec_loop *L, int k, int with_q) {
#ifdef SD_WITH_CUDA
    if (L->sp != NULL) {
        return spec_verify_cuda(L, k, with_q);
    }
#endif
    const int V = L->m->cfg.vocab_size;
    sd_batch b = {0};
    b.n_tokens = k + 1;
    b.tokens = L->batch;
    b.n_logits = k + 1; /* in one pass: the head's weights are read once for all rows */
    SD_TRY(sd_forward(L->m, L->kv, &b, L->logits));
    /* uniforms keyed by the output position they decide: none is ever used twice */
    double ua[SD_MAX_DRAFT], un[SD_MAX_DRAFT + 1];
    const uint64_t pos = (uint64_t)(L->len - L->n_prompt); /* output index of d1 */
    for (int i = 0; i <= k; i++) {
        if (i < k) {
            ua[i] = sd_rng_uniform(L->seed, SD_STREAM_ACCEPT, pos + (uint64_t)i);
        }
        un[i] = sd_rng_uniform(L->seed, SD_STREAM_EMIT, pos + (uint64_t)i);
    }
    /* The rows processed a run at a time, each run only once every draft before it is
     * accepted: the rows after a rejected draft are never processed (when sampling, a softmax
     * of the vocabulary each). The chain rule decides draft by draft, so it goes on from the
     * first undecided draft over the rows there are; when it rejects one, its decision is the
     * rule's over all k, and the step goes on only when all were accepted. */
    int have = 0, n_acc = 0; /* rows processed; drafts accepted */
    for (;;) {
        const int want = rows_next(have, k);
        for (int r = have; r < want; r++) {
            sd_process_logits(L->probs + (size_t)r * V, L->logits + (size_t)r * V, V, &L->s,
                              L->iwork);
        }
        have = want;
        int32_t next = 0;
        n_acc += sd_verify_chain(&next, L->probs + (size_t)n_acc * V,
                                 with_q ? L->q + (size_t)n_acc * V : NULL, L->batch + 1 + n_acc,
                                 have - 1 - n_acc, V, ua + n_acc, un + n_acc, L->fwork);
        if (n_acc < have - 1 || have == k + 1) {
            return spec_finish_step(L, k, n_acc, next);
        }
    }
}

/* Starts a speculative call: zeroed stats and outputs, parameters checked, 1 <= K <= max,
 * 0 <= p_min <= 1. */
static sd_status spec_prepare(int *n_out, sd_finish_reason *reason, sd_spec_stats *ss,
                              const sd_model *m, const int32_t *prompt, int n_prompt,
                              const sd_generate_params *p, sd_sampling *s, int K, float p_min,
                              float verify_slope) {
    *n_out = 0;
    if (reason != NULL) {
        *reason = SD_FINISH_LENGTH;
    }
    memset(ss, 0, sizeof(*ss));
    SD_TRY(check_params(m, prompt, n_prompt, p, s));
    if (K < 1 || K > SD_MAX_DRAFT) {
        return sd_set_error(SD_ERR_INVALID_ARG, "k must be in [1, %d], got %d", SD_MAX_DRAFT, K);
    }
    if (!(p_min >= 0.0f && p_min <= 1.0f)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "p_min must be in [0, 1], got %g", (double)p_min);
    }
    if (!(verify_slope >= 0.0f)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "verify_slope must be >= 0, got %g",
                            (double)verify_slope);
    }
    return SD_OK;
}

sd_status sd_generate_lookup(int32_t *out, int *n_out, sd_finish_reason *reason,
                             sd_spec_stats *stats, sd_model *m, const int32_t *prompt, int n_prompt,
                             const sd_generate_params *p, const sd_prompt_lookup *pl) {
    const double t_start = now_s();
    sd_spec_stats local;
    sd_spec_stats *ss = stats != NULL ? stats : &local;
    sd_sampling s;
    SD_TRY(
        spec_prepare(n_out, reason, ss, m, prompt, n_prompt, p, &s, pl->k, 0.0f, pl->verify_slope));
    if (pl->min_ngram < 1 || pl->max_ngram < pl->min_ngram) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "n-gram sizes must satisfy 1 <= min_ngram <= max_ngram, got %d and %d",
                            pl->min_ngram, pl->max_ngram);
    }
    if (p->max_new_tokens == 0) {
        return SD_OK;
    }
    const int K = pl->k;
    /* acceptance counted apart for each n-gram size: a long match predicts the continuation
     * far better than a one-token match (on SmolLM2's Spec-Bench answers, 4.5 of 8 drafted
     * tokens accepted after a 4-gram match, 0.6 after a 1-gram one: benchmarks/RESULTS.md);
     * and apart again for matches that extend SD_LOOKUP_LONG or SD_LOOKUP_LONG_MAX tokens back,
     * where the text repeats itself (a list, a loop) and a long draft is nearly always taken.
     * Per bucket: tokens accepted and drafts rejected, the trials of a geometric acceptance
     * (the tokens after a rejected one were never tested, so they do not count). */
    const int n_buckets = pl->max_ngram + 3;
    double *acc_n = calloc((size_t)n_buckets, 2 * sizeof(double));
    double *rej_n = acc_n != NULL ? acc_n + n_buckets : NULL;
    spec_loop L;
    sd_status st = spec_loop_begin(&L, m, prompt, n_prompt, p, &s, K, m->cfg.context_length, 0, out,
                                   ss, t_start);
    if (st == SD_OK && acc_n == NULL) {
        st = sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    while (st == SD_OK && !L.e.done) {
        double t0 = now_s();
        int k = spec_room(&L, p, K), n = 0, extent = 0;
        k = k > 0 ? sd_lookup_draft(L.batch + 1, &n, &extent, L.hist, L.len, pl->max_ngram,
                                    pl->min_ngram, k)
                  : 0;
        /* the acceptance counts this draft is sized by and adds to */
        const int b = extent < SD_LOOKUP_LONG ? n
                      : pl->max_ngram + (extent < SD_LOOKUP_LONG_MAX ? 1 : 2);
        if (pl->verify_slope > 0.0f && k > 0) {
            /* a repeating text starts from the prior of a long run of accepted tokens */
            const double prior = b > pl->max_ngram ? SD_LOOKUP_LONG * (b - pl->max_ngram) : 0.0;
            k = adaptive_k(acc_n[b] + prior, acc_n[b] + rej_n[b] + prior, pl->verify_slope, k,
                           ss->steps);
        }
        L.batch[0] = L.hist[L.len - 1];
        double t1 = now_s();
        const int accepted_before = ss->accepted;
        st = spec_verify(&L, k, 0);
        acc_n[b] += ss->accepted - accepted_before;
        rej_n[b] += ss->accepted - accepted_before < k ? 1.0 : 0.0;
        ss->time_draft_s += t1 - t0;
        ss->time_verify_s += now_s() - t1;
    }
    free(acc_n);
    return spec_loop_end(&L, st, n_out, reason);
}

/* ---- draft model ----------------------------------------------------------------------------- */

/* The largest probability of softmax(logits): how sure a greedy draft is of its token. */
static double top_prob(const float *logits, int V) {
    const float mx = logits[sd_argmax(logits, V)];
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        sum += exp((double)(logits[i] - mx));
    }
    return 1.0 / sum;
}

/* Drafts up to *k tokens one forward at a time with `dm` (its first n_layers layers; 0 = all)
 * over the cache dkv, which holds a prefix of hist (at most all but the last token): the first
 * forward feeds the rest of hist in one batch (the tokens the draft has not seen: the prompt at
 * the first step, the last draft of a step that accepted all, the last token), the others one
 * draft each. L->batch = [last, d1 .. dk], L->q[i] the processed row d(i+1) was taken from
 * (greedy at temperature 0, else sampled). With p_min > 0 drafting stops after a token the
 * draft gave less than p_min (its processed probability when sampling, its softmax probability
 * when greedy); *k is set to the count. With *k == 0 nothing is fed. */
#ifdef SD_WITH_CUDA
/* draft_autoregressive on the device: each draft forward reads the token the previous pick
 * wrote (no copy to the host); a p_min cut marks the draft's end on the device, and the verify
 * step uses only the drafts before it. The draft model's stream and the target's are joined
 * around the drafting, which shares the step's device buffers with the verify. */
static sd_status draft_cuda(spec_loop *L, sd_model *dm, sd_kv_cache *dkv, int n_layers, int k,
                            float p_min) {
    const uint64_t pos = (uint64_t)(L->len - L->n_prompt);
    const int have = sd_kv_cache_length(dkv);
    L->batch[0] = L->hist[L->len - 1];
    SD_TRY(sd_cuda_model_join(dm->cuda, L->m->cuda));
    SD_TRY(sd_cuda_spec_begin(L->sp, dm->cuda, L->batch[0], k));
    const sd_cuda_sampling cs = cuda_sampling(&L->s);
    for (int i = 0; i < k; i++) {
        sd_batch b = {0};
        b.n_tokens = i == 0 ? L->len - have : 1;
        b.tokens = i == 0 ? L->hist + have : NULL;
        b.n_logits = 1;
        b.n_layers = n_layers;
        SD_TRY(sd_forward_ex(dm, dkv, &b, NULL, i == 0 ? NULL : sd_cuda_spec_next_input(L->sp)));
        SD_TRY(sd_cuda_spec_draft_pick(L->sp, dm->cuda, i, &cs, L->seed, pos, p_min));
    }
    return sd_cuda_model_join(L->m->cuda, dm->cuda);
}
#endif

static sd_status draft_autoregressive(spec_loop *L, sd_model *dm, sd_kv_cache *dkv, int n_layers,
                                      int *k, float p_min) {
#ifdef SD_WITH_CUDA
    if (L->sp != NULL) {
        return draft_cuda(L, dm, dkv, n_layers, *k, p_min);
    }
#endif
    const int V = dm->cfg.vocab_size;
    const uint64_t pos = (uint64_t)(L->len - L->n_prompt); /* output index of d1 */
    const int have = sd_kv_cache_length(dkv);
    L->batch[0] = L->hist[L->len - 1];
    for (int i = 0; i < *k; i++) {
        sd_batch b = {0};
        b.n_tokens = i == 0 ? L->len - have : 1;
        b.tokens = i == 0 ? L->hist + have : &L->batch[i];
        b.n_logits = 1;
        b.n_layers = n_layers;
        SD_TRY(sd_forward(dm, dkv, &b, L->dlog));
        float *qi = L->q + (size_t)i * V;
        sd_process_logits(qi, L->dlog, V, &L->s, L->iwork);
        const double u = sd_rng_uniform(L->seed, SD_STREAM_DRAFT, pos + (uint64_t)i);
        const int32_t d = L->s.temperature == 0.0f ? sd_argmax(qi, V) : sd_sample_probs(qi, V, u);
        L->batch[1 + i] = d;
        if (p_min > 0.0f &&
            (L->s.temperature == 0.0f ? top_prob(L->dlog, V) : (double)qi[d]) < (double)p_min) {
            *k = i + 1;
            break;
        }
    }
    return SD_OK;
}

/* Rolls the draft cache back to what hist still holds after a verify step: it was fed up to
 * d(k-1), so it keeps what was accepted; when all k were, dk is left for the next step's first
 * draft forward, which feeds it together with the new last token. */
static sd_status draft_rollback(sd_kv_cache *dkv, int len) {
    const int have = sd_kv_cache_length(dkv);
    return have > len - 1 ? sd_kv_cache_set_length(dkv, len - 1) : SD_OK;
}

/* The draft length of a model drafter's step: up to `room`, sized by dp's adaptive rule when
 * it is on (draft_cost: one draft token relative to a target forward). */
static int model_draft_k(const sd_draft_params *dp, const sd_spec_stats *ss, double draft_cost,
                         int room) {
    if (dp->verify_slope <= 0.0f || room == 0) {
        return room;
    }
    return adaptive_k(ss->accepted, ss->drafted, (float)(dp->verify_slope + draft_cost), room,
                      ss->steps);
}

sd_status sd_generate_draft(int32_t *out, int *n_out, sd_finish_reason *reason,
                            sd_spec_stats *stats, sd_model *m, sd_model *dm,
                            const sd_draft_params *dp, const int32_t *prompt, int n_prompt,
                            const sd_generate_params *p) {
    const double t_start = now_s();
    sd_spec_stats local;
    sd_spec_stats *ss = stats != NULL ? stats : &local;
    sd_sampling s;
    const int K = dp->k;
    SD_TRY(spec_prepare(n_out, reason, ss, m, prompt, n_prompt, p, &s, K, dp->p_min,
                        dp->verify_slope));
    if (dm->cfg.vocab_size != m->cfg.vocab_size) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "the draft model's vocabulary (%d tokens) differs from the target's "
                            "(%d tokens): they must share one tokenizer",
                            dm->cfg.vocab_size, m->cfg.vocab_size);
    }
    if (dm->device != m->device) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "the draft model runs on the %s and the target on the %s: load both "
                            "on the same device",
                            dm->device == SD_DEVICE_CUDA ? "GPU" : "CPU",
                            m->device == SD_DEVICE_CUDA ? "GPU" : "CPU");
    }
#ifdef SD_WITH_CUDA
    if (m->cuda != NULL && sd_cuda_model_gpu(dm->cuda) != sd_cuda_model_gpu(m->cuda)) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "the draft model is on GPU %d and the target on GPU %d: load both on "
                            "one GPU",
                            sd_cuda_model_gpu(dm->cuda), sd_cuda_model_gpu(m->cuda));
    }
#endif
    if (p->max_new_tokens == 0) {
        return SD_OK;
    }
    const int total = n_prompt + p->max_new_tokens;
    const int ctx = m->cfg.context_length < dm->cfg.context_length ? m->cfg.context_length
                                                                   : dm->cfg.context_length;
    if (total > ctx) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "prompt (%d tokens) + max_new_tokens (%d) exceeds the context length "
                            "%d of the draft model",
                            n_prompt, p->max_new_tokens, dm->cfg.context_length);
    }
    sd_kv_cache *dkv = NULL;
    spec_loop L;
    sd_status st = spec_loop_begin(&L, m, prompt, n_prompt, p, &s, K, ctx, 1, out, ss, t_start);
    if (st == SD_OK) {
        st = sd_kv_cache_create(&dkv, dm, sd_kv_cache_capacity(L.kv));
    }
    const double draft_cost = (double)sd_model_weight_bytes(dm) / (double)sd_model_weight_bytes(m);
    while (st == SD_OK && !L.e.done) {
        double t0 = now_s();
        int k = model_draft_k(dp, ss, draft_cost, spec_room(&L, p, K));
        st = draft_autoregressive(&L, dm, dkv, 0, &k, dp->p_min);
        double t1 = now_s();
        if (st == SD_OK) {
            st = spec_verify(&L, k, 1);
        }
        if (st == SD_OK && !L.e.done) {
            st = draft_rollback(dkv, L.len);
        }
        if (st == SD_OK && !L.e.done && L.check_cache) {
            /* the draft may lag (tokens it has not been fed yet) but never hold more than
             * all but the last token */
            const int n = sd_kv_cache_length(dkv);
            st = n > L.len - 1
                     ? sd_set_error(SD_ERR_INTERNAL,
                                    "cache check after step %d: the draft model "
                                    "cache holds %d slots, more than %d",
                                    ss->steps, n, L.len - 1)
                     : check_cache(dm, dkv, L.hist, n, L.n_prompt, "draft model", ss->steps);
        }
        ss->time_draft_s += t1 - t0;
        ss->time_verify_s += now_s() - t1;
    }
    sd_kv_cache_free(dkv);
    return spec_loop_end(&L, st, n_out, reason);
}

/* ---- self-speculation: the target's first layers as the draft -------------------------------- */

sd_status sd_generate_layerskip(int32_t *out, int *n_out, sd_finish_reason *reason,
                                sd_spec_stats *stats, sd_model *m, int n_layers,
                                const sd_draft_params *dp, const int32_t *prompt, int n_prompt,
                                const sd_generate_params *p) {
    const double t_start = now_s();
    sd_spec_stats local;
    sd_spec_stats *ss = stats != NULL ? stats : &local;
    sd_sampling s;
    const int K = dp->k;
    SD_TRY(spec_prepare(n_out, reason, ss, m, prompt, n_prompt, p, &s, K, dp->p_min,
                        dp->verify_slope));
    if (n_layers < 1 || n_layers >= m->cfg.n_layers) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "the draft's layers must be in [1, %d) (the target has %d), got %d",
                            m->cfg.n_layers, m->cfg.n_layers, n_layers);
    }
    if (p->max_new_tokens == 0) {
        return SD_OK;
    }
    spec_loop L;
    sd_status st = spec_loop_begin(&L, m, prompt, n_prompt, p, &s, K, m->cfg.context_length, 1, out,
                                   ss, t_start);
    const double draft_cost = (double)n_layers / (double)m->cfg.n_layers;
    while (st == SD_OK && !L.e.done) {
        double t0 = now_s();
        int k = model_draft_k(dp, ss, draft_cost, spec_room(&L, p, K));
        /* draft: one early-exit forward per token, in the target's own cache. The first
         * n_layers layers of a token compute exactly what the target's do, so the verify
         * forward below rewrites the same slots; no second cache, no catch-up. */
        st = draft_autoregressive(&L, m, L.kv, n_layers, &k, dp->p_min);
        double t1 = now_s();
        if (st == SD_OK) {
            st = sd_kv_cache_set_length(L.kv, L.len - 1);
        }
        if (st == SD_OK) {
            st = spec_verify(&L, k, 1);
        }
        ss->time_draft_s += t1 - t0;
        ss->time_verify_s += now_s() - t1;
    }
    return spec_loop_end(&L, st, n_out, reason);
}

/* ---- benchmarks: synthetic acceptance ------------------------------------------------------ */

sd_status sd_bench_synthetic(int32_t *out, int *n_out, sd_spec_stats *stats, sd_model *m,
                             const int32_t *prompt, int n_prompt, int max_new_tokens, int k,
                             double alpha, uint64_t seed) {
    const double t_start = now_s();
    sd_spec_stats local;
    sd_spec_stats *ss = stats != NULL ? stats : &local;
    sd_generate_params p = sd_generate_default_params();
    p.max_new_tokens = max_new_tokens;
    p.seed = seed;
    sd_sampling s;
    SD_TRY(spec_prepare(n_out, NULL, ss, m, prompt, n_prompt, &p, &s, k, 0.0f, 0.0f));
    if (!(alpha >= 0.0 && alpha <= 1.0)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "alpha must be in [0, 1], got %g", alpha);
    }
    if (max_new_tokens == 0) {
        return SD_OK;
    }
    const int V = m->cfg.vocab_size;
    spec_loop L;
    sd_status st = spec_loop_begin(&L, m, prompt, n_prompt, &p, &s, k, m->cfg.context_length, 0,
                                   out, ss, t_start);
    while (st == SD_OK && !L.e.done) {
        const double t0 = now_s();
        /* free drafting: copies of the last token, valid ids whose values do not matter */
        const int kk = spec_room(&L, &p, k);
        L.batch[0] = L.hist[L.len - 1];
        for (int i = 0; i < kk; i++) {
            L.batch[1 + i] = L.batch[0];
        }
        const double t1 = now_s();
        const uint64_t pos = (uint64_t)(L.len - L.n_prompt);
        int n_acc = 0;
        int32_t next = 0;
        sd_batch b = {0};
        b.n_tokens = kk + 1;
        b.tokens = L.batch;
        b.n_logits = kk + 1;
#ifdef SD_WITH_CUDA
        if (L.sp != NULL) {
            st = sd_forward_ex(m, L.kv, &b, NULL, NULL);
            if (st == SD_OK) {
                st = sd_cuda_spec_synthetic(L.sp, m->cuda, kk, alpha, seed, pos, &n_acc, &next);
            }
        } else
#endif
        {
            st = sd_forward(m, L.kv, &b, L.logits);
            if (st == SD_OK) {
                int32_t n32 = 0;
                sd_twin_synthetic_accept(&n32, kk, alpha, seed, pos);
                n_acc = n32;
                next = sd_argmax(L.logits + (size_t)n_acc * (size_t)V, V);
            }
        }
        if (st == SD_OK) {
            st = spec_finish_step(&L, kk, n_acc, next);
        }
        ss->time_draft_s += t1 - t0;
        ss->time_verify_s += now_s() - t1;
    }
    return spec_loop_end(&L, st, n_out, NULL);
}
