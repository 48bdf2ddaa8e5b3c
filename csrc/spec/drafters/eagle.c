/* eagle.c — the EAGLE drafter (EAGLE-1/2 and EAGLE-3 heads, model/head.h): the head keeps its
 * own cache of the text's rows, each fed with the target's features of its position; a step
 * first feeds the rows the last verify made known (the accepted tokens' features), then grows a
 * tree from the text's last token (model_tree.h: EAGLE-2's dynamic tree, or a chain), each
 * drafted row reading its parent's output in place of the target's features. After the verify
 * the head's cache forgets the drafted rows: the accepted tokens come back with the target's
 * own features at the next step, as the EAGLE authors' code does.
 *
 * Rows and positions: the head's row at position t reads token text[t + 1] and predicts text[t +
 * 2], so its cache lags the text by one: after the root is fed it holds positions 0 .. len - 2
 * (len - 1 slots), the root's row last, and a node at depth d sits at position len - 2 + d.
 * With a sliding window of w (sd_drafter_eagle's window) a feed of more than w rows computes
 * only its last w; the slots before them are never attended again and stay uncomputed. */
#include <stdlib.h>
#include <string.h>

#include "model/head.h"
#include "spec/drafter.h"
#include "spec/drafters/model_tree.h"
#include "spec/lookup.h"
#include "spec/loop.h"
#include "util/clock.h"
#include "util/status.h"

#define FED_MAX (SD_MAX_TREE_NODES + 1)
/* What the drafter knows of its two ways of drafting, over a request's steps: the head's steps
 * (their number, accepted drafts, verify size as rel[T], seconds drafting and verifying) and
 * lookup's counts by kind of match (sd_lookup_rate). */
typedef struct {
    int step_lookup; /* the step in flight drafted by lookup */
    int bucket;      /* ... its kind of match */
    double steps, accepted, rel, draft_s, verify_s;
    double verify_mark; /* the loop's verify seconds when the last head step was proposed */
    sd_lookup_side side;
    int32_t tokens[SD_MAX_DRAFT];
    int32_t parent[SD_MAX_DRAFT];
} eagle_mix;

/* A request's state. */
typedef struct {
    const sd_head *head;
    sd_model *hm;        /* the head over this request's target */
    sd_kv_cache *hkv;    /* its rows of the text (target features), then a step's nodes */
    sd_model_tree *tree; /* the step's tree */
    sd_spec_loop *L;
    int D, V, Vd;
    float *out;         /* (FED_MAX, D) the head's output at each fed node (0: the root) */
    float *x;           /* (rows, D) rows entering the head's layer */
    float *f;           /* (rows, W) their features */
    float *last;        /* (rows, D) the head's outputs of a forward (its aux layer 1) */
    float *raw;         /* (rows, V) logits before their spreading to the target's ids */
    int rows;           /* the rows x, f, last and raw hold */
    const int32_t *ids; /* greedy with a reduced vocabulary: (Vd) target id of each draft id,
                         * the tree's rows then left over the Vd (model_tree.h); else NULL */
    int prefix;         /* the text's rows the head held after the last step's root */
    eagle_mix mix;
} eagle_state;

static sd_status grow_rows(eagle_state *s, int T, int W) {
    if (T <= s->rows) {
        return SD_OK;
    }
    free(s->x);
    free(s->f);
    free(s->last);
    free(s->raw);
    s->x = malloc((size_t)T * (size_t)s->D * sizeof(float));
    s->f = malloc((size_t)T * (size_t)W * sizeof(float));
    s->last = malloc((size_t)T * (size_t)s->D * sizeof(float));
    s->raw = malloc((size_t)T * (size_t)s->Vd * sizeof(float));
    s->rows = 0;
    if (s->x == NULL || s->f == NULL || s->last == NULL || s->raw == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory for the EAGLE head's rows");
    }
    s->rows = T;
    return SD_OK;
}

/* The head's forward over b (its rows x already in s->x): logits of its last n_logits rows
 * into logits (n_logits, V, the target's ids; with s->ids, Vd, the draft's), every row's
 * output into s->last. */
