/* model_tree.h — tree drafting with a model (a draft model, or the target's first layers), for
 * sd_draft_params.branching > 1: EAGLE-2's dynamic tree (Li et al. 2024), one tree-masked draft
 * forward per depth, and the draft cache's accepted path compacted after the verify. */
#ifndef SD_MODEL_TREE_H
#define SD_MODEL_TREE_H

#include "spec/drafter.h"
#include "spec/loop.h"

/* How a tree's nodes reach a draft that is more than a model over the text's tokens (an EAGLE
 * head, whose rows read features and lag the text by one position): fd in
 * sd_model_tree_propose, NULL for a draft model. */
typedef struct {
    /* Feeds what the draft lacks of L's text, its last row the root's, and writes the root's
     * logits (V, the target's ids); *prefix receives the draft cache's length after it (the
     * slots every node sees before its ancestors), or 0 when there is nothing to draft from. */
    sd_status (*root)(void *ctx, sd_spec_loop *L, float *logits, int *prefix);
    /* Feeds the nodes of b (tokens, positions, slots, mask; n_logits = every row), which become
     * fed nodes first .. first + n - 1; parent_fed[j] is the fed index of node j's parent (0:
     * the root). Writes their logits (n, V). */
    sd_status (*nodes)(void *ctx, const sd_batch *b, const int *parent_fed, int first,
                       float *logits);
    void *ctx;
    /* A draft over its own vocabulary (an EAGLE-3 head's: usually fewer ids than the target's,
     * in any order), or NULL: at temperature 0 both callbacks then write rows of n_ids logits,
     * entry d the logit of target id ids[d], instead of V (the tree reads a row's best tokens
     * and softmax over its n_ids entries alone; the target ids outside it would be -inf). When
     * sampling the rows are always V wide, in the target's order. */
    const int32_t *ids;
    int n_ids;
} sd_tree_feeder;

/* A request's tree drafting: buffers sized for the sequence L (its vocabulary, sampling and
 * capacity), and the last proposal (tokens, parents, and each node's slot in the draft cache). */
typedef struct sd_model_tree sd_model_tree;

sd_status sd_model_tree_create(sd_model_tree **out, const sd_draft_params *dp,
                               const sd_spec_loop *L);
void sd_model_tree_free(sd_model_tree *t);

/* Drafts a tree after L's text with dm (its first n_layers layers; 0 = all) over the cache
 * dkv, which holds a prefix of L->hist (at most all but the last token): one forward feeds the
 * tokens dkv lacks (the last one, the root, among them), then each depth's expanded nodes are
 * fed in one forward with a tree mask, node x at position len - 1 + depth(x) in slot len + (its
 * rank among the fed nodes), seeing the prefix, its ancestors and itself. The tree lies within
 * sd_spec_tree_room, dp->k deep, at most dp->nodes nodes (sd_draft_params.branching says how it
 * is grown and cut). out receives it; when sampling, L->q row i is the processed distribution
 * node i was drawn from (its parent's, as the tree rule wants), else out->q is NULL (the
 * children are deterministic). dkv then holds the fed nodes past the text. cost (or NULL): at
 * temperature 0 keep only the most probable nodes that pay on it (sd_tree_size over the path
 * probabilities scaled by how they bore out over the request; at least one every fourth step),
 * and no deeper draft forward when its nodes could not pay for its measured time; when
 * sampling, draw only as many nodes as pay by how deep this request's accepted paths have
 * reached, with the drafting's cost as timed over the request's earlier steps counted beside
 * the verify's, decided before the step's draws. */
sd_status sd_model_tree_propose(sd_model_tree *t, sd_spec_loop *L, sd_model *dm, sd_kv_cache *dkv,
                                int n_layers, const sd_draft_params *dp, const sd_tree_feeder *fd,
                                const sd_cost_curve *cost, sd_draft *out);

/* Counts the last proposal's outcome (how deep its accepted path reached, from how far L's text
 * grew since) into the per-depth statistics that size sampled trees, once; the next proposal
 * does it when not done before, so a step drafted otherwise (EAGLE's lookup) calls it first. */
void sd_model_tree_settle(sd_model_tree *t, const sd_spec_loop *L);

/* The verify costs a tree is sized by this step: with dp->size_by_cost, d's curve (measured on L's
 * target at its first use: sd_cost_curve_measure) copied into buf and *out = buf; else *out = NULL.
 */
sd_status sd_model_tree_costs(const sd_drafter *d, const sd_draft_params *dp, sd_spec_loop *L,
                              sd_cost_curve *buf, const sd_cost_curve **out);

/* After the verify kept n_acc nodes (L->hist now holds their tokens after the proposal's root):
 * the fed nodes of the accepted path, a prefix of it, move into consecutive slots after the
 * root, and dkv keeps the text up to the last of them (at most all but the last token). */
sd_status sd_model_tree_commit(sd_model_tree *t, const sd_spec_loop *L, sd_kv_cache *dkv,
                               int n_acc);

#endif /* SD_MODEL_TREE_H */
