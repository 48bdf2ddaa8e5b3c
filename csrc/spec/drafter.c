/* drafter.c — what drafters share: allocation and release of a drafter, the checks of the model
 * drafters' parameters, and the adaptive draft length. */
#include "spec/drafter.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/model.h"
#include "spec/decode.h"
#include "spec/drafters/lookup_history.h"
#include "util/status.h"

sd_status sd_drafter_alloc(sd_drafter **out, const sd_drafter_ops *ops, int max_nodes,
                           int wants_q) {
    *out = NULL;
    sd_drafter *d = calloc(1, sizeof(*d));
    if (d == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    if ((d->cost = calloc(1, sizeof(*d->cost))) == NULL ||
        pthread_mutex_init(&d->cost->lock, NULL) != 0) {
        free(d->cost);
        free(d);
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    d->ops = ops;
    d->max_nodes = max_nodes;
    d->wants_q = wants_q;
    d->context = INT_MAX;
    *out = d;
    return SD_OK;
}

void sd_drafter_free(sd_drafter *d) {
    if (d != NULL && d->ops->destroy != NULL) {
        d->ops->destroy(d);
    }
    if (d != NULL) {
        sd_head_free(d->head);
        sd_lookup_history_free(d->history);
    }
    if (d != NULL && d->cost != NULL) {
        pthread_mutex_destroy(&d->cost->lock);
        free(d->cost);
    }
    free(d);
}

int sd_drafter_max_draft(const sd_drafter *d) {
    return d->max_nodes;
}

const char *sd_drafter_name(const sd_drafter *d) {
    return d->ops->name;
}

const sd_head *sd_drafter_head(const sd_drafter *d) {
    return d->head;
}

sd_status sd_check_max_draft(int k) {
    if (k < 1 || k > SD_MAX_DRAFT) {
        return sd_set_error(SD_ERR_INVALID_ARG, "k must be in [1, %d], got %d", SD_MAX_DRAFT, k);
    }
    return SD_OK;
}

sd_status sd_drafter_check_draft_params(const sd_draft_params *dp) {
    SD_TRY(sd_check_max_draft(dp->k));
    if (!(dp->p_min >= 0.0f && dp->p_min <= 1.0f)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "p_min must be in [0, 1], got %g",
                            (double)dp->p_min);
    }
    if (dp->branching < 1 || dp->branching > SD_MODEL_MAX_BRANCHING) {
        return sd_set_error(SD_ERR_INVALID_ARG, "branching must be in [1, %d], got %d",
                            SD_MODEL_MAX_BRANCHING, dp->branching);
    }
    if (dp->nodes < 1 || dp->nodes > SD_MAX_TREE_NODES) {
        return sd_set_error(SD_ERR_INVALID_ARG, "nodes must be in [1, %d], got %d",
                            SD_MAX_TREE_NODES, dp->nodes);
    }
    return sd_drafter_check_slope(dp->verify_slope);
}

sd_status sd_drafter_check_slope(float verify_slope) {
    if (!(verify_slope >= 0.0f)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "verify_slope must be >= 0, got %g",
                            (double)verify_slope);
    }
    return SD_OK;
}

/* Prompt lookup counts as trials the accepted tokens and the rejected drafts, the model drafters
 * all drafted tokens. */
