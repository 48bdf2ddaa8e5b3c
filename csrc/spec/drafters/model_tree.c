/* model_tree.c — tree drafting with a model (model_tree.h): EAGLE-2's dynamic tree (Li et al.
 * 2024) for the draft-model and layer-skip drafters, grown a depth at a time, one tree-masked
 * draft forward per depth, and the draft cache's accepted path compacted after the verify.
 *
 * A step, with b = branching, D = min(k, the depth room), N = the most nodes (and slots):
 *   the root (the text's last token) is fed with the tokens the draft cache lacks;
 *   at each depth, the frontier's fed nodes give children: at temperature 0 each node's b most
 *   probable tokens, when sampling b draws without replacement from its processed q; a child is
 *   scored by its path probability (the product of the draft's probabilities down its path);
 *   the next frontier is the depth's b most probable nodes (not below p_min), fed in one
 *   forward, each seeing the prefix, its ancestors and itself.
 * Which nodes the tree keeps (at most N):
 *   temperature 0: the N most probable of all candidates, a parent before its child on ties (a
 *   child's path probability never exceeds its parent's), so the kept nodes form a tree;
 *   sampling: the tree rule is exact only if each parent's children are the first draws of
 *   sampling without replacement, however many, so a child is kept or dropped before its token
 *   is drawn and never after: each depth gets an equal share of the nodes left, and its draws go,
 *   one at a time, to the parent whose next draw promises most (its path probability times its
 *   largest undrawn q, known before the draw). Dropping drawn children by their own path
 *   probability, EAGLE-2's re-ranking, would favour probable draws and bias the output. Sized
 *   by cost, the node count is fixed before the step's first draw (sampled_paying). */
#include "spec/drafters/model_tree.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops_cpu.h"
#include "spec/sampler.h"
#include "spec/verify.h"
#include "util/clock.h"
#include "util/hd.h"
#include "util/status.h"

#define B_MAX SD_MODEL_MAX_BRANCHING
#define FED_MAX (SD_MAX_TREE_NODES + 1) /* the root and up to SD_MAX_TREE_NODES expanded nodes */
#define CAND_MAX (FED_MAX * B_MAX)      /* every fed node's children */
#define COST_RING 8                     /* drafting costs kept, the median read */

/* A node fed to the draft: its b most probable tokens and the children drawn so far. */
typedef struct {
    int node;            /* its candidate, -1 for the root */
    int n_top;           /* tokens in top (those of nonzero probability, at most b) */
    int32_t top[B_MAX];  /* by decreasing probability, the lower id first on ties */
    float ptop[B_MAX];   /* their probabilities: softmax at temperature 0, else q */
    int drawn;           /* children drawn */
    int32_t kids[B_MAX]; /* their tokens */
} fed_node;

struct sd_model_tree {
    int V, b, sampling, max_fed;
    float *logits; /* (b, V) a draft forward's logits */
    float *qrows;  /* (max_fed, V) when sampling: fed node i's processed distribution */
    float *ework;  /* (V) greedy: a row's softmax exponentials */
    uint8_t *mask; /* (b, capacity) a draft forward's tree mask */
    /* a step's candidates: token, parent candidate (-1: the root), depth, fed index (0: not
     * fed), path probability, the draft's probability of the token at its parent */
    int n_cand;
    int32_t tok[CAND_MAX], par[CAND_MAX], dep[CAND_MAX], fed[CAND_MAX];
    double P[CAND_MAX];
    float own[CAND_MAX];
    int n_fed;
    fed_node fn[FED_MAX];
    /* the proposal: base = the text's length then, prefix = the draft cache's length after the
     * root was fed (base, or base - 1 for a head whose rows lag the text by one); slot[i] node
     * i's slot in the draft cache, -1 when it was not fed */
    int base, prefix, n;
    int32_t tokens[SD_MAX_TREE_NODES], parent[SD_MAX_TREE_NODES], slot[SD_MAX_TREE_NODES];
    /* when sampling, for sizing by cost: the last proposal's depth, and over this request's
     * steps, how many drafted depth d (tried[d]) and how many accepted a path reaching it */
    int last_depth;
    int tried[SD_MAX_DRAFT + 1], reached[SD_MAX_DRAFT + 1];
    /* at temperature 0, how the draft's path probabilities bear out: over this request's
     * settled steps, the sum of the verified nodes' path probabilities and the drafts accepted
     * (their ratio scales the probabilities the sizing reads), the last proposal's sum; and the
     * seconds and count of the draft forwards past the root's */
    double cal_p, cal_acc, last_sum_p;
    double fwd_s;
    int fwd_n;
    /* drafting's measured cost, in target forwards of one token at the text's length then (by
     * the measured cost curve): over this request's proposals after its first (which feeds the
     * draft the whole prompt) that follow one which drafted in the step before (a root after
     * steps without drafting feeds the draft their tokens too), the last COST_RING of the
     * root's part (its forward, the rows' processing, the draws) and of a deeper draft
     * forward's (a proposal's mean), with their counts; and the step of the last proposal
     * that drafted (-2 before any, so that the first never follows one) */
    int drafted_step;
    double root_rel[COST_RING], feed_rel[COST_RING];
    int root_n, feed_n;
};

