/* medusa.c — the Medusa drafter (Cai et al. 2024): each step the heads read the target's last
 * hidden state (from the verify forward that computed the logits, kept by the loop) and a
 * static tree of paths is filled from their best tokens: the node of path (r1, ..., rd) holds
 * rank rd of head d - 1's tokens, below the node of (r1, ..., r(d-1)). The heads see only that
 * one state, so every node at one depth reads the same head's list. The children are
 * deterministic and the tree rule (verify.h) keeps the output exactly the target's. */
#include <stdlib.h>
#include <string.h>

#include "model/head.h"
#include "spec/drafter.h"
#include "spec/loop.h"
#include "util/status.h"

/* A request's state: the heads' logits and best tokens, the proposal. */
typedef struct {
    float *logits; /* (heads, V) */
    int32_t *best; /* (heads, top) */
    int32_t tokens[SD_MAX_TREE_NODES], parent[SD_MAX_TREE_NODES];
} medusa_state;

static sd_status medusa_check(const sd_drafter *d, const sd_model *m, int n_prompt,
                              int max_new_tokens) {
    (void)n_prompt;
    (void)max_new_tokens;
    return sd_head_check(d->head, m);
}

static int medusa_features(const sd_drafter *d, const sd_model *target, int32_t *aux, int *n_aux) {
    (void)d;
    (void)target;
    (void)aux;
    *n_aux = 0;
    return 1; /* the final-normed hidden state */
}

static sd_status medusa_begin(const sd_drafter *d, void **state, sd_spec_loop *L) {
    medusa_state *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    *state = s;
    const int heads = sd_head_medusa_heads(d->head);
    s->logits = malloc((size_t)heads * (size_t)L->m->cfg.vocab_size * sizeof(float));
    s->best = malloc((size_t)heads * (size_t)d->u.medusa.top * sizeof(int32_t));
    return s->logits != NULL && s->best != NULL ? SD_OK
                                                : sd_set_error(SD_ERR_NOMEM, "out of memory");
}

static sd_status medusa_propose(const sd_drafter *d, void *state, sd_spec_loop *L, int room,
                                sd_draft *out) {
    (void)room; /* a tree keeps within sd_spec_tree_room */
    medusa_state *s = state;
    out->n = 0;
    out->tokens = s->tokens;
    out->parent = s->parent;
    out->q = NULL;
    out->on_device = 0;
    int depth_room = 0;
    const int n_room = sd_spec_tree_room(L, &depth_room);
    if (L->len < 2 || n_room < 1) {
        return SD_OK; /* a one-token prompt: no hidden state yet */
    }
    const int heads = sd_head_medusa_heads(d->head), V = L->m->cfg.vocab_size;
    const int top = d->u.medusa.top;
    SD_TRY(sd_head_medusa_logits(d->head, L->m, 1, sd_spec_features(L, L->len - 2), s->logits));
    for (int i = 0; i < heads; i++) {
        sd_top_ids(s->best + (size_t)i * (size_t)top, top, s->logits + (size_t)i * (size_t)V, V);
    }
    /* the paths that fit, each after its parent (a path whose parent was dropped is dropped) */
    int idx[SD_MAX_TREE_NODES];
    for (int i = 0; i < d->u.medusa.n; i++) {
        idx[i] = -1;
        const int p = d->u.medusa.parent[i], dep = d->u.medusa.depth[i];
        const int32_t tok = s->best[(size_t)(dep - 1) * (size_t)top + (size_t)d->u.medusa.rank[i]];
        if (out->n == n_room || dep > depth_room || (p >= 0 && idx[p] < 0) || tok < 0) {
            continue;
        }
        idx[i] = out->n;
        s->tokens[out->n] = tok;
        s->parent[out->n] = p < 0 ? -1 : idx[p];
        out->n++;
    }
    return SD_OK;
}

static sd_status medusa_commit(const sd_drafter *d, void *state, sd_spec_loop *L,
                               const sd_draft *draft, int n_acc, int32_t next) {
    (void)d;
    (void)state;
    (void)L;
    (void)draft;
    (void)n_acc;
    (void)next;
    return SD_OK; /* nothing to roll back: the heads keep no state */
}

static double medusa_cost(const sd_drafter *d, const sd_model *target) {
    return sd_head_cost(d->head, target);
}

static void medusa_end(const sd_drafter *d, void *state) {
    (void)d;
    medusa_state *s = state;
    if (s != NULL) {
        free(s->logits);
        free(s->best);
        free(s);
    }
}

static const sd_drafter_ops medusa_ops = {
    .name = "medusa",
    .check = medusa_check,
    .begin = medusa_begin,
    .propose = medusa_propose,
    .commit = medusa_commit,
    .cost = medusa_cost,
    .end = medusa_end,
    .features = medusa_features,
};