static sd_status head_forward(eagle_state *s, sd_batch *b, float *logits) {
    static const int32_t after_layer[1] = {1};
    b->embd = s->x;
    b->aux_layers = after_layer;
    b->n_aux = 1;
    b->aux = s->last;
    if (s->ids != NULL) {
        return sd_forward(s->hm, s->hkv, b, logits);
    }
    SD_TRY(sd_forward(s->hm, s->hkv, b, s->raw));
    return sd_head_map_logits(s->head, s->V, s->raw, b->n_logits, logits);
}

/* The root: the text's rows the head lacks, positions have .. len - 2, with the target's
 * features (known for every position but the last token's), the root's row last. */
static sd_status feed_root(void *ctx, sd_spec_loop *L, float *logits, int *prefix) {
    eagle_state *s = ctx;
    int have = sd_kv_cache_length(s->hkv), T = L->len - 1 - have;
    const int window = s->hm->cfg.sliding_window;
    if (window > 0 && T > window && s->hm->cfg.n_layers == 1) {
        /* a long prompt under a sliding window: the root and every later row attend to the
         * last `window` rows alone, and with one layer a row's keys and values do not depend
         * on what its own attention saw, so the rows before them are never computed */
        SD_TRY(sd_kv_cache_skip(s->hkv, L->len - 1 - window));
        have = L->len - 1 - window;
        T = window;
    }
    *prefix = s->prefix = have;
    if (T < 1) {
        return SD_OK; /* a one-token prompt: no features yet */
    }
    const int W = L->feat_w;
    SD_TRY(grow_rows(s, T, W));
    memcpy(s->f, sd_spec_features(L, have), (size_t)T * (size_t)W * sizeof(float));
    SD_TRY(sd_head_rows(s->head, s->hm, T, L->hist + have + 1, s->f, 1, s->x));
    sd_batch b = {0};
    b.n_tokens = T;
    b.tokens = L->hist + have + 1;
    b.n_logits = 1;
    SD_TRY(head_forward(s, &b, logits));
    memcpy(s->out, s->last + (size_t)(T - 1) * (size_t)s->D, (size_t)s->D * sizeof(float));
    *prefix = s->prefix = L->len - 1;
    return SD_OK;
}

/* A depth's nodes: each row reads its parent's output in place of the target's features. */
static sd_status feed_nodes(void *ctx, const sd_batch *bt, const int *parent_fed, int first,
                            float *logits) {
    eagle_state *s = ctx;
    const int T = bt->n_tokens, D = s->D;
    SD_TRY(grow_rows(s, T, s->L->feat_w));
    for (int j = 0; j < T; j++) {
        memcpy(s->f + (size_t)j * (size_t)D, s->out + (size_t)parent_fed[j] * (size_t)D,
               (size_t)D * sizeof(float));
    }
    SD_TRY(sd_head_rows(s->head, s->hm, T, bt->tokens, s->f, 0, s->x));
    sd_batch b = *bt;
    SD_TRY(head_forward(s, &b, logits));
    if (first + T > FED_MAX) {
        return sd_set_error(SD_ERR_INTERNAL, "an EAGLE tree fed more than %d nodes", FED_MAX);
    }
    memcpy(s->out + (size_t)first * (size_t)D, s->last, (size_t)T * (size_t)D * sizeof(float));
    return SD_OK;
}

static sd_status eagle_check(const sd_drafter *d, const sd_model *m, int n_prompt,
                             int max_new_tokens) {
    (void)n_prompt;
    (void)max_new_tokens;
    return sd_head_check(d->head, m);
}

static int eagle_features(const sd_drafter *d, const sd_model *target, int32_t *aux, int *n_aux) {
    *n_aux = sd_head_aux_layers(d->head, target, aux);
    return *n_aux ==
           0; /* EAGLE-1/2: the final-normed hidden state; EAGLE-3: three layers' inputs */
}

static void eagle_end(const sd_drafter *d, void *state) {
    (void)d;
    eagle_state *s = state;
    if (s != NULL) {
        sd_model_tree_free(s->tree);
        sd_kv_cache_free(s->hkv);
        sd_model_free(s->hm);
        free(s->out);
        free(s->x);
        free(s->f);
        free(s->last);
        free(s->raw);
        free(s);
    }
}

/* The tree's parameters: a chain (branching 1) keeps k nodes. */
static sd_draft_params tree_params(const sd_drafter *d) {
    sd_draft_params dp = d->u.m.dp;
    if (dp.branching == 1) {
        dp.nodes = dp.k;
    }
    return dp;
}