sd_status sd_model_tree_create(sd_model_tree **out, const sd_draft_params *dp,
                               const sd_spec_loop *L) {
    *out = NULL;
    if (L->s.temperature != 0.0f && L->q == NULL) {
        /* a CUDA target keeps the drafts' distributions on the device, where drafts drawn by a
         * model on the host (a head, a draft tree) cannot put theirs yet */
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "on a CUDA target, draft trees and EAGLE heads verify at temperature "
                            "0 only so far (sampled drafts need a CPU target)");
    }
    sd_model_tree *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory for a draft tree");
    }
    t->V = L->m->cfg.vocab_size;
    t->drafted_step = -2;
    t->b = dp->branching;
    t->sampling = L->s.temperature != 0.0f;
    t->max_fed = dp->nodes + 1 < FED_MAX ? dp->nodes + 1 : FED_MAX;
    t->logits = malloc((size_t)t->b * (size_t)t->V * sizeof(float));
    t->mask = malloc((size_t)t->b * (size_t)L->capacity);
    if (t->sampling) {
        t->qrows = malloc((size_t)t->max_fed * (size_t)t->V * sizeof(float));
    } else {
        t->ework = malloc((size_t)t->V * sizeof(float));
    }
    if (t->logits == NULL || t->mask == NULL || (t->sampling ? t->qrows : t->ework) == NULL) {
        sd_model_tree_free(t);
        return sd_set_error(SD_ERR_NOMEM, "out of memory for a draft tree");
    }
    *out = t;
    return SD_OK;
}

void sd_model_tree_free(sd_model_tree *t) {
    if (t != NULL) {
        free(t->logits);
        free(t->qrows);
        free(t->ework);
        free(t->mask);
        free(t);
    }
}

/* Whether (x, id) goes before (y, jd) in a top list: the larger value, the lower id on ties. */
static int before(float x, int32_t id, float y, int32_t jd) {
    return x > y || (x == y && id < jd);
}

/* f's b largest entries of row (n) into its top list, by decreasing value, the lower id first
 * on ties (so the first is sd_argmax's); entry d is the logit of id ids[d] (NULL: of id d), and
 * at[j] receives the entry of top[j]. */
static void best_of(fed_node *f, int b, const float *row, int n, const int32_t *ids, int *at) {
    int m = 0;
    for (int d = 0; d < n; d++) {
        if (ids == NULL && m == b && (d & 31) == 0 && d + 32 <= n &&
            !sd_any_above32(row + d, f->ptop[b - 1])) {
            d += 31; /* nothing above the last kept value (whose id is lower): no change */
            continue;
        }
        const float x = row[d];
        const int32_t id = ids != NULL ? ids[d] : d;
        if (m == b && !before(x, id, f->ptop[b - 1], f->top[b - 1])) {
            continue;
        }
        int j = m < b ? m++ : b - 1;
        for (; j > 0 && before(x, id, f->ptop[j - 1], f->top[j - 1]); j--) {
            f->ptop[j] = f->ptop[j - 1];
            f->top[j] = f->top[j - 1];
            at[j] = at[j - 1];
        }
        f->ptop[j] = x;
        f->top[j] = id;
        at[j] = d;
    }
    f->n_top = m;
}

/* Whether a fed node's logits row is over the feeder's own vocabulary (ids; at temperature 0),
 * even one as large as the target's (its order may differ), rather than the target's V ids. */
static int by_ids(const sd_model_tree *t, const sd_tree_feeder *fd) {
    return fd != NULL && fd->ids != NULL && !t->sampling;
}

