/* prompt_lookup.c — the prompt-lookup drafter: the continuation of an earlier occurrence of the
 * text's last n-gram (lookup.h), as deterministic drafts, with an adaptive draft length whose
 * acceptance is counted apart for each kind of match; with branching > 1, the continuations of
 * other occurrences that start with other tokens as sibling branches of a tree; with a history
 * (sd_drafter_set_history), where the text has no match of two or more tokens, the continuation
 * from earlier requests' outputs. */
#include <stdlib.h>
#include <string.h>

#include "spec/drafter.h"
#include "spec/lookup.h"
#include "spec/loop.h"
#include "util/status.h"

/* Bounds the per-request counts (max_ngram + 3 buckets): far past any useful n-gram. */
#define SD_LOOKUP_MAX_NGRAM (1 << 20)

/* Acceptance counted apart for each n-gram size: a long match predicts the continuation far
 * better than a one-token match (on SmolLM2's Spec-Bench answers, 4.5 of 8 drafted tokens
 * accepted after a 4-gram match, 0.6 after a 1-gram one: benchmarks/RESULTS.md); and apart again
 * for matches that extend SD_LOOKUP_LONG or SD_LOOKUP_LONG_MAX tokens back, where the text
 * repeats itself (a list, a loop) and a long draft is nearly always taken. Per bucket: tokens
 * accepted and drafts rejected, the trials of a geometric acceptance (the tokens after a
 * rejected one were never tested, so they do not count). */
typedef struct {
    double *acc_n; /* (max_ngram + 3) accepted tokens per bucket */
    double *rej_n; /* (max_ngram + 3) rejected drafts per bucket */
    int bucket;    /* the bucket of the step in flight */
    /* a tree step's branches: node j of branch i is tokens[start[i] + j] */
    int n_branches;
    int start[SD_LOOKUP_MAX_BRANCHES + 1], blen[SD_LOOKUP_MAX_BRANCHES];
    int32_t tokens[SD_MAX_TREE_NODES], parent[SD_MAX_TREE_NODES];
    /* size_by_cost: the rank (0 = the best match) of a step's branch i among the occurrences
     * found, and per rank >= 1 the steps whose tree carried such a branch and those that took
     * it */
    int rank[SD_LOOKUP_MAX_BRANCHES];
    double tried[SD_LOOKUP_MAX_BRANCHES], taken[SD_LOOKUP_MAX_BRANCHES];
    /* history: the step in flight drafts from it (then bucket is unused), and the acceptance of
     * such drafts (accepted tokens, rejected drafts) */
    int from_history;
    double acc_h, rej_h;
} lookup_state;

/* A sibling branch's chance of being taken before any was tried: its Beta prior's mean and
 * weight (in steps). */
#define SD_LOOKUP_SIBLING_PRIOR 0.1
#define SD_LOOKUP_SIBLING_WEIGHT 2.0

static sd_status lookup_check(const sd_drafter *d, const sd_model *target, int n_prompt,
                              int max_new_tokens) {
    (void)d;
    (void)target;
    (void)n_prompt;
    (void)max_new_tokens;
    return SD_OK;
}