static sd_status eagle_begin(const sd_drafter *d, void **state, sd_spec_loop *L) {
    eagle_state *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    *state = s;
    s->head = d->head;
    s->L = L;
    s->D = L->m->cfg.hidden_size;
    s->V = L->m->cfg.vocab_size;
    s->Vd = sd_head_vocab(s->head, L->m);
    /* greedy trees read a row's best tokens and softmax: over the draft's vocabulary alone,
     * not spread over the target's (sampled trees keep whole rows: the verify reads q there) */
    s->ids = L->s.temperature == 0.0f ? sd_head_target_ids(s->head) : NULL;
    s->out = malloc((size_t)FED_MAX * (size_t)s->D * sizeof(float));
    if (s->out == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    if (L->feat == NULL) {
        return sd_set_error(SD_ERR_INTERNAL, "the loop kept no features for the EAGLE drafter");
    }
    s->mix.verify_mark = -1.0;
    SD_TRY(sd_head_bind(&s->hm, s->head, L->m));
    s->hm->cfg.sliding_window = d->u.m.window; /* 0: none */
    SD_TRY(sd_kv_cache_create(&s->hkv, s->hm, L->capacity));
    const sd_draft_params dp = tree_params(d);
    return sd_model_tree_create(&s->tree, &dp, L);
}

/* Lookup's draft for this step when it promises more tokens per unit of time than the head's
 * steps have given (1 into out), else 0. The head's value: (1 + accepted drafts per step) over
 * its mean verify cost times 1 + its drafting over verifying time (optimistic before any
 * step, so the head is tried first); lookup's: the best (1 + sum of a^j) / rel[m + 1] over its
 * first m drafts (sd_tree_size), a its kind of match's acceptance rate, drafting free. */
static int lookup_instead(const sd_drafter *d, eagle_mix *x, sd_spec_loop *L, int room,
                          const sd_cost_curve *c, sd_draft *out) {
    int order[SD_MAX_DRAFT], b = 0;
    double a = 0.0;
    const int lim = room < d->u.m.lookup ? room : d->u.m.lookup;
    const int k = lim > 0 ? sd_lookup_side_draft(&x->side, d->history, x->tokens, L->hist, L->len,
                                                 lim, &b, &a)
                          : 0;
    if (k == 0 || c->max_T < 2) {
        return 0;
    }
    float p[SD_MAX_DRAFT];
    double q = a, gain = 1.0;
    for (int j = 0; j < k; j++, q *= a) {
        p[j] = (float)q;
    }
    const int m = sd_tree_size(p, k, c, order);
    for (int j = 0; j < m; j++) {
        gain += p[j];
    }
    const double head_rel = x->steps > 0 ? x->rel / x->steps : c->rel[2];
    const double head_draft = x->steps > 0 && x->verify_s > 0 ? x->draft_s / x->verify_s : 0.0;
    const double head =
        (1.0 + (x->accepted + 1.0) / (x->steps + 1.0)) / (head_rel * (1.0 + head_draft));
    if (m == 0 || gain / (double)c->rel[m + 1] <= head) {
        return 0;
    }
    for (int j = 0; j < m; j++) {
        x->parent[j] = j - 1;
    }
    x->bucket = b;
    out->n = m;
    out->tokens = x->tokens;
    out->parent = x->parent;
    out->q = NULL;
    return 1;
}

static sd_status eagle_propose(const sd_drafter *d, void *state, sd_spec_loop *L, int room,
                               sd_draft *out) {
    eagle_state *s = state;
    eagle_mix *x = &s->mix;
    s->L = L;
    const sd_tree_feeder fd = {feed_root, feed_nodes, s, s->ids, s->Vd};
    const sd_draft_params dp = tree_params(d);
    sd_cost_curve buf;
    const sd_cost_curve *cost = NULL;
    if (d->u.m.lookup > 0) { /* one measurement for both (the tree's alone would be shorter) */
        const int T = (dp.nodes > d->u.m.lookup ? dp.nodes : d->u.m.lookup) + 1;
        SD_TRY(sd_cost_curve_measure(d->cost, L->m, T));
    }
    SD_TRY(sd_model_tree_costs(d, &dp, L, &buf, &cost));
    if (!x->step_lookup && x->verify_mark >= 0.0) { /* the last step was the head's */
        x->verify_s += L->ss->time_verify_s - x->verify_mark;
    }
    x->verify_mark = -1.0;
    x->step_lookup = 0;
    sd_cost_curve lc;
    if (d->u.m.lookup > 0) {
        sd_cost_curve_get(d->cost, L->len, &lc);
        if (lookup_instead(d, x, L, room, &lc, out)) {
            /* the tree's outcome statistics must not count this step's tokens */
            sd_model_tree_settle(s->tree, L);
            x->step_lookup = 1;
            return SD_OK;
        }
    }
    const double t0 = sd_now_s();
    SD_TRY(sd_model_tree_propose(s->tree, L, s->hm, s->hkv, 0, &dp, &fd, cost, out));
    if (d->u.m.lookup > 0) {
        const int T = out->n + 1 <= lc.max_T ? out->n + 1 : lc.max_T;
        x->draft_s += sd_now_s() - t0;
        x->rel += lc.rel[T];
        x->verify_mark = L->ss->time_verify_s;
    }
    return SD_OK;
}

/* The drafted rows are forgotten: the head keeps the text's rows fed with the target's
 * features (positions 0 .. len - 2 of the proposal's text). */
static sd_status eagle_commit(const sd_drafter *d, void *state, sd_spec_loop *L,
                              const sd_draft *draft, int n_acc, int32_t next) {
    (void)next;
    (void)L;
    eagle_state *s = state;
    eagle_mix *x = &s->mix;
    if (x->step_lookup) {
        sd_lookup_side_count(&x->side, x->bucket, n_acc, draft->n);
    } else if (d->u.m.lookup > 0) {
        x->steps += 1.0;
        x->accepted += n_acc;
    }
    const int n = sd_kv_cache_length(s->hkv);
    return sd_kv_cache_set_length(s->hkv, s->prefix < n ? s->prefix : n);
}

static double eagle_cost(const sd_drafter *d, const sd_model *target) {
    return sd_head_cost(d->head, target);
}

static const sd_drafter_ops eagle_ops = {
    .name = "eagle",
    .check = eagle_check,
    .begin = eagle_begin,
    .propose = eagle_propose,
    .commit = eagle_commit,
    .cost = eagle_cost,
    .end = eagle_end,
    .features = eagle_features,
};

sd_status sd_drafter_eagle(sd_drafter **out, sd_head *head, const sd_draft_params *dp, int lookup,
                           int window) {
    *out = NULL;
    if (head == NULL || sd_head_kind_of(head) == SD_HEAD_MEDUSA) {
        const int missing = head == NULL;
        sd_head_free(head);
        return sd_set_error(SD_ERR_INVALID_ARG,
                            missing ? "the EAGLE head is missing"
                                    : "a Medusa head: use the Medusa drafter (specdec.Medusa)");
    }
    /* the depth is the draft params' k (named so for the user) */
    sd_status st = dp->k >= 1 && dp->k <= SD_MAX_DRAFT
                       ? sd_drafter_check_draft_params(dp)
                       : sd_set_error(SD_ERR_INVALID_ARG, "depth must be in [1, %d], got %d",
                                      SD_MAX_DRAFT, dp->k);
    if (st == SD_OK && (lookup < 0 || lookup > SD_MAX_DRAFT)) {
        st = sd_set_error(SD_ERR_INVALID_ARG, "lookup must be in [0, %d], got %d", SD_MAX_DRAFT,
                          lookup);
    }
    if (st == SD_OK && window < 0) {
        st = sd_set_error(SD_ERR_INVALID_ARG, "window must be >= 0 (0: the whole text), got %d",
                          window);
    }
    if (st == SD_OK) {
        const int nodes = dp->branching > 1 ? dp->nodes : dp->k;
        st = sd_drafter_alloc(out, &eagle_ops, nodes > lookup ? nodes : lookup, 1);
    }
    if (st != SD_OK) {
        sd_head_free(head);
        return st;
    }
    (*out)->head = head;
    (*out)->context = 1 << 30;
    (*out)->u.m.dp = *dp;
    (*out)->u.m.lookup = lookup;
    (*out)->u.m.window = window;
    return SD_OK;
}