/* The entries of a fed node's logits row. */
static int row_width(const sd_model_tree *t, const sd_tree_feeder *fd) {
    return by_ids(t, fd) ? fd->n_ids : t->V;
}

/* Fed node i's rows from its logits lg (row_width entries): its processed q when sampling, its
 * best tokens. */
static void fed_rows(sd_model_tree *t, sd_spec_loop *L, int i, int node, const float *lg,
                     const sd_tree_feeder *fd) {
    fed_node *f = &t->fn[i];
    const int V = t->V;
    f->node = node;
    f->drawn = 0;
    int at[B_MAX];
    if (t->sampling) {
        float *q = t->qrows + (size_t)i * (size_t)V;
        sd_process_logits(q, lg, V, &L->s, L->iwork);
        best_of(f, t->b, q, V, NULL, at);
        while (f->n_top > 0 && !(f->ptop[f->n_top - 1] > 0.0f)) {
            f->n_top--; /* filtered out: never drawn */
        }
        return;
    }
    /* by logit, then their softmax probabilities (the exponentials as sampling's softmax takes
     * them; over the draft's own vocabulary alone where the feeder gives its ids, the target's
     * other ids being -inf, which gives 0) */
    const int n = row_width(t, fd);
    best_of(f, t->b, lg, n, by_ids(t, fd) ? fd->ids : NULL, at);
    const double sum = sd_softmax_exp(t->ework, lg, n, f->ptop[0], 1.0f);
    for (int j = 0; j < f->n_top; j++) {
        f->ptop[j] = (float)((double)t->ework[at[j]] / sum);
    }
}

static double path_of(const sd_model_tree *t, const fed_node *f) {
    return f->node < 0 ? 1.0 : t->P[f->node];
}

/* What f's next child promises before it is drawn: f's path probability times the largest
 * probability among its undrawn tokens (at temperature 0, its next best token's); 0 when f has
 * no child left to give. */
static double next_score(const sd_model_tree *t, const fed_node *f) {
    if (f->drawn >= t->b) {
        return 0.0;
    }
    for (int j = t->sampling ? 0 : f->drawn; j < f->n_top; j++) {
        int taken = 0;
        for (int c = 0; t->sampling && c < f->drawn; c++) {
            taken |= f->kids[c] == f->top[j];
        }
        if (!taken) {
            return path_of(t, f) * (double)f->ptop[j];
        }
    }
    return 0.0;
}

/* f's next child: its next best token, or a draw from q without its children so far (q's
 * entries zeroed for the draw, then restored). Returns the token and its probability. */
static int32_t next_child(sd_model_tree *t, fed_node *f, int fi, double u, float *prob) {
    if (!t->sampling) {
        *prob = f->ptop[f->drawn];
        return f->top[f->drawn];
    }
    float *q = t->qrows + (size_t)fi * (size_t)t->V;
    float keep[B_MAX];
    for (int c = 0; c < f->drawn; c++) {
        keep[c] = q[f->kids[c]];
        q[f->kids[c]] = 0.0f;
    }
    const int32_t tok = sd_sample_probs(q, t->V, u);
    for (int c = f->drawn - 1; c >= 0; c--) {
        q[f->kids[c]] = keep[c];
    }
    *prob = q[tok];
    return tok;
}

/* Candidate x's rank among all: how many are more probable, or as probable and earlier. */
static int rank_of(const sd_model_tree *t, int x) {
    int r = 0;
    for (int y = 0; y < t->n_cand; y++) {
        r += t->P[y] > t->P[x] || (t->P[y] == t->P[x] && y < x);
    }
    return r;
}

/* Feeds candidates pick[0 .. np) (one depth's, increasing) in one forward with the tree mask,
 * as fed nodes n_fed .. n_fed + np - 1 in slots base + (fed index - 1). */