/* The tree of paths, checked: each path 1 .. heads long, ranks in [0, SD_MEDUSA_MAX_RANK), its
 * parent listed before it, no path twice. */
static sd_status medusa_tree(sd_drafter *d, int heads, const int32_t *paths, const int32_t *start,
                             const int32_t *len, int n) {
    d->u.medusa.n = n;
    d->u.medusa.top = 1;
    for (int i = 0; i < n; i++) {
        const int32_t *p = paths + start[i];
        if (len[i] < 1 || len[i] > heads) {
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "Medusa tree path %d has %d entries; paths have 1 to %d (the "
                                "heads)",
                                i, len[i], heads);
        }
        for (int j = 0; j < len[i]; j++) {
            if (p[j] < 0 || p[j] >= SD_MEDUSA_MAX_RANK) {
                return sd_set_error(SD_ERR_INVALID_ARG,
                                    "Medusa tree path %d holds rank %d; ranks are in [0, %d)", i,
                                    p[j], SD_MEDUSA_MAX_RANK);
            }
        }
        int parent = -1, same = -1;
        for (int k = 0; k < i; k++) {
            if (len[k] == len[i] - 1 && memcmp(paths + start[k], p, (size_t)len[k] * 4) == 0) {
                parent = k;
            }
            if (len[k] == len[i] && memcmp(paths + start[k], p, (size_t)len[k] * 4) == 0) {
                same = k;
            }
        }
        if (same >= 0) {
            return sd_set_error(SD_ERR_INVALID_ARG, "Medusa tree paths %d and %d are the same",
                                same, i);
        }
        if (len[i] > 1 && parent < 0) {
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "Medusa tree path %d comes before its parent (the path without "
                                "its last rank): list every path's parent first",
                                i);
        }
        d->u.medusa.parent[i] = parent;
        d->u.medusa.depth[i] = len[i];
        d->u.medusa.rank[i] = p[len[i] - 1];
        d->u.medusa.top = p[len[i] - 1] + 1 > d->u.medusa.top ? p[len[i] - 1] + 1 : d->u.medusa.top;
    }
    return SD_OK;
}

/* The default tree for `heads` heads, small enough for a CPU's verify: the first head's 3 best,
 * the next head's 2 best below the best and 1 below the second, then the best chain with one
 * second-best leaf per depth. */
static int default_tree(int heads, int32_t *paths, int32_t *start, int32_t *len) {
    int n = 0, at = 0;
#define PATH(...)                                                                                  \
    do {                                                                                           \
        const int32_t p_[] = {__VA_ARGS__};                                                        \
        start[n] = at;                                                                             \
        len[n] = (int32_t)(sizeof(p_) / sizeof(p_[0]));                                            \
        memcpy(paths + at, p_, sizeof(p_));                                                        \
        at += len[n++];                                                                            \
    } while (0)
    PATH(0);
    PATH(1);
    PATH(2);
    if (heads >= 2) {
        PATH(0, 0);
        PATH(0, 1);
        PATH(1, 0);
    }
#undef PATH
    for (int d = 3; d <= heads && d <= 8; d++) { /* (0, ..., 0) and (0, ..., 0, 1) */
        for (int last = 0; last < 2; last++) {
            start[n] = at;
            len[n] = d;
            for (int j = 0; j < d; j++) {
                paths[at + j] = j == d - 1 ? last : 0;
            }
            at += d;
            n++;
        }
    }
    return n;
}

sd_status sd_drafter_medusa(sd_drafter **out, sd_head *head, const int32_t *paths,
                            const int32_t *start, const int32_t *len, int n_paths) {
    *out = NULL;
    if (head == NULL || sd_head_kind_of(head) != SD_HEAD_MEDUSA) {
        sd_head_free(head);
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "the Medusa drafter needs Medusa heads (medusa_lm_head.safetensors "
                            "or .pt), not an EAGLE head");
    }
    int32_t dpaths[128], dstart[SD_MAX_TREE_NODES], dlen[SD_MAX_TREE_NODES];
    if (paths == NULL) {
        n_paths = default_tree(sd_head_medusa_heads(head), dpaths, dstart, dlen);
        paths = dpaths;
        start = dstart;
        len = dlen;
    }
    sd_status st =
        n_paths >= 1 && n_paths <= SD_MAX_TREE_NODES
            ? sd_drafter_alloc(out, &medusa_ops, n_paths, 0)
            : sd_set_error(SD_ERR_INVALID_ARG, "a Medusa tree needs 1 to %d paths, got %d",
                           SD_MAX_TREE_NODES, n_paths);
    if (st != SD_OK) {
        sd_head_free(head);
        return st;
    }
    (*out)->head = head;
    (*out)->context = 1 << 30;
    st = medusa_tree(*out, sd_head_medusa_heads(head), paths, start, len, n_paths);
    if (st != SD_OK) {
        sd_drafter_free(*out);
        *out = NULL;
    }
    return st;
}
