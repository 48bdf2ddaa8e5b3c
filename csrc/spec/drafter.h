/* drafter.h — the drafter interface: where draft tokens come from. The speculative loop (loop.c)
 * drives every drafter through this table of functions and never learns a drafter's name.
 *
 * One step of the loop, for a drafter d over a sequence L (loop.h):
 *   n = d->ops->propose(d, state, L, room, &draft)   draft up to `room` nodes after L's text
 *   verify                                           the target scores [last, nodes] at once
 *   accept                                           the rule of verify.h keeps a path
 *   d->ops->commit(d, state, L, &draft, n_acc, next) the drafter learns what was kept
 * begin/end bracket a request and own its per-request state, so one drafter (its parameters)
 * serves any number of requests at once.
 *
 * Adding a drafter: one file in spec/drafters/ defining its sd_drafter_ops and a constructor
 * declared in specdec.h, one Python class in specdec/speculators.py, and one registration line
 * in csrc/python/drafters.c (csrc/README.md). */
#ifndef SD_DRAFTER_H
#define SD_DRAFTER_H

#include <pthread.h>
#include <stdint.h>

#include "specdec.h"

struct sd_spec_loop;

/* The nodes a drafter proposes for one step, in the form a tree takes: node i has token
 * tokens[i] and parent parent[i], -1 for a child of the root (the last token of the text, not
 * in the draft); parents come before their children. A chain has parent[i] = i - 1. */
typedef struct {
    int n;                 /* nodes proposed, 0 <= n <= room */
    const int32_t *tokens; /* (n) */
    const int32_t *parent; /* (n) */
    /* (n, V) the processed distribution node i was drawn from, or NULL for deterministic nodes
     * (lookup, top candidates), which are verified as one-hot distributions */
    const float *q;
    /* 1: a CUDA loop's nodes (and q) were written on the device by the drafter (sd_cuda_spec);
     * tokens then is not read */
    int on_device;
} sd_draft;

typedef struct sd_drafter_ops {
    const char *name; /* "prompt_lookup", ... */
    /* Before anything is computed: whether the drafter can serve this target and request
     * (vocabulary, device, context length, layer counts), with a message naming the problem. */
    sd_status (*check)(const sd_drafter *d, const sd_model *target, int n_prompt,
                       int max_new_tokens);
    /* A request starts: *state receives what the drafter keeps for it (NULL if nothing), after
     * the loop has prefilled all of the prompt but its last token. */
    sd_status (*begin)(const sd_drafter *d, void **state, struct sd_spec_loop *L);
    /* Propose up to `room` nodes after the text L->hist[0 .. L->len). A drafter may propose
     * fewer, or none (the step then emits one token). */
    sd_status (*propose)(const sd_drafter *d, void *state, struct sd_spec_loop *L, int room,
                         sd_draft *out);
    /* After verification: the first n_acc nodes of the path were accepted (for a chain, nodes
     * 0 .. n_acc - 1) and `next` was emitted after them; L->len counts them all and the target
     * cache holds all of the text but its last token. Not called once generation has ended. */
    sd_status (*commit)(const sd_drafter *d, void *state, struct sd_spec_loop *L,
                        const sd_draft *draft, int n_acc, int32_t next);
    /* One draft token's cost relative to a target forward (the adaptive draft length counts
     * it), for the target `target`. */
    double (*cost)(const sd_drafter *d, const sd_model *target);
    /* The request ends (also after a failure): free what begin kept. */
    void (*end)(const sd_drafter *d, void *state);
    /* The drafter is freed: release its shared state (NULL: it has none). */
    void (*destroy)(sd_drafter *d);
    /* A drafter that reads the target's features (EAGLE): which, for `target`: returns 1 when it
     * reads the final-normed hidden state, and writes the layers whose inputs it reads into aux
     * (*n_aux of them, <= SD_MAX_AUX_LAYERS). The loop then keeps every position's features
     * (sd_spec_features). NULL: none. */
    int (*features)(const sd_drafter *d, const sd_model *target, int32_t *aux, int *n_aux);
} sd_drafter_ops;

/* What a verify forward costs by its token count on one model, measured: the tree drafters size
 * their trees by it, since it differs by machine far more than by model (8 tokens cost about 3
 * tokens' time with AVX2 alone, 1.3-1.6 with AVX-512 or AMX, about 1 on a GPU). */
typedef struct {
    pthread_mutex_t lock; /* guards what follows: requests of one drafter measure and read it */
    int threads;          /* the model's thread count when measured; 0: not measured; -1: given */
    int asked;            /* the largest size a measurement was asked for */
    int max_T;            /* rel holds T = 1 .. max_T */
    float rel[SD_MAX_TREE_NODES + 2]; /* rel[T]: a tree-masked forward of T tokens over one */
    /* Measured: the seconds of a forward of T tokens after ctx[0] and after ctx[1] cached ones
     * (rel is the first's ratios). Attention grows with the text while the matrices do not, so
     * a verify of many tokens costs relatively more after a long text (SmolLM2 Q4_1 on a Zen
     * 4: 8 tokens cost 1.45 times one after 64 tokens, 1.87 after 700); the cost at a text's
     * length is interpolated, or extrapolated, linearly between the two (ctx[1]: the longest
     * text measured; its curve is fitted over timings after two lengths, spec/drafter.c).
     * ctx[1] = 0: one context only (given costs, or a model too short for two). */
    int ctx[2];
    double secs[2][SD_MAX_TREE_NODES + 2];
} sd_cost_curve;