static sd_status feed(sd_model_tree *t, sd_spec_loop *L, sd_model *dm, sd_kv_cache *dkv,
                      int n_layers, const sd_tree_feeder *fd, const int *pick, int np) {
    const int base = t->prefix, cols = base + t->n_fed + np - 1;
    int32_t tokens[B_MAX], pos[B_MAX], slots[B_MAX];
    int parent_fed[B_MAX];
    memset(t->mask, 0, (size_t)np * (size_t)cols);
    for (int j = 0; j < np; j++) {
        const int x = pick[j];
        t->fed[x] = t->n_fed + j;
        tokens[j] = t->tok[x];
        pos[j] = base - 1 + t->dep[x];
        slots[j] = base + t->fed[x] - 1;
        parent_fed[j] = t->par[x] < 0 ? 0 : t->fed[t->par[x]];
        uint8_t *row = t->mask + (size_t)j * (size_t)cols;
        memset(row, 1, (size_t)base); /* the prefix and the root */
        for (int a = x; a >= 0; a = t->par[a]) {
            row[base + t->fed[a] - 1] = 1; /* itself and its ancestors, all fed */
        }
    }
    sd_batch bt = {0};
    bt.n_tokens = np;
    bt.tokens = tokens;
    bt.pos = pos;
    bt.slots = slots;
    bt.mask = t->mask;
    bt.n_mask_cols = cols;
    bt.n_logits = np;
    bt.n_layers = n_layers;
    if (fd != NULL) {
        SD_TRY(fd->nodes(fd->ctx, &bt, parent_fed, t->n_fed, t->logits));
    } else {
        SD_TRY(sd_forward(dm, dkv, &bt, t->logits));
    }
    const int w = row_width(t, fd);
    for (int j = 0; j < np; j++) {
        fed_rows(t, L, t->n_fed + j, pick[j], t->logits + (size_t)j * (size_t)w, fd);
    }
    t->n_fed += np;
    return SD_OK;
}

/* The next frontier: up to b candidates of [from, n_cand) by decreasing path probability (the
 * earlier on ties), each given at least p_min by the draft, and at temperature 0 only those
 * whose children could still be among the `budget` kept; as many as the fed slots allow.
 * Returns the count, pick in increasing order. */
static int frontier(const sd_model_tree *t, int from, int budget, float p_min, int *pick) {
    const int b = t->b, room = budget + 1 - t->n_fed;
    int np = 0;
    for (int x = from; x < t->n_cand; x++) {
        if ((p_min > 0.0f && t->own[x] < p_min) || (!t->sampling && rank_of(t, x) >= budget - 1) ||
            (np == b && !(t->P[x] > t->P[pick[b - 1]]))) {
            continue;
        }
        int j = np < b ? np++ : b - 1;
        for (; j > 0 && t->P[x] > t->P[pick[j - 1]]; j--) {
            pick[j] = pick[j - 1];
        }
        pick[j] = x;
    }
    np = np < room ? np : room > 0 ? room : 0;
    for (int i = 1; i < np; i++) { /* in candidate order */
        for (int j = i; j > 0 && pick[j] < pick[j - 1]; j--) {
            const int s = pick[j];
            pick[j] = pick[j - 1];
            pick[j - 1] = s;
        }
    }
    return np;
}

static double calibration(const sd_model_tree *t);

/* At temperature 0, how many of the `budget` most probable candidates pay on the verify costs
 * c (sd_tree_size over their path probabilities, scaled by calibration()), at least one every
 * fourth step. */
static int paying(const sd_model_tree *t, const sd_spec_loop *L, int budget,
                  const sd_cost_curve *c) {
    float p[SD_MAX_TREE_NODES] = {0};
    int order[SD_MAX_TREE_NODES], n = 0;
    const double s = calibration(t);
    for (int x = 0; x < t->n_cand && n < SD_MAX_TREE_NODES; x++) {
        if (t->n_cand <= budget || rank_of(t, x) < budget) { /* closed under parents */
            const double px = s * t->P[x];
            p[n++] = (float)(px < 1.0 ? px : 1.0);
        }
    }
    const int keep = sd_tree_size(p, n, c, order);
    return keep == 0 && n > 0 && L->ss->steps % 4 == 0 ? 1 : keep;
}

/* The median of the last min(n, COST_RING) costs in ring (0 for none): a step that a page
 * fault or another process slowed counts for no more than one that ran as usual. */