int sd_adaptive_k(double accepted, double trials, float slope, int kmax, int step) {
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

int sd_model_draft_k(const sd_draft_params *dp, const sd_spec_stats *ss, double draft_cost,
                     int room) {
    if (dp->verify_slope <= 0.0f || room == 0) {
        return room;
    }
    return sd_adaptive_k(ss->accepted, ss->drafted, (float)(dp->verify_slope + draft_cost), room,
                         ss->steps);
}

/* One forward of T tokens in tree form (a chain mask, explicit positions) after `ctx` cached
 * tokens; the fastest of three timed runs after a warm-up, in seconds. */
static sd_status time_forward(double *best, sd_model *m, sd_kv_cache *kv, const int32_t *tok,
                              int ctx, int T, uint8_t *mask, float *logits) {
    int32_t pos[SD_MAX_TREE_NODES + 1];
    const int cols = ctx + T;
    for (int r = 0; r < T; r++) {
        pos[r] = ctx + r;
        memset(mask + (size_t)r * (size_t)cols, 1, (size_t)(ctx + r + 1));
        memset(mask + (size_t)r * (size_t)cols + ctx + r + 1, 0, (size_t)(T - r - 1));
    }
    sd_batch b = {0};
    b.n_tokens = T;
    b.tokens = tok + ctx;
    b.pos = pos;
    b.mask = mask;
    b.n_mask_cols = cols;
    b.n_logits = T;
    *best = 1e30;
    for (int run = 0; run < 4; run++) {
        SD_TRY(sd_kv_cache_set_length(kv, ctx));
        const double t0 = sd_now_s();
        SD_TRY(sd_forward_ex(m, kv, &b, logits, NULL));
        const double dt = sd_now_s() - t0;
        if (run > 0 && dt < *best) { /* run 0 warms up */
            *best = dt;
        }
    }
    return SD_OK;
}

static sd_status measure(sd_cost_curve *c, sd_model *m, int max_T);
static void ratios(const double *secs, int max_T, float *rel);

/* The curve the model keeps (sd_model_costs), when it was measured for this thread count and
 * cache type and for at least max_T tokens: copied into c (up to max_T tokens), 1; else 0. */
static int memo_read(sd_cost_curve *c, sd_model *m, int threads, int max_T) {
    sd_model_costs *mc = &m->costs;
    pthread_mutex_lock(&mc->lock);
    const int hit = mc->asked >= max_T && mc->threads == threads && mc->kv_f16 == m->kv_f16;
    if (hit) {
        c->max_T = mc->max_T < max_T ? mc->max_T : max_T; /* less where the context is short */
        memcpy(c->ctx, mc->ctx, sizeof(c->ctx));
        memcpy(c->secs, mc->secs, sizeof(c->secs));
    }
    pthread_mutex_unlock(&mc->lock);
    if (hit) {
        ratios(c->secs[0], c->max_T, c->rel);
    }
    return hit;
}

/* c, just measured for `asked` tokens, kept by the model for the drafters after this one. */
static void memo_write(const sd_cost_curve *c, sd_model *m, int threads, int asked) {
    sd_model_costs *mc = &m->costs;
    pthread_mutex_lock(&mc->lock);
    mc->asked = asked;
    mc->max_T = c->max_T;
    mc->threads = threads;
    mc->kv_f16 = m->kv_f16;
    memcpy(mc->ctx, c->ctx, sizeof(mc->ctx));
    memcpy(mc->secs, c->secs, sizeof(mc->secs));
    pthread_mutex_unlock(&mc->lock);
}

sd_status sd_cost_curve_measure(sd_cost_curve *c, sd_model *m, int max_T) {
    max_T = max_T < 1 ? 1 : max_T > SD_MAX_TREE_NODES + 1 ? SD_MAX_TREE_NODES + 1 : max_T;
    const int threads = sd_model_threads(m);
    pthread_mutex_lock(&c->lock);
    sd_status st = SD_OK;
    if (c->threads >= 0 && (c->threads != threads || c->asked < max_T)) {
        if (!memo_read(c, m, threads, max_T)) {
            st = measure(c, m, max_T);
            if (st == SD_OK) {
                memo_write(c, m, threads, max_T);
            }
        }
        if (st == SD_OK) {
            c->asked = max_T;
            c->threads = threads;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

/* rel[T] = secs[T] / secs[1] for T = 1 .. max_T, never falling as T grows (rel[0] = 0). */
static void ratios(const double *secs, int max_T, float *rel) {
    /* a clock too coarse for one forward must not divide by zero */
    const double one = secs[1] > 1e-9 ? secs[1] : 1e-9;
    rel[0] = 0.0f;
    rel[1] = 1.0f;
    for (int T = 2; T <= max_T; T++) {
        const float r = (float)(secs[T] / one);
        rel[T] = r < rel[T - 1] ? rel[T - 1] : r;
    }
}

void sd_cost_curve_get(sd_cost_curve *c, int len, sd_cost_curve *copy) {
    pthread_mutex_lock(&c->lock);
    copy->threads = c->threads;
    copy->asked = c->asked;
    copy->max_T = c->max_T;
    memcpy(copy->rel, c->rel, sizeof(c->rel));
    memcpy(copy->ctx, c->ctx, sizeof(c->ctx));
    memcpy(copy->secs, c->secs, sizeof(c->secs));
    pthread_mutex_unlock(&c->lock);
    if (copy->ctx[1] <= copy->ctx[0] || copy->max_T < 1) {
        return;
    }
    double secs[SD_MAX_TREE_NODES + 2];
    for (int T = 1; T <= copy->max_T; T++) {
        secs[T] = sd_cost_curve_secs(copy, len, T);
    }
    ratios(secs, copy->max_T, copy->rel);
}

double sd_cost_curve_secs(const sd_cost_curve *c, int len, int T) {
    const int lo = c->ctx[0], hi = c->ctx[1];
    if (hi <= lo) {
        return c->secs[0][T];
    }
    /* a forward's seconds are linear in the text's length: interpolated between the two
     * measured lengths, extrapolated past them */
    const double w = (double)((len > lo ? len : lo) - lo) / (double)(hi - lo);
    return c->secs[0][T] + w * (c->secs[1][T] - c->secs[0][T]);
}

/* The seconds of forwards of T = 1 .. max_T tokens after ctx cached ones (kv holds tok's first
 * ctx), measured at a few sizes and interpolated between them, into secs. */
static sd_status measure_at(double *secs, sd_model *m, sd_kv_cache *kv, const int32_t *tok, int ctx,
                            int max_T, uint8_t *mask, float *logits) {
    /* measured sizes (increasing, the last max_T); the others interpolated between them */
    static const int sizes[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, SD_MAX_TREE_NODES + 1};
    int Ts[sizeof(sizes) / sizeof(sizes[0])];
    double at[sizeof(sizes) / sizeof(sizes[0])];
    int n_pts = 0;
    for (int i = 0; i < (int)(sizeof(sizes) / sizeof(sizes[0])); i++) {
        Ts[n_pts] = sizes[i] < max_T ? sizes[i] : max_T;
        SD_TRY(time_forward(&at[n_pts], m, kv, tok, ctx, Ts[n_pts], mask, logits));
        if (Ts[n_pts++] == max_T) {
            break;
        }
    }
    for (int T = 1, j = 0; T <= max_T; T++) {
        while (j + 1 < n_pts - 1 && Ts[j + 1] < T) {
            j++;
        }
        const int k = j + 1 < n_pts ? j + 1 : j;
        const double w = Ts[k] > Ts[j] ? (double)(T - Ts[j]) / (double)(Ts[k] - Ts[j]) : 0.0;
        secs[T] = at[j] + w * (at[k] - at[j]);
    }
    return SD_OK;
}

void sd_verify_cost_fit(const double *len, const int *T, const double *add, int n, double *b0,
                        double *b1) {
    /* attention reads every cached row once for the batch and computes each of its tokens
     * against them: least squares over all the timings, so that their noise averages out rather
     * than being carried far by extrapolation */
    double aa = 0.0, ab = 0.0, bb = 0.0, ay = 0.0, by = 0.0;
    for (int i = 0; i < n; i++) {
        const double a = len[i], b = len[i] * (double)(T[i] - 1);
        aa += a * a;
        ab += a * b;
        bb += b * b;
        ay += a * add[i];
        by += b * add[i];
    }
    const double det = aa * bb - ab * ab; /* >= 0; about 0 when all the timings are of one size */
    double f0 = aa > 0.0 ? ay / aa : 0.0, f1 = 0.0; /* one slope for every size */
    if (det > 1e-12 * aa * bb) {
        const double g0 = (ay * bb - by * ab) / det, g1 = (aa * by - ab * ay) / det;
        if (g0 >= 0.0 && g1 >= 0.0) {
            f0 = g0;
            f1 = g1;
        } else if (g1 > 0.0) { /* the best fit through the origin for one token */
            f0 = 0.0;
            f1 = by / bb;
        } /* else a slope that falls with the batch: the one-slope fit */
    }
    *b0 = f0 > 0.0 ? f0 : 0.0;
    *b1 = f1 > 0.0 ? f1 : 0.0;
}

/* The measurement of sd_cost_curve_measure (c's lock held): every size after a short text
 * (ctx[0]); then forwards of a few sizes after longer texts (320 and 1024 tokens, where the
 * model's context holds them), whose added seconds sd_verify_cost_fit turns into the curve after
 * ctx[1], the longest: interpolated linearly between the two by sd_cost_curve_secs. */
static sd_status measure(sd_cost_curve *c, sd_model *m, int max_T) {
    static const int longer[] = {320, 1024};
    static const int sizes[] = {1, 2, 4, 8, SD_MAX_TREE_NODES + 1};
    enum { N_LONGER = sizeof(longer) / sizeof(longer[0]), N_SIZES = sizeof(sizes) / sizeof(int) };
    const int V = m->cfg.vocab_size, n_ctx = m->cfg.context_length;
    int ctx[2] = {64, 0};
    ctx[0] = n_ctx - max_T < ctx[0] ? n_ctx - max_T : ctx[0];
    ctx[0] = ctx[0] < 1 ? 1 : ctx[0];
    if (ctx[0] + max_T > n_ctx) {
        max_T = n_ctx - ctx[0];
    }
    for (int i = 0; i < N_LONGER; i++) { /* a short model: fewer lengths, or one context */
        ctx[1] = longer[i] + max_T <= n_ctx ? longer[i] : ctx[1];
    }
    const int most = (ctx[1] > 0 ? ctx[1] : ctx[0]) + max_T;
    int32_t *tok = malloc((size_t)most * sizeof(int32_t));
    uint8_t *mask = malloc((size_t)max_T * (size_t)most);
    float *logits = m->cuda == NULL ? malloc((size_t)max_T * (size_t)V * sizeof(float)) : NULL;
    sd_kv_cache *kv = NULL;
    sd_status st = tok == NULL || mask == NULL || (m->cuda == NULL && logits == NULL)
                       ? sd_set_error(SD_ERR_NOMEM, "out of memory measuring verify costs")
                       : SD_OK;
    if (st == SD_OK) {
        st = sd_kv_cache_create(&kv, m, most);
    }
    for (int i = 0; st == SD_OK && i < most; i++) { /* ids spread over the vocabulary */
        tok[i] = (int32_t)((1000003u * (unsigned)(i + 1)) % (unsigned)V);
    }
    sd_batch b = {0};
    b.tokens = tok;
    b.n_tokens = ctx[0];
    if (st == SD_OK) {
        st = sd_forward(m, kv, &b, NULL);
    }
    if (st == SD_OK) {
        st = measure_at(c->secs[0], m, kv, tok, ctx[0], max_T, mask, logits);
    }
    double len[N_LONGER * N_SIZES], add[N_LONGER * N_SIZES];
    int Ts[N_LONGER * N_SIZES], n_pts = 0, at = ctx[0];
    for (int i = 0; st == SD_OK && ctx[1] > 0 && i < N_LONGER && longer[i] <= ctx[1]; i++) {
        /* the cache grows from the last length to this one. On the CPU its new slots are copies
         * of the ctx[0] computed ones in turn, not computed themselves: a forward reads them as
         * it would read a text's (values of the same kind, from memory), and prefilling 1,024
         * tokens took half of the measurement's second. A GPU prefills them (in milliseconds) */
        st = sd_kv_cache_set_length(kv, at);
        if (st == SD_OK && m->cuda != NULL) {
            b.tokens = tok + at;
            b.n_tokens = longer[i] - at;
            st = sd_forward(m, kv, &b, NULL);
        } else if (st == SD_OK) {
            for (int s = at; st == SD_OK && s < longer[i]; s++) {
                st = sd_kv_cache_copy_slot(kv, s, s % ctx[0]);
            }
            st = st == SD_OK ? sd_kv_cache_skip(kv, longer[i]) : st;
        }
        at = longer[i];
        for (int j = 0; st == SD_OK && j < N_SIZES; j++) {
            const int T = sizes[j] < max_T ? sizes[j] : max_T;
            double t = 0.0;
            st = time_forward(&t, m, kv, tok, at, T, mask, logits);
            len[n_pts] = (double)(at - ctx[0]);
            Ts[n_pts] = T;
            add[n_pts++] = t - c->secs[0][T];
            if (T == max_T) {
                break;
            }
        }
    }
    if (st == SD_OK) {
        double b0 = 0.0, b1 = 0.0;
        sd_verify_cost_fit(len, Ts, add, n_pts, &b0, &b1);
        const double span = (double)(ctx[1] - ctx[0]);
        for (int T = 1; ctx[1] > 0 && T <= max_T; T++) {
            c->secs[1][T] = c->secs[0][T] + span * (b0 + b1 * (double)(T - 1));
        }
        c->ctx[0] = ctx[0];
        c->ctx[1] = ctx[1];
        c->max_T = max_T;
        ratios(c->secs[0], max_T, c->rel);
    }
    sd_kv_cache_free(kv);
    free(tok);
    free(mask);
    free(logits);
    return st;
}

int sd_tree_size(const float *p, int n, const sd_cost_curve *c, int *order) {
    for (int i = 0; i < n; i++) { /* insertion sort by decreasing p, stable */
        int j = i;
        while (j > 0 && p[order[j - 1]] < p[i]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    double gain = 1.0, best_v = 1.0; /* no node: one token per forward of one */
    int best = 0;
    for (int k = 1; k <= n && k + 1 <= c->max_T; k++) {
        gain += p[order[k - 1]];
        const double v = gain / (double)c->rel[k + 1];
        if (v > best_v) {
            best_v = v;
            best = k;
        }
    }
    return best;
}

int sd_drafter_costs(const sd_drafter *d, int len, float *rel, int cap) {
    sd_cost_curve c;
    sd_cost_curve_get(d->cost, len, &c);
    const int n = c.threads != 0 ? c.max_T : 0;
    for (int T = 1; T <= n && T <= cap; T++) {
        rel[T - 1] = c.rel[T];
    }
    return n < cap ? n : cap;
}

sd_status sd_drafter_set_history(sd_drafter *d, int tokens) {
    if (tokens < 0 || tokens > SD_LOOKUP_HISTORY_MAX_TOKENS) {
        return sd_set_error(SD_ERR_INVALID_ARG, "history must be in [0, %d] tokens, got %d",
                            SD_LOOKUP_HISTORY_MAX_TOKENS, tokens);
    }
    sd_lookup_history *hs = NULL;
    if (tokens > 0) {
        SD_TRY(sd_lookup_history_create(&hs, tokens));
    }
    sd_lookup_history_free(d->history);
    d->history = hs;
    return SD_OK;
}

sd_status sd_drafter_set_costs(sd_drafter *d, const float *rel, int n) {
    if (n < 1 || n > SD_MAX_TREE_NODES + 1) {
        return sd_set_error(SD_ERR_INVALID_ARG, "verify costs: need 1 to %d entries, got %d",
                            SD_MAX_TREE_NODES + 1, n);
    }
    for (int i = 0; i < n; i++) {
        if (!(rel[i] > 0.0f && rel[i] < 1e30f) || (i > 0 && rel[i] < rel[i - 1])) {
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "verify costs must be positive, finite and non-decreasing "
                                "(entry %d is %g)",
                                i, (double)rel[i]);
        }
    }
    pthread_mutex_lock(&d->cost->lock);
    for (int T = 1; T <= n; T++) {
        d->cost->rel[T] = rel[T - 1] / rel[0];
    }
    d->cost->max_T = n;
    d->cost->ctx[1] = 0;                             /* the same costs after any text */
    memset(d->cost->secs, 0, sizeof(d->cost->secs)); /* no seconds: nothing sized by timings */
    d->cost->threads = -1;
    pthread_mutex_unlock(&d->cost->lock);
    return SD_OK;
}