/* A drafter: its operations, the most nodes it proposes per step, and its parameters. */
struct sd_drafter {
    const sd_drafter_ops *ops;
    int max_nodes;       /* 1 <= max_nodes <= SD_MAX_DRAFT: sizes the loop's buffers */
    int wants_q;         /* 1: the loop keeps (max_nodes, V) rows for the drafts' distributions */
    int row_top;         /* > 0: commit reads the row_top largest logits' ids of every verified
                          * row (sd_spec_row_top; found on the device for a CUDA target) */
    int context;         /* the longest text the drafter can follow (a draft model's context) */
    sd_model *model;     /* a drafter's own model (not owned), or NULL */
    void *shared;        /* state every request of the drafter shares (ops->destroy frees it) */
    sd_cost_curve *cost; /* (owned) a tree drafter's verify costs, with their own lock */
    sd_head *head;       /* (owned) a learned drafter's head (EAGLE, Medusa), or NULL */
    /* (owned) the outputs of the drafter's earlier requests, for prompt lookup's drafts where
     * the text has no match of two or more tokens (spec/drafters/lookup_history.h), or NULL;
     * the loop adds each request's output as it ends (sd_drafter_set_history) */
    struct sd_lookup_history *history;
    union {
        sd_prompt_lookup lookup;
        sd_token_recycling recycling;
        struct {
            sd_draft_params dp;
            int n_layers; /* early exit: the target's first n_layers layers; 0 = all */
            int lookup;   /* EAGLE: prompt lookup's drafts beside the head, up to this many */
            int window;   /* EAGLE: the head attends to this many last positions; 0: all */
        } m;
        struct { /* Medusa's static tree: node i is rank[i] of head depth[i] - 1's best tokens */
            int n;
            int top; /* the most ranks a node reads: max rank + 1 */
            int32_t parent[SD_MAX_TREE_NODES];
            int32_t depth[SD_MAX_TREE_NODES];
            int32_t rank[SD_MAX_TREE_NODES];
        } medusa;
    } u;
};

/* SD_ERR_INVALID_ARG unless 1 <= k <= SD_MAX_DRAFT (the most drafts a step may carry). */
sd_status sd_check_max_draft(int k);
/* The constructors' common checks of sd_draft_params (k, p_min, verify_slope, branching, nodes),
 * and of a verify_slope alone. */
sd_status sd_drafter_check_draft_params(const sd_draft_params *dp);
sd_status sd_drafter_check_slope(float verify_slope);
/* A zeroed drafter with these operations and sizes (SD_ERR_NOMEM). */
sd_status sd_drafter_alloc(sd_drafter **out, const sd_drafter_ops *ops, int max_nodes, int wants_q);

/* The adaptive draft length (sd_prompt_lookup.verify_slope): the k <= kmax that maximises
 * expected tokens per verify cost, (1 - a^(k+1)) / ((1 - a)(1 + slope k)), for an acceptance
 * rate a measured as `accepted` of `trials` (Beta(1, 1)-smoothed, so it starts at 0.5); when no
 * length pays, 1 on every fourth step (`step`), to keep measuring, else 0. */
int sd_adaptive_k(double accepted, double trials, float slope, int kmax, int step);
/* A model drafter's draft length: up to `room`, sized by dp's adaptive rule when it is on (the
 * acceptance measured over all drafted tokens so far, draft_cost one draft token's cost). */
int sd_model_draft_k(const sd_draft_params *dp, const sd_spec_stats *ss, double draft_cost,
                     int room);

/* Measures c for forwards of up to max_T tokens (<= SD_MAX_TREE_NODES + 1) after a short prefix
 * (64 tokens), on a scratch cache: the fastest of three timed runs of each of a few sizes,
 * interpolated between them; and after longer ones (320 and 1024 tokens, where the model's
 * context allows; on the CPU the short prefix's slots copied in turn, not computed) of 1, 2, 4, 8
 * and max_T tokens, what those texts add fitted as linear in the text's length and the batch's
 * (sd_verify_cost_fit; under a second on a small CPU model).
 * Nothing is measured when c already holds a curve for this thread count and size, or one that was
 * given (sd_drafter_set_costs), or when the model keeps one measured by an earlier drafter for
 * its present thread count and cache type (sd_model_costs), which is copied; a measured curve
 * is left there for the drafters after. */
sd_status sd_cost_curve_measure(sd_cost_curve *c, sd_model *m, int max_T);

/* A copy of the curve, taken under its lock (for sd_tree_size), its rel the costs after `len`
 * cached tokens (see sd_cost_curve.secs; as measured or given where it has one context). */
void sd_cost_curve_get(sd_cost_curve *c, int len, sd_cost_curve *copy);
/* The seconds of a forward of T (1 <= T <= c->max_T) tokens after `len` cached ones, from a
 * copy's measured seconds (0 where the costs were given, not measured). */
double sd_cost_curve_secs(const sd_cost_curve *c, int len, int T);

/* Of n candidate nodes with p[i] the chance that node i is on the accepted path (the nodes
 * ordered so that a parent comes first and p[child] <= p[parent]), how many of the most likely
 * to verify: the count that maximises expected tokens per unit of verify time,
 * (1 + sum of their p) / rel[count + 1], 0 when none beats plain decoding. order receives the
 * nodes by decreasing p (ties to the earlier node), so that any prefix of it is a tree. */
int sd_tree_size(const float *p, int n, const sd_cost_curve *c, int *order);

#endif /* SD_DRAFTER_H */
