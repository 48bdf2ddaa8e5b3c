/* token_recycling.c — Token Recycling (Luo et al. 2024): a table of each token's most probable
 * successors, refreshed from the target's logits at every verify step, drafts a tree whose
 * root is the text's last token. Deterministic children, verified by the tree rule. The table is
 * the drafter's, shared by its requests under a lock.
 *
 * The tree's shape is a fixed template (widths per level, breadth first, up to `nodes` slots);
 * a slot is drafted when its parent is and the table has its successor. With `adaptive`, each
 * step keeps only the slots that pay: every slot's acceptance (how often its node was on the
 * accepted path) is counted, and the nodes most likely accepted are kept while the expected
 * tokens per unit of verify time grow, the time of a forward of each size measured on the
 * model (sd_cost_curve). A machine where verifying many tokens is dear gets small trees, or
 * plain decoding; one where it is cheap, the whole template.
 *
 * With `lookup`, prompt lookup's draft (the text's continuation after its best earlier match,
 * sd_lookup_draft) joins the tree as one more branch from the root: where its tokens are the
 * table's, it runs through the template's nodes, else through nodes of its own. Its j-th
 * token is accepted with the chance a^j, a its kind of match's rate so far in the request
 * (sd_lookup_rate), and the adaptive cut weighs its nodes with the template's. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "spec/drafter.h"
#include "spec/lookup.h"
#include "spec/loop.h"
#include "util/status.h"

/* The successor table of one model, the template's slots and what was learnt of them. */
typedef struct {
    pthread_mutex_t lock;
    const sd_model *model; /* the model the table was filled for */
    int V, top;
    int32_t *next; /* (V, top) successors by decreasing logit, -1 where none yet */
    /* the template, breadth first: slot s is child `rank` of slot `parent` (-1: the root) */
    int n_slots;
    int8_t parent[SD_MAX_TREE], depth[SD_MAX_TREE], rank[SD_MAX_TREE];
    double proposed[SD_MAX_TREE], on_path[SD_MAX_TREE]; /* steps each slot was drafted, kept */
} recycle_table;

/* What a request keeps between propose and commit, and lookup's counts over its steps. */
typedef struct {
    int32_t root;
    int n;
    int32_t tokens[SD_MAX_TREE];
    int32_t parent[SD_MAX_TREE];
    int8_t slot[SD_MAX_TREE];  /* each node's template slot, or -1 */
    int8_t chain[SD_MAX_TREE]; /* 1 + its place in lookup's draft, or 0 */
    int32_t best[(SD_MAX_TREE + 1) * SD_RECYCLE_MAX_TOP]; /* a step's rows' successors */
    int chain_n, bucket; /* lookup's nodes in the step's tree, its match */
    sd_lookup_side side; /* lookup's drafts accepted, by kind of match */
} recycle_state;

static sd_status recycle_check(const sd_drafter *d, const sd_model *target, int n_prompt,
                               int max_new_tokens) {
    (void)n_prompt;
    (void)max_new_tokens;
    recycle_table *t = d->shared;
    pthread_mutex_lock(&t->lock);
    const sd_model *owner = t->model;
    pthread_mutex_unlock(&t->lock);
    if (owner != NULL && owner != target) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "this token recycling drafter keeps the successor table of another "
                            "model: use one TokenRecycling per model");
    }
    return SD_OK;
}