static sd_status lookup_begin(const sd_drafter *d, void **state, sd_spec_loop *L) {
    const sd_prompt_lookup *pl = &d->u.lookup;
    if (pl->size_by_cost) { /* once per drafter and thread count */
        SD_TRY(sd_cost_curve_measure(d->cost, L->m, pl->k * pl->branching + 1));
    }
    const int n_buckets = d->u.lookup.max_ngram + 3;
    lookup_state *s = calloc(1, sizeof(*s));
    double *counts = calloc((size_t)n_buckets, 2 * sizeof(double));
    if (s == NULL || counts == NULL) {
        free(s);
        free(counts);
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    s->acc_n = counts;
    s->rej_n = counts + n_buckets;
    *state = s;
    return SD_OK;
}

/* The tree of up to pl->branching branches of k tokens (draft 0 the chain already in out),
 * within the tree's room; a single branch stays the chain. */
static void branch_out(lookup_state *s, sd_spec_loop *L, const sd_prompt_lookup *pl, int k,
                       sd_draft *out) {
    int depth_room = 0, n = 0, extent = 0;
    const int tree_room = sd_spec_tree_room(L, &depth_room);
    const int kb = k < depth_room ? k : depth_room;
    if (kb < 1 || (size_t)pl->branching * (size_t)kb > SD_MAX_TREE_NODES) {
        return;
    }
    int32_t drafts[SD_MAX_TREE_NODES];
    int lens[SD_LOOKUP_MAX_BRANCHES];
    const int nb = sd_lookup_branches(drafts, lens, &n, &extent, L->hist, L->len, pl->max_ngram,
                                      pl->min_ngram, kb, pl->branching);
    if (nb < 2) {
        return;
    }
    int total = 0;
    s->n_branches = 0;
    for (int i = 0; i < nb && total < tree_room; i++) {
        const int m = lens[i] < tree_room - total ? lens[i] : tree_room - total;
        s->start[i] = total;
        s->blen[i] = m;
        for (int j = 0; j < m; j++) {
            s->tokens[total + j] = drafts[(size_t)i * (size_t)kb + (size_t)j];
            s->parent[total + j] = j == 0 ? -1 : total + j - 1;
        }
        total += m;
        s->n_branches++;
    }
    if (s->n_branches < 2) { /* no room for a second branch: the chain */
        s->n_branches = 1;
        return;
    }
    out->n = total;
    out->tokens = s->tokens;
    out->parent = s->parent;
}

/* size_by_cost: the k-token chain already in L->batch + 1 and, with branching > 1, the other
 * occurrences' branches, as candidates with their chances of being on the accepted path; of
 * them the nodes that pay on the measured costs (each branch keeps a prefix, since its chances
 * fall with depth), branch by branch into s; out gets the chain or the tree. */
static void sized_propose(const sd_drafter *d, lookup_state *s, sd_spec_loop *L, int k, double a,
                          sd_draft *out) {
    const sd_prompt_lookup *pl = &d->u.lookup;
    /* the candidates: the chain, or the branches as branch_out would draft them all */
    int32_t drafts[SD_MAX_TREE_NODES];
    int lens[SD_LOOKUP_MAX_BRANCHES], nb = 1, kb = k;
    lens[0] = k;
    memcpy(drafts, L->batch + 1, (size_t)k * sizeof(int32_t));
    int depth_room = 0;
    const int tree_room = pl->branching > 1 ? sd_spec_tree_room(L, &depth_room) : 0;
    const int kt = k < depth_room ? k : depth_room;
    if (pl->branching > 1 && kt >= 1 && !s->from_history) {
        int32_t tree[SD_MAX_TREE_NODES];
        int tl[SD_LOOKUP_MAX_BRANCHES], n_match = 0, extent = 0, total = 0, m = 0;
        const int got = sd_lookup_branches(tree, tl, &n_match, &extent, L->hist, L->len,
                                           pl->max_ngram, pl->min_ngram, kt, pl->branching);
        for (; m < got && total < tree_room; m++) { /* within the tree's room */
            tl[m] = tl[m] < tree_room - total ? tl[m] : tree_room - total;
            total += tl[m];
        }
        if (m >= 2) {
            nb = m;
            kb = kt;
            memcpy(drafts, tree, (size_t)nb * (size_t)kb * sizeof(int32_t));
            memcpy(lens, tl, (size_t)nb * sizeof(int));
        }
    }
    /* candidates branch by branch (a parent before its child), with their chances */
    float p[SD_MAX_TREE_NODES];
    int branch_of[SD_MAX_TREE_NODES], order[SD_MAX_TREE_NODES], n = 0;
    for (int i = 0; i < nb; i++) {
        const double first =
            i == 0 ? a
                   : (s->taken[i] + SD_LOOKUP_SIBLING_PRIOR * SD_LOOKUP_SIBLING_WEIGHT) /
                         (s->tried[i] + SD_LOOKUP_SIBLING_WEIGHT);
        double q = first;
        for (int j = 0; j < lens[i]; j++, n++) {
            p[n] = (float)q;
            branch_of[n] = i;
            q *= a;
        }
    }
    sd_cost_curve cost;
    sd_cost_curve_get(d->cost, L->len, &cost);
    int keep = n > 0 ? sd_tree_size(p, n, &cost, order) : 0;
    if (keep == 0 && n > 0 && L->ss->steps % 4 == 0) { /* keep measuring */
        keep = 1;
        order[0] = 0;
    }
    int kept[SD_LOOKUP_MAX_BRANCHES] = {0};
    for (int i = 0; i < keep; i++) {
        kept[branch_of[order[i]]]++;
    }
    int total = 0;
    s->n_branches = 0;
    for (int i = 0; i < nb; i++) {
        if (kept[i] == 0) {
            continue;
        }
        const int b = s->n_branches++;
        s->start[b] = total;
        s->blen[b] = kept[i];
        s->rank[b] = i;
        for (int j = 0; j < kept[i]; j++) {
            s->tokens[total + j] = drafts[(size_t)i * (size_t)kb + (size_t)j];
            s->parent[total + j] = j == 0 ? -1 : total + j - 1;
        }
        total += kept[i];
    }
    out->n = total;
    out->tokens = s->tokens;
    out->parent = s->parent;
}

static sd_status lookup_propose(const sd_drafter *d, void *state, sd_spec_loop *L, int room,
                                sd_draft *out) {
    const sd_prompt_lookup *pl = &d->u.lookup;
    lookup_state *s = state;
    int n = 0, extent = 0;
    room = room < pl->k ? room : pl->k; /* a tree's drafter has room for k * branching nodes */
    s->from_history = 0;
    int k = room > 0
                ? sd_lookup_draft_or_history(L->batch + 1, &n, &extent, &s->from_history, L->hist,
                                             L->len, pl->max_ngram, pl->min_ngram, room, d->history)
                : 0;
    /* the acceptance counts this draft is sized by and adds to */
    const int b = sd_lookup_bucket(n, extent, pl->max_ngram);
    double prior = 0.0;
    const double a = s->from_history
                         ? (s->acc_h + 1.0) / (s->acc_h + s->rej_h + 2.0)
                         : sd_lookup_rate(s->acc_n[b], s->rej_n[b], b, pl->max_ngram, &prior);
    s->bucket = b;
    s->n_branches = 1;
    if (pl->size_by_cost) {
        out->n = 0;
        if (k > 0) {
            sized_propose(d, s, L, k, a, out);
        }
        return SD_OK;
    }
    if (pl->verify_slope > 0.0f && k > 0) {
        /* a repeating text starts from the prior of a long run of accepted tokens */
        const double acc = s->from_history ? s->acc_h : s->acc_n[b] + prior;
        const double trials =
            s->from_history ? s->acc_h + s->rej_h : s->acc_n[b] + s->rej_n[b] + prior;
        k = sd_adaptive_k(acc, trials, pl->verify_slope, k, L->ss->steps);
    }
    s->bucket = b;
    s->n_branches = 1;
    out->n = k;
    out->tokens = L->batch + 1;
    out->parent = L->chain;
    if (pl->branching > 1 && k > 0 && !s->from_history) {
        branch_out(s, L, pl, k, out);
    }
    return SD_OK;
}

static sd_status lookup_commit(const sd_drafter *d, void *state, sd_spec_loop *L,
                               const sd_draft *draft, int n_acc, int32_t next) {
    (void)L;
    (void)next;
    lookup_state *s = state;
    /* a tree: the branch taken is the one starting with the first accepted token (siblings
     * differ), and its tokens after the path's end were rejected */
    int n = draft->n;
    const int sized = d->u.lookup.size_by_cost;
    for (int i = 0; (sized || s->n_branches > 1) && i < s->n_branches; i++) {
        const int took = n_acc > 0 && s->tokens[s->start[i]] == L->batch[1];
        n = took && s->n_branches > 1 ? s->blen[i] : n;
        if (sized && s->rank[i] > 0) { /* how often such a branch is taken */
            s->tried[s->rank[i]] += 1.0;
            s->taken[s->rank[i]] += took ? 1.0 : 0.0;
        }
    }
    double *acc = s->from_history ? &s->acc_h : &s->acc_n[s->bucket];
    double *rej = s->from_history ? &s->rej_h : &s->rej_n[s->bucket];
    *acc += n_acc;
    *rej += n_acc < n ? 1.0 : 0.0;
    return SD_OK;
}

static double lookup_cost(const sd_drafter *d, const sd_model *target) {
    (void)d;
    (void)target;
    return 0.0; /* a search of the text: nothing next to a forward */
}

static void lookup_end(const sd_drafter *d, void *state) {
    (void)d;
    lookup_state *s = state;
    if (s != NULL) {
        free(s->acc_n);
        free(s);
    }
}

static const sd_drafter_ops lookup_ops = {
    .name = "prompt_lookup",
    .check = lookup_check,
    .begin = lookup_begin,
    .propose = lookup_propose,
    .commit = lookup_commit,
    .cost = lookup_cost,
    .end = lookup_end,
};

sd_status sd_drafter_prompt_lookup(sd_drafter **out, const sd_prompt_lookup *pl) {
    *out = NULL;
    SD_TRY(sd_check_max_draft(pl->k));
    SD_TRY(sd_drafter_check_slope(pl->verify_slope));
    if (pl->min_ngram < 1 || pl->max_ngram < pl->min_ngram) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "n-gram sizes must satisfy 1 <= min_ngram <= max_ngram, got %d and %d",
                            pl->min_ngram, pl->max_ngram);
    }
    if (pl->max_ngram > SD_LOOKUP_MAX_NGRAM) {
        return sd_set_error(SD_ERR_INVALID_ARG, "max_ngram must be <= %d, got %d",
                            SD_LOOKUP_MAX_NGRAM, pl->max_ngram);
    }
    if (pl->branching < 1 || pl->branching > SD_LOOKUP_MAX_BRANCHES) {
        return sd_set_error(SD_ERR_INVALID_ARG, "branching must be in [1, %d], got %d",
                            SD_LOOKUP_MAX_BRANCHES, pl->branching);
    }
    if (pl->size_by_cost != 0 && pl->size_by_cost != 1) {
        return sd_set_error(SD_ERR_INVALID_ARG, "size_by_cost must be 0 or 1, got %d",
                            pl->size_by_cost);
    }
    if (pl->branching > 1 && pl->k * pl->branching > SD_MAX_TREE_NODES) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "k * branching must be <= %d (the nodes of a tree), got %d * %d",
                            SD_MAX_TREE_NODES, pl->k, pl->branching);
    }
    SD_TRY(sd_drafter_alloc(out, &lookup_ops, pl->k * pl->branching, 0));
    (*out)->u.lookup = *pl;
    return SD_OK;
}
