/* token_recycling.c — Token Recycling (Luo et al. 2024): a table of each token's most probable
 * successors, refreshed from the target's logits at every verify step, drafts a tree whose
 * root is the text's last token. Deterministic children, verified by the tree rule. The table is
 * the drafter's, shared by its requests under a lock. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "spec/drafter.h"
#include "spec/loop.h"
#include "util/status.h"

/* The successor table of one model. */
typedef struct {
    pthread_mutex_t lock;
    const sd_model *model; /* the model the table was filled for */
    int V, top;
    int32_t *next; /* (V, top) successors by decreasing logit, -1 where none yet */
} recycle_table;

/* What a request keeps between propose and commit. */
typedef struct {
    int32_t root;
    int32_t tokens[SD_MAX_TREE];
    int32_t parent[SD_MAX_TREE];
    int32_t best[(SD_MAX_TREE + 1) * SD_RECYCLE_MAX_TOP]; /* a step's rows' successors */
} recycle_state;

static sd_status recycle_check(const sd_drafter *d, const sd_model *target, int n_prompt,
                               int max_new_tokens) {
    (void)n_prompt;
    (void)max_new_tokens;
    recycle_table *t = d->shared;
    if (target->device != SD_DEVICE_CPU) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "token recycling runs on CPU models only so far (its trees are "
                            "verified on the CPU)");
    }
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
    pthread_mutex_unlock(&t->lock);
    SD_TRY(st);
    *state = calloc(1, sizeof(recycle_state));
    return *state != NULL ? SD_OK : sd_set_error(SD_ERR_NOMEM, "out of memory");
}

/* Breadth first from the root: a node at depth d gets its token's first widths[d] successors,
 * while there are nodes and levels left; parents come before their children. */
static sd_status recycle_propose(const sd_drafter *d, void *state, sd_spec_loop *L, int room,
                                 sd_draft *out) {
    (void)room; /* a tree's room is sd_spec_tree_room's */
    const sd_token_recycling *p = &d->u.recycling;
    recycle_table *t = d->shared;
    recycle_state *s = state;
    int depth_room = 0;
    const int tree_room = sd_spec_tree_room(L, &depth_room);
    const int limit = p->nodes < tree_room ? p->nodes : tree_room;
    const int max_depth = p->depth < depth_room ? p->depth : depth_room;
    int depth[SD_MAX_TREE];
    int n = 0;
    s->root = L->hist[L->len - 1];
    pthread_mutex_lock(&t->lock);
    for (int at = -1; at < n && n < limit; at++) { /* at: the node expanded, -1 the root */
        const int dep = at < 0 ? 0 : depth[at];
        if (dep >= max_depth) {
            continue;
        }
        const int32_t *succ = t->next + (size_t)(at < 0 ? s->root : s->tokens[at]) * t->top;
        for (int j = 0; j < p->widths[dep] && succ[j] >= 0 && n < limit; j++) {
            s->tokens[n] = succ[j];
            s->parent[n] = at;
            depth[n] = dep + 1;
            n++;
        }
    }
    pthread_mutex_unlock(&t->lock);
    out->n = n;
    out->tokens = s->tokens;
    out->parent = s->parent;
    return SD_OK;
}

/* The `top` largest entries of row (V), by decreasing value, ties to the lower id. */
static void top_ids(int32_t *best, int top, const float *row, int V) {
    float val[SD_RECYCLE_MAX_TOP];
    int n = 0;
    for (int i = 0; i < V; i++) {
        const float x = row[i];
        if (n == top && !(x > val[top - 1])) {
            continue;
        }
        int j = n < top ? n++ : top - 1;
        while (j > 0 && x > val[j - 1]) {
            val[j] = val[j - 1];
            best[j] = best[j - 1];
            j--;
        }
        val[j] = x;
        best[j] = i;
    }
    for (int j = n; j < top; j++) {
        best[j] = -1;
    }
}

/* Every verified row refreshes its token's successors: the root's and each node's (the step's
 * logits, L->logits, row 0 at the root and row 1 + i after node i). */
static sd_status recycle_commit(const sd_drafter *d, void *state, sd_spec_loop *L,
                                const sd_draft *draft, int n_acc, int32_t next) {
    (void)n_acc;
    (void)next;
    recycle_table *t = d->shared;
    recycle_state *s = state;
    const int V = t->V, top = t->top;
    for (int r = 0; r <= draft->n; r++) {
        top_ids(s->best + (size_t)r * top, top, L->logits + (size_t)r * V, V);
    }
    pthread_mutex_lock(&t->lock);
    for (int r = 0; r <= draft->n; r++) {
        const int32_t tok = r == 0 ? s->root : draft->tokens[r - 1];
        memcpy(t->next + (size_t)tok * top, s->best + (size_t)r * top,
               (size_t)top * sizeof(int32_t));
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
    const sd_status st = sd_drafter_alloc(out, &recycle_ops, p->nodes, 0);
    if (st != SD_OK) {
        pthread_mutex_destroy(&t->lock);
        free(t);
        return st;
    }
    (*out)->shared = t;
    (*out)->u.recycling = *p;
    return SD_OK;
}