/* The table for `target`, made at its first request. */
static sd_status recycle_begin(const sd_drafter *d, void **state, sd_spec_loop *L) {
    recycle_table *t = d->shared;
    sd_status st = SD_OK;
    pthread_mutex_lock(&t->lock);
    if (t->model == NULL) {
        const int V = L->m->cfg.vocab_size;
        t->next = malloc((size_t)V * (size_t)t->top * sizeof(int32_t));
        if (t->next == NULL) {
            st = sd_set_error(SD_ERR_NOMEM, "out of memory for the successor table");
        } else {
            memset(t->next, 0xff, (size_t)V * (size_t)t->top * sizeof(int32_t)); /* -1 */
            t->model = L->m;
            t->V = V;
        }
    } else if (t->model != L->m) {
        st = sd_set_error(SD_ERR_INVALID_ARG, "the successor table belongs to another model");
    }
    if (st == SD_OK && d->u.recycling.adaptive) { /* once per model and thread count */
        const int most = t->n_slots + d->u.recycling.lookup;
        st = sd_cost_curve_measure(d->cost, L->m,
                                   (most < SD_MAX_TREE_NODES ? most : SD_MAX_TREE_NODES) + 1);
    }
    pthread_mutex_unlock(&t->lock);
    SD_TRY(st);
    *state = calloc(1, sizeof(recycle_state));
    return *state != NULL ? SD_OK : sd_set_error(SD_ERR_NOMEM, "out of memory");
}

/* Lookup's draft joins the n nodes (tok, par, slot, p) as a branch from the root: each of its
 * tokens becomes the child of the last one's node, an existing node where the tree has one
 * (its chance raised to the draft's where lower) or a new node. chain[i]: 1 + node i's place
 * in the draft, 0 off it. Returns the new node count. A node's chance stays at most its
 * parent's: a^j falls along the draft, and a node's own was at most its parent's before. */
static int join_lookup(int n, int32_t *tok, int32_t *par, int8_t *slot, float *p, int8_t *chain,
                       const int32_t *draft, int k, double a) {
    double q = a;
    for (int j = 0, at = -1; j < k; j++, q *= a) {
        int i = at + 1;
        while (i < n && !(par[i] == at && tok[i] == draft[j])) {
            i++;
        }
        if (i == n) {
            tok[n] = draft[j];
            par[n] = at;
            slot[n] = -1;
            p[n] = 0.0f;
            n++;
        }
        p[i] = (float)q > p[i] ? (float)q : p[i];
        chain[i] = (int8_t)(j + 1);
        at = i;
    }
    return n;
}

/* The template's slots that can be drafted this step (their parents drafted, their successors
 * known, within the room), breadth first, and lookup's draft (join_lookup); with `adaptive`,
 * only the nodes that pay (sd_tree_size), one node every fourth step where none does, to keep
 * measuring. */
