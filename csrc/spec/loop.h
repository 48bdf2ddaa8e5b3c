/* loop.h — the speculative loop as a step on one sequence, what a drafter sees of it, and the
 * services drafters share (drafting with a model, the cache self-check).
 *
 * A sequence is one request: the target's cache, the text so far, the verify batch and its
 * rows, the emitter and the statistics. sd_spec_step runs one step on it:
 *   propose — the drafter proposes nodes after the text (drafter.h);
 *   verify  — one target forward over [last, nodes] gives every node's distribution at once,
 *             and the chain rule of verify.h keeps a prefix and picks one more token;
 *   accept  — the kept tokens are emitted and the cache rolls back to them (its length set);
 *   commit  — the drafter hears what was kept and rolls its own state back.
 * The step comes in two halves around the verify forward, so that the model's scheduler
 * (model/sched.h) can put the verify forwards of several sequences into one. */
#ifndef SD_LOOP_H
#define SD_LOOP_H

#include <stdint.h>

#include "model/model.h"
#include "spec/decode.h"
#include "spec/drafter.h"
#include "spec/sampler.h"
#include "spec/verify.h"
#include "specdec.h"

struct sd_cuda_spec;

typedef struct sd_spec_loop {
    sd_model *m;
    sd_kv_cache *kv; /* holds hist[0 .. len - 2]: all but the last token */
    int capacity;    /* the slots the sequence may use (sd_spec_capacity): kv (a reused cache
                      * may be larger) and a drafter's own cache */
    sd_sampling s;
    uint64_t seed;
    int n_prompt;
    int max_nodes;  /* the drafter's most nodes per step (K) */
    int32_t *hist;  /* (n_prompt + max_new_tokens) prompt + output */
    int len;        /* tokens in hist */
    int32_t *batch; /* (K + 1) the verify batch: last, d1 .. dK */
    int32_t *chain; /* (K) parents of a chain: -1, 0, 1, ... */
    float *logits;  /* (K + 1, V) */
    float *probs;   /* (K + 1, V) */
    float *fwork;   /* (2 V) */
    float *q;       /* (K, V) the drafts' distributions (drafters that have them), else NULL */
    float *dlog;    /* (V) a draft forward's logits, with q */
    int32_t *iwork; /* (V) */
    sd_emitter e;
    const sd_generate_params *p;
    sd_spec_stats *ss;
    double t_start;
    int check_cache;         /* sd_generate_params.check_cache */
    struct sd_cuda_spec *sp; /* a CUDA target's device state of the call, else NULL */
    sd_prefill pf;           /* the prompt, all but its last token, fed a step at a time */
    const sd_drafter *d;     /* the drafter, or NULL (the synthetic benchmark) */
    int begun;               /* d->ops->begin has run (dstate is d's) */
    void *dstate;            /* the drafter's state of this request */
    double draft_cost;       /* d's cost of one draft token relative to a target forward */
    /* the step between its halves */
    int phase;                     /* what the second half does: sd_spec_phase */
    sd_draft dr;                   /* the proposal */
    int depth[SD_MAX_TREE];        /* its nodes' depths */
    int chain_step;                /* it is a chain */
    int32_t tpos[SD_MAX_TREE + 1]; /* a tree's positions, and its mask ((n + 1, len + n)) */
    uint8_t *tmask;
    double t0, t1; /* when the proposal began and ended */
    /* a CUDA target's step, for a drafter with row_top: each verified row's top ids
     * ((SD_MAX_TREE + 1), row_top), found on the device */
    int32_t *row_top;
    /* the verify row each token the step keeps was taken from (the root's 0; its accepted
     * path's after it), for the emitter's logprobs */
    int32_t emit_row[SD_MAX_TREE + 1];
    /* the target's features of every position it has processed, for a drafter that reads
     * them (sd_drafter_ops.features): row p (feat_w floats) = [final-normed hidden state (D), if
     * feat_hidden][the input of layer feat_aux[i] (D)] ... */
    int feat_set; /* the drafter's wishes were read */
    int feat_hidden, n_feat_aux;
    int32_t feat_aux[SD_MAX_AUX_LAYERS];
    int feat_w;
    float *feat;      /* (capacity, feat_w), or NULL */
    float *feat_pool; /* rows [0, pf.fed) of them that came with a pooled cache (kv_cache.c),
                       * set by the caller after sd_spec_loop_begin; feat takes them over */
    float *fbuf;      /* a forward's feature outputs: hidden (T, D), then aux (n_aux, T, D) */
    int fbuf_rows;    /* the T fbuf holds */
} sd_spec_loop;

typedef enum {
    SD_SPEC_PHASE_NONE,    /* the first half did the whole step */
    SD_SPEC_PHASE_PREFILL, /* a part of the prompt went in */
    SD_SPEC_PHASE_CHAIN,   /* a chain's verify forward ran */
    SD_SPEC_PHASE_TREE,    /* a tree's */
} sd_spec_phase;