static double median_cost(const double *ring, int n) {
    double v[COST_RING];
    const int m = n < COST_RING ? n : COST_RING;
    for (int i = 0; i < m; i++) {
        int j = i;
        for (; j > 0 && v[j - 1] > ring[i]; j--) {
            v[j] = v[j - 1];
        }
        v[j] = ring[i];
    }
    return m == 0 ? 0.0 : m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

/* When sampling, how many nodes pay on the verify costs c and the drafting's measured cost,
 * decided before any draw: the chance that the accepted path reaches depth d, as measured over
 * this request's steps that drafted it, is the p of a chain's depth-d node (sd_tree_size); at
 * least one node every fourth step. Each depth's count is Beta-smoothed towards the depth
 * before times the rate at which paths went on past that one (0.6 at the first depth): a
 * depth never drafted yet is judged by the depths that were, so a draft that is mostly right
 * grows its trees deeper, and one mostly wrong does not try depths it cannot reach. A drawn child's
 * chance to be accepted is not its q (p = q would accept every one), so the draft's probabilities
 * cannot tell it as at temperature 0; and since the count depends on earlier steps alone, never on
 * this step's draws, the tree rule stays exact. */
static int sampled_paying(const sd_model_tree *t, const sd_spec_loop *L, int D,
                          const sd_cost_curve *c) {
    float p[SD_MAX_DRAFT];
    int order[SD_MAX_DRAFT];
    double prev = 1.0, rate = 0.6;
    for (int d = 1; d <= D; d++) {
        const double prior = prev * rate;
        double r = (t->reached[d] + 2.0 * prior) / (t->tried[d] + 2.0);
        r = r < prev ? r : prev; /* a deeper node is never likelier */
        rate = prev > 0.0 ? r / prev : 0.0;
        prev = r;
        p[d - 1] = (float)r;
    }
    /* a step of k nodes also pays for its drafting: the root's part and one forward per depth
     * past the first (min(k, D) depths, as propose shares the nodes out), as measured so far
     * (nothing before the first measurement: drafting is tried first) */
    sd_cost_curve paid;
    paid.max_T = c->max_T;
    memcpy(paid.rel, c->rel, sizeof(paid.rel));
    const double root = median_cost(t->root_rel, t->root_n);
    const double feed = t->feed_n > 0 ? median_cost(t->feed_rel, t->feed_n) : root;
    for (int T = 2; T <= paid.max_T; T++) {
        const int depths = T - 1 < D ? T - 1 : D;
        paid.rel[T] = (float)((double)c->rel[T] + root + feed * (depths - 1));
    }
    const int keep = sd_tree_size(p, D, &paid, order);
    return keep == 0 && L->ss->steps % 4 == 0 ? 1 : keep;
}

/* Whether some candidate of [from, n_cand) is among those that pay. */
static int pays_at(const sd_model_tree *t, const sd_spec_loop *L, int budget,
                   const sd_cost_curve *c, int from) {
    const int keep = paying(t, L, budget, c);
    for (int x = from; x < t->n_cand; x++) {
        if (rank_of(t, x) < keep) {
            return 1;
        }
    }
    return 0;
}

/* At temperature 0, before another draft forward: whether the next depth could pay for it. Its
 * nodes are together no likelier than this depth's (from `from` on; scaled by calibration()),
 * which bounds the tokens they can bring; the forward costs its measured seconds over a
 * one-token target forward's at the text's length. Unknown before the first. */
static int deeper_pays(const sd_model_tree *t, const sd_spec_loop *L, const sd_cost_curve *c,
                       int from) {
    if (t->fwd_n == 0 || c->max_T < 1) {
        return 1;
    }
    double sum = 0.0; /* the next depth's nodes: no likelier in all than their parents */
    for (int x = from; x < t->n_cand; x++) {
        sum += t->P[x];
    }
    const double one = sd_cost_curve_secs(c, L->len, 1);
    const double forward = t->fwd_s / (double)t->fwd_n;
    return one <= 0.0 || calibration(t) * sum * one >= forward;
}

void sd_model_tree_settle(sd_model_tree *t, const sd_spec_loop *L) {
    if (t->last_depth > 0) { /* the last proposal's outcome: the text grew by n_acc + 1 */
        const int n_acc = L->len - t->base - 1;
        for (int d = 1; d <= t->last_depth; d++) {
            t->tried[d]++;
            t->reached[d] += n_acc >= d;
        }
        t->cal_p += t->last_sum_p;
        t->cal_acc += n_acc;
        t->last_depth = 0;
    }
}

/* At temperature 0: how much likelier the draft's path probabilities have proven than they
 * say, over this request (accepted drafts over the verified nodes' summed probabilities, with
 * two pseudo-counts at 1: a head sure of itself and mostly wrong gets its trees cut). */
static double calibration(const sd_model_tree *t) {
    return (t->cal_acc + 2.0) / (t->cal_p + 2.0);
}

/* A proposal's drafting seconds into the measured costs (sd_model_tree.root_rel): root_s of
 * its root's part, feeds_s of its `feeds` deeper draft forwards (their mean); only where the step
 * before drafted (so never the request's first) and c has measured seconds (not given costs). */
static void measured(sd_model_tree *t, const sd_spec_loop *L, const sd_cost_curve *c, double root_s,
                     double feeds_s, int feeds) {
    const double one = c != NULL ? sd_cost_curve_secs(c, L->len, 1) : 0.0;
    const int step = L->ss->steps, follows = t->drafted_step == step - 1;
    t->drafted_step = t->n > 0 ? step : t->drafted_step;
    if (!follows || !(one > 0.0)) {
        return;
    }
    t->root_rel[t->root_n++ % COST_RING] = root_s / one;
    if (feeds > 0) {
        t->feed_rel[t->feed_n++ % COST_RING] = feeds_s / feeds / one;
    }
}

sd_status sd_model_tree_propose(sd_model_tree *t, sd_spec_loop *L, sd_model *dm, sd_kv_cache *dkv,
                                int n_layers, const sd_draft_params *dp, const sd_tree_feeder *fd,
                                const sd_cost_curve *cost, sd_draft *out) {
    const int V = t->V, len = L->len;
    int depth_room = 0;
    const int room = sd_spec_tree_room(L, &depth_room);
    const int D = dp->k < depth_room ? dp->k : depth_room;
    int budget = room < t->max_fed - 1 ? room : t->max_fed - 1;
    sd_model_tree_settle(t, L);
    if (t->sampling && cost != NULL && D >= 1 && budget >= 1) {
        const int keep = sampled_paying(t, L, D, cost);
        budget = keep < budget ? keep : budget;
    }
    t->base = len;
    t->n = t->n_cand = t->n_fed = 0;
    out->n = 0;
    out->tokens = t->tokens;
    out->parent = t->parent;
    out->q = NULL;
    out->on_device = 0;
    if (D < 1 || budget < 1) {
        return SD_OK;
    }
    const double start = sd_now_s();
    double feeds_s = 0.0;
    int feeds = 0;
    /* the root, with the tokens the draft has not seen */
    if (fd != NULL) {
        SD_TRY(fd->root(fd->ctx, L, t->logits, &t->prefix));
        if (t->prefix == 0) {
            return SD_OK; /* nothing to draft from yet */
        }
    } else {
        const int have = sd_kv_cache_length(dkv);
        sd_batch bt = {0};
        bt.n_tokens = len - have;
        bt.tokens = L->hist + have;
        bt.n_logits = 1;
        bt.n_layers = n_layers;
        SD_TRY(sd_forward(dm, dkv, &bt, t->logits));
        t->prefix = len;
    }
    fed_rows(t, L, 0, -1, t->logits, fd);
    t->n_fed = 1;
    /* draws keyed by (output position, draw): never one twice */
    const uint64_t key0 = (uint64_t)(len - L->n_prompt) << 12;
    uint64_t draws = 0;
    for (int d = 1, f0 = 0, f1 = 1; d <= D; d++) {
        const int level0 = t->n_cand;
        int cap = CAND_MAX - t->n_cand; /* temperature 0: all, cut at the end */
        if (t->sampling) {              /* an equal share of the nodes left */
            cap = (budget - t->n_cand + (D - d)) / (D - d + 1);
        }
        while (t->n_cand - level0 < cap) {
            int best = -1;
            double bs = 0.0;
            for (int f = f0; f < f1; f++) {
                const double s = next_score(t, &t->fn[f]);
                if (s > bs) {
                    bs = s;
                    best = f;
                }
            }
            if (best < 0) {
                break;
            }
            fed_node *f = &t->fn[best];
            const double u = sd_rng_uniform(L->seed, SD_STREAM_DRAFT, key0 + draws++);
            float pr = 0.0f;
            const int32_t tk = next_child(t, f, best, u, &pr);
            const int x = t->n_cand++;
            t->tok[x] = tk;
            t->par[x] = f->node;
            t->dep[x] = d;
            t->fed[x] = 0;
            t->own[x] = pr;
            t->P[x] = path_of(t, f) * (double)pr;
            f->kids[f->drawn++] = tk;
        }
        if (d == D || t->n_cand == level0 || (t->sampling && t->n_cand >= budget)) {
            break;
        }
        if (!t->sampling && cost != NULL && !pays_at(t, L, budget, cost, level0)) {
            break; /* this depth's nodes do not pay: deeper ones, less probable, would not */
        }
        if (!t->sampling && cost != NULL && !deeper_pays(t, L, cost, level0)) {
            break; /* another draft forward would cost more than its nodes could bring */
        }
        int pick[B_MAX];
        const int np = frontier(t, level0, budget, dp->p_min, pick);
        if (np == 0) {
            break;
        }
        f0 = t->n_fed;
        const double t0 = sd_now_s();
        SD_TRY(feed(t, L, dm, dkv, n_layers, fd, pick, np));
        const double fs = sd_now_s() - t0;
        t->fwd_s += fs;
        t->fwd_n++;
        feeds_s += fs;
        feeds++;
        f1 = t->n_fed;
    }
    /* the kept candidates in their order (parents first, siblings as drawn): at temperature 0
     * the `budget` most probable, a set closed under parents (a child is never more probable
     * than its parent, and comes later); when sampling, all */
    int keep = budget;
    if (!t->sampling && cost != NULL && t->n_cand > 0) {
        keep = paying(t, L, budget, cost);
    }
    int idx[CAND_MAX];
    for (int x = 0; x < t->n_cand; x++) {
        idx[x] = -1;
        if (!t->sampling && t->n_cand > keep && rank_of(t, x) >= keep) {
            continue;
        }
        const int p = t->par[x];
        if (p >= 0 && idx[p] < 0) {
            return sd_set_error(SD_ERR_INTERNAL, "a draft tree kept a node without its parent");
        }
        const int i = idx[x] = t->n++;
        t->tokens[i] = t->tok[x];
        t->parent[i] = p < 0 ? -1 : idx[p];
        t->slot[i] = t->fed[x] > 0 ? t->prefix + t->fed[x] - 1 : -1;
        if (t->sampling) { /* the distribution it was drawn from: its parent's */
            const int pf = p < 0 ? 0 : t->fed[p];
            memcpy(L->q + (size_t)i * (size_t)V, t->qrows + (size_t)pf * (size_t)V,
                   (size_t)V * sizeof(float));
        }
    }
    out->n = t->n;
    out->q = t->sampling ? L->q : NULL;
    measured(t, L, cost, sd_now_s() - start - feeds_s, feeds_s, feeds);
    t->last_sum_p = 0.0;
    for (int x = 0; x < t->n_cand; x++) { /* the depth drafted, the kept nodes' probability */
        if (idx[x] >= 0 && t->dep[x] > t->last_depth) {
            t->last_depth = t->dep[x];
        }
        t->last_sum_p += idx[x] >= 0 ? t->P[x] : 0.0;
    }
    return SD_OK;
}

sd_status sd_model_tree_costs(const sd_drafter *d, const sd_draft_params *dp, sd_spec_loop *L,
                              sd_cost_curve *buf, const sd_cost_curve **out) {
    *out = NULL;
    if (!dp->size_by_cost) {
        return SD_OK;
    }
    const int max_T = (dp->branching > 1 ? dp->nodes : dp->k) + 1;
    SD_TRY(sd_cost_curve_measure(d->cost, L->m,
                                 max_T < SD_MAX_TREE_NODES + 1 ? max_T : SD_MAX_TREE_NODES + 1));
    sd_cost_curve_get(d->cost, L->len, buf);
    *out = buf->max_T > 0 ? buf : NULL;
    return SD_OK;
}

sd_status sd_model_tree_commit(sd_model_tree *t, const sd_spec_loop *L, sd_kv_cache *dkv,
                               int n_acc) {
    const int base = t->base;
    int kept = 0;
    for (int j = 0, at = -1; j < n_acc; j++) {
        int i = at + 1;
        while (i < t->n && !(t->parent[i] == at && t->tokens[i] == L->hist[base + j])) {
            i++;
        }
        if (i == t->n) {
            return sd_set_error(SD_ERR_INTERNAL, "the accepted path left the draft tree");
        }
        if (t->slot[i] < 0) {
            break; /* not fed: the path's last node */
        }
        if (t->slot[i] != base + j) { /* ascending: a fed node's slot is >= base + depth - 1 */
            SD_TRY(sd_kv_cache_copy_slot(dkv, base + j, t->slot[i]));
        }
        kept = j + 1;
        at = i;
    }
    int n = base + kept < L->len - 1 ? base + kept : L->len - 1;
    return sd_kv_cache_length(dkv) > n ? sd_kv_cache_set_length(dkv, n) : SD_OK;
}