static sd_status recycle_propose(const sd_drafter *d, void *state, sd_spec_loop *L, int room,
                                 sd_draft *out) {
    (void)room; /* a tree's room is sd_spec_tree_room's */
    recycle_table *t = d->shared;
    recycle_state *s = state;
    int depth_room = 0;
    const int tree_room = sd_spec_tree_room(L, &depth_room);
    int32_t tok[SD_MAX_TREE], node_of[SD_MAX_TREE], par[SD_MAX_TREE], order[SD_MAX_TREE];
    int8_t slot[SD_MAX_TREE], chain[SD_MAX_TREE] = {0};
    float p[SD_MAX_TREE];
    int n = 0;
    s->root = L->hist[L->len - 1];
    /* lookup's draft first: the template's nodes leave room for all of it */
    int32_t draft[SD_MAX_DRAFT];
    int k = d->u.recycling.lookup < tree_room ? d->u.recycling.lookup : tree_room;
    k = k < depth_room ? k : depth_room;
    double a = 0.0;
    k = k > 0
            ? sd_lookup_side_draft(&s->side, d->history, draft, L->hist, L->len, k, &s->bucket, &a)
            : 0;
    pthread_mutex_lock(&t->lock);
    for (int sl = 0; sl < t->n_slots && n < tree_room - k; sl++) {
        const int ps = t->parent[sl], pn = ps < 0 ? -1 : node_of[ps];
        node_of[sl] = -1;
        if ((ps >= 0 && pn < 0) || t->depth[sl] > depth_room) {
            continue;
        }
        const int32_t succ = t->next[(size_t)(pn < 0 ? s->root : tok[pn]) * t->top + t->rank[sl]];
        if (succ < 0) {
            continue;
        }
        /* the chance the slot's node is kept: its count, smoothed towards 2^-depth, and never
         * above its parent's */
        const double prior = 1.0 / (double)(1 << t->depth[sl]);
        double q = (t->on_path[sl] + 2.0 * prior) / (t->proposed[sl] + 2.0);
        q = pn >= 0 && q > p[pn] ? p[pn] : q;
        node_of[sl] = n;
        tok[n] = succ;
        par[n] = pn;
        slot[n] = (int8_t)sl;
        p[n] = (float)q;
        n++;
    }
    n = join_lookup(n, tok, par, slot, p, chain, draft, k, a);
    int keep = n;
    if (d->u.recycling.adaptive) {
        sd_cost_curve cost;
        sd_cost_curve_get(d->cost, L->len, &cost);
        keep = sd_tree_size(p, n, &cost, order);
        keep = keep == 0 && n > 0 && L->ss->steps % 4 == 0 ? 1 : keep;
    }
    pthread_mutex_unlock(&t->lock);
    /* the kept nodes in their order, parents first (a parent is kept whenever its child is) */
    int32_t newidx[SD_MAX_TREE];
    for (int i = 0; i < n; i++) {
        newidx[i] = keep == n ? i : -1;
    }
    for (int i = 0; keep < n && i < keep; i++) {
        newidx[order[i]] = 0;
    }
    s->n = 0;
    s->chain_n = 0;
    for (int i = 0; i < n; i++) {
        if (newidx[i] < 0) {
            continue;
        }
        newidx[i] = s->n;
        s->tokens[s->n] = tok[i];
        s->parent[s->n] = par[i] < 0 ? -1 : newidx[par[i]];
        s->slot[s->n] = slot[i];
        s->chain[s->n] = chain[i];
        s->chain_n += chain[i] > 0;
        s->n++;
    }
    out->n = s->n;
    out->tokens = s->tokens;
    out->parent = s->parent;
    return SD_OK;
}

/* The `top` largest entries of row (V), by decreasing value, ties to the lower id. */
/* Every verified row refreshes its token's successors: the root's and each node's (the step's
 * logits' top ids, sd_spec_row_top: row 0 at the root and row 1 + i after node i). */
static sd_status recycle_commit(const sd_drafter *d, void *state, sd_spec_loop *L,
                                const sd_draft *draft, int n_acc, int32_t next) {
    (void)next;
    recycle_table *t = d->shared;
    recycle_state *s = state;
    const int top = t->top;
    for (int r = 0; r <= draft->n; r++) {
        int32_t *dst = s->best + (size_t)r * top;
        const int32_t *ids = sd_spec_row_top(L, r, top, dst);
        if (ids != dst) {
            memcpy(dst, ids, (size_t)top * sizeof(int32_t));
        }
    }
    /* the accepted path, L->batch[1 .. n_acc], followed down the proposal (siblings differ);
     * lookup's tokens accepted: those of the path's start that are its draft's */
    int on_path[SD_MAX_TREE] = {0}, chain_acc = 0;
    for (int j = 0, at = -1; j < n_acc; j++) {
        int i = at + 1;
        while (i < s->n && !(s->parent[i] == at && s->tokens[i] == L->batch[1 + j])) {
            i++;
        }
        if (i == s->n) {
            return sd_set_error(SD_ERR_INTERNAL,
                                "token recycling: the accepted path left its tree");
        }
        on_path[i] = 1;
        chain_acc += chain_acc == j && s->chain[i] == j + 1;
        at = i;
    }
    if (s->chain_n > 0) {
        sd_lookup_side_count(&s->side, s->bucket, chain_acc, s->chain_n);
    }
    pthread_mutex_lock(&t->lock);
    for (int r = 0; r <= draft->n; r++) {
        const int32_t tok = r == 0 ? s->root : draft->tokens[r - 1];
        memcpy(t->next + (size_t)tok * top, s->best + (size_t)r * top,
               (size_t)top * sizeof(int32_t));
    }
    for (int i = 0; i < s->n; i++) {
        if (s->slot[i] >= 0) {
            t->proposed[s->slot[i]] += 1.0;
            t->on_path[s->slot[i]] += on_path[i];
        }
    }
    pthread_mutex_unlock(&t->lock);
    return SD_OK;
}