/* Allocates a sequence for drafts of up to K tokens (with rows for their distributions when
 * draft_rows) over a target cache of prompt + output + K slots, at most ctx (sd_spec_capacity),
 * or takes `kv` (owned from now on), whose first `reused` slots hold the prompt's first tokens;
 * computes nothing. On failure the sequence still needs sd_spec_loop_end. */
sd_status sd_spec_loop_begin(sd_spec_loop *L, sd_model *m, const int32_t *prompt, int n_prompt,
                             const sd_generate_params *p, const sd_sampling *s, int K, int ctx,
                             int draft_rows, int32_t *out, sd_spec_stats *ss, double t_start,
                             sd_kv_cache *kv, int reused);
/* The target cache's slots a sequence needs. */
int sd_spec_capacity(int n_prompt, int max_new_tokens, int K, int ctx);
/* One step of the prefill of all of the prompt but its last token (decode.h's sd_prefill);
 * *ready once it is all in, when the drafter L->d (if any) begins its request. */
sd_status sd_spec_prefill(sd_spec_loop *L, int *ready);
/* Reports what was emitted, frees the sequence and passes on its status. */
sd_status sd_spec_loop_end(sd_spec_loop *L, sd_status st, int *n_out, sd_finish_reason *reason);
/* The most drafts the next step may carry: no more than can be emitted, nor past the cache. */
int sd_spec_room(const sd_spec_loop *L);

/* The most nodes, and (in *depth) the deepest node, a tree may have this step: within the
 * cache, the tokens left to emit, and the run of attention slots the tree starts in. */
int sd_spec_tree_room(const sd_spec_loop *L, int *depth);

/* One step of the drafter's loop (propose, verify, accept, commit), timed into L->ss, in two
 * halves around the verify forward f, so that a scheduler can put the forwards of several
 * sequences into one: before — a part of the prompt, or the proposal and its verify batch
 * (f->b.n_tokens = 0: the half did the whole step, as on a CUDA target); after, given the
 * forward's status — the rule, accept, commit. Before the prompt is all in, a step feeds a part
 * of it (and the drafter begins once it is). */
sd_status sd_spec_step_before(sd_spec_loop *L, sd_fwd *f);
sd_status sd_spec_step_after(sd_spec_loop *L, const sd_fwd *f, sd_status forward);

/* A step's accept phase: the statistics, the kept drafts (batch[1 .. n_acc]) and the next
 * token appended to hist and emitted (stopping where the emitter says), the target cache rolled
 * back to all but the last token, and the self-check when asked. k: drafts verified. */
sd_status sd_spec_accept(sd_spec_loop *L, int k, int n_acc, int32_t next);

/* Services for drafters. */

/* The target's features at text position pos (< L->len - 1, the positions it has processed):
 * feat_w floats as sd_spec_loop documents, for a drafter with ops->features. */
const float *sd_spec_features(const sd_spec_loop *L, int pos);

/* The ids of the `top` largest logits of verified row r of the step (row 0 at the root, 1 + i
 * after node i; the larger first, ties to the lower id; -1 past V), for a drafter with row_top
 * >= top: computed from L->logits on the CPU into buf (top ints), read from what the device
 * found for a CUDA target. */
const int32_t *sd_spec_row_top(const sd_spec_loop *L, int r, int top, int32_t *buf);
/* (sd_top_ids in sampler.h: the same over one row of V values, the CPU's computation) */

/* Drafts up to *k tokens one forward at a time with `dm` (its first n_layers layers; 0 = all)
 * over the cache dkv, which holds a prefix of hist (at most all but the last token): the first
 * forward feeds the rest of hist in one batch (the tokens the draft has not seen), the others
 * one draft each. L->batch = [last, d1 .. dk], L->q[i] the processed row d(i+1) was taken from
 * (greedy at temperature 0, else sampled). With p_min > 0 drafting stops after a token the
 * draft gave less than p_min (its processed probability when sampling, its softmax probability
 * when greedy); *k is set to the count. With *k == 0 nothing is fed. On a CUDA target the drafts
 * and rows are written on the device. */
sd_status sd_spec_draft_autoregressive(sd_spec_loop *L, sd_model *dm, sd_kv_cache *dkv,
                                       int n_layers, int *k, float p_min);
/* A model drafter's proposal (draft_model.c, layerskip.c): the draft length of
 * sd_model_draft_k, drafted by sd_spec_draft_autoregressive with dm over dkv, as a chain in
 * out (rows of L->q, or on the device for a CUDA target). */
sd_status sd_spec_model_propose(sd_spec_loop *L, sd_model *dm, sd_kv_cache *dkv, int n_layers,
                                const sd_draft_params *dp, int room, sd_draft *out);
/* The check_cache self-check: kv must hold toks[0 .. n) in slots [0, n) exactly as a fresh
 * forward over them writes it (the first n_first tokens in one batch, the rest in batches of
 * at most SD_MAX_DRAFT + 1); `who` and `step` name a failure (SD_ERR_INTERNAL). */
sd_status sd_spec_check_cache(sd_model *m, const sd_kv_cache *kv, const int32_t *toks, int n,
                              int n_first, const char *who, int step);

#endif /* SD_LOOP_H */