static double recycle_cost(const sd_drafter *d, const sd_model *target) {
    (void)d;
    (void)target;
    return 0.0; /* table look-ups */
}

static void recycle_end(const sd_drafter *d, void *state) {
    (void)d;
    free(state);
}

static void recycle_destroy(sd_drafter *d) {
    recycle_table *t = d->shared;
    if (t != NULL) {
        pthread_mutex_destroy(&t->lock);
        free(t->next);
        free(t);
    }
}

static const sd_drafter_ops recycle_ops = {
    .name = "token_recycling",
    .check = recycle_check,
    .begin = recycle_begin,
    .propose = recycle_propose,
    .commit = recycle_commit,
    .cost = recycle_cost,
    .end = recycle_end,
    .destroy = recycle_destroy,
};

sd_status sd_drafter_token_recycling(sd_drafter **out, const sd_token_recycling *p) {
    *out = NULL;
    if (p->nodes < 1 || p->nodes > SD_MAX_TREE_NODES) {
        return sd_set_error(SD_ERR_INVALID_ARG, "nodes must be in [1, %d], got %d",
                            SD_MAX_TREE_NODES, p->nodes);
    }
    if (p->top < 1 || p->top > SD_RECYCLE_MAX_TOP) {
        return sd_set_error(SD_ERR_INVALID_ARG, "top must be in [1, %d], got %d",
                            SD_RECYCLE_MAX_TOP, p->top);
    }
    if (p->depth < 1 || p->depth > SD_RECYCLE_MAX_DEPTH) {
        return sd_set_error(SD_ERR_INVALID_ARG, "the tree's depth must be in [1, %d], got %d",
                            SD_RECYCLE_MAX_DEPTH, p->depth);
    }
    if (p->lookup < 0 || p->lookup > SD_MAX_DRAFT) {
        return sd_set_error(SD_ERR_INVALID_ARG, "lookup must be in [0, %d], got %d", SD_MAX_DRAFT,
                            p->lookup);
    }
    for (int i = 0; i < p->depth; i++) {
        if (p->widths[i] < 1 || p->widths[i] > p->top) {
            return sd_set_error(SD_ERR_INVALID_ARG, "widths[%d] must be in [1, top = %d], got %d",
                                i, p->top, p->widths[i]);
        }
    }
    recycle_table *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    if (pthread_mutex_init(&t->lock, NULL) != 0) {
        free(t);
        return sd_set_error(SD_ERR_INTERNAL, "could not create the successor table's lock");
    }
    t->top = p->top;
    /* the template, breadth first from the root (slot -1 at depth 0) */
    for (int at = -1; at < t->n_slots && t->n_slots < p->nodes; at++) {
        const int dep = at < 0 ? 0 : t->depth[at];
        for (int j = 0; dep < p->depth && j < p->widths[dep] && t->n_slots < p->nodes; j++) {
            t->parent[t->n_slots] = (int8_t)at;
            t->depth[t->n_slots] = (int8_t)(dep + 1);
            t->rank[t->n_slots] = (int8_t)j;
            t->n_slots++;
        }
    }
    const int most = t->n_slots + p->lookup;
    const sd_status st =
        sd_drafter_alloc(out, &recycle_ops, most < SD_MAX_TREE_NODES ? most : SD_MAX_TREE_NODES, 0);
    if (st != SD_OK) {
        pthread_mutex_destroy(&t->lock);
        free(t);
        return st;
    }
    (*out)->shared = t;
    (*out)->row_top = t->top;
    (*out)->u.recycling = *p;
    return SD_OK;
}
