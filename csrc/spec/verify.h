/* verify.h — the rules of speculative sampling (Leviathan et al. 2023; Chen et al. 2023) as pure
 * functions over probability arrays: processing logits into the distribution a token is drawn
 * from, drawing with a given uniform number, and accepting or correcting draft tokens so that
 * every emitted token is distributed exactly as the target's processed distribution.
 *
 * The chain rule, for draft tokens d1..dK drawn from draft distributions q1..qK and target
 * distributions p1..pK+1 (all processed the same way):
 *   for k = 1..K: p(dk) >= q(dk): accept; else accept with probability p(dk) / q(dk);
 *                 on the first rejection emit a token drawn from norm(max(0, pk - qk)) and stop;
 *   if all K are accepted, emit a bonus token drawn from pK+1.
 * A drafter without probabilities (n-gram lookup) proposes deterministically: q = one-hot(dk).
 * Randomness is an argument: each call takes the uniform numbers it uses. */
#ifndef SD_VERIFY_H
#define SD_VERIFY_H

#include <stdint.h>

#include "specdec.h"

/* What turns logits into the distribution a token is drawn from. Applied in this order:
 * temperature, top-k, top-p, min-p; then renormalised. temperature 0 is greedy: a one-hot
 * distribution at the argmax (lowest id on ties), the other settings ignored. */
typedef struct {
    float temperature; /* >= 0 */
    int top_k;         /* keep the k most probable tokens; 0 = off */
    float top_p;       /* keep the smallest most-probable set with mass >= top_p; 1 = off */
    float min_p;       /* drop tokens below min_p * (largest probability); 0 = off */
} sd_sampling;

sd_sampling sd_sampling_default(void); /* greedy */

/* SD_ERR_INVALID_ARG naming the parameter when one is outside its domain. */
sd_status sd_sampling_check(const sd_sampling *s);

/* probs (V) = the processed distribution of logits (V). work: V ints of scratch. Ties in the
 * ordering of top-k/top-p go to the lower id. */
void sd_process_logits(float *probs, const float *logits, int V, const sd_sampling *s,
                       int32_t *work);

/* The token the uniform u in [0, 1) selects from distribution p (V) by inverting its cumulative
 * sum (the total and the sums of blocks of 256 added as sd_sum_f32 adds, the block where u
 * falls token by token: the same draw from every kernel); a u beyond the (rounded) total
 * selects the last token of nonzero probability. */
int sd_sample_probs(const float *p, int V, double u);

/* 1 if draft token d, drawn from q, is accepted against p with the uniform u: u * q[d] < p[d],
 * i.e. with probability min(1, p[d] / q[d]). q NULL: the draft was deterministic (q = one-hot). */
int sd_accept(const float *p, const float *q, int d, double u);

/* After rejecting d: a token from norm(max(0, p - q)) with the uniform u (q NULL: one-hot(d)).
 * work: V floats of scratch. If the residual has no mass (p <= q everywhere), p itself. */
int sd_sample_residual(const float *p, const float *q, int d, int V, double u, float *work);

/* The chain rule above over K draft tokens. p: (K + 1, V); q: (K, V) or NULL; draft: (K);
 * u_accept: (K) uniforms for the acceptance tests; u_next: (K + 1) uniforms, u_next[n] drawing
 * the token emitted after n accepted drafts (so a decoding loop can key each uniform by the
 * output position it decides, and never reuse one). Returns the number of accepted drafts n
 * (0..K) and sets *next to the token emitted after them. work: V floats. */
int sd_verify_chain(int32_t *next, const float *p, const float *q, const int32_t *draft, int K,
                    int V, const double *u_accept, const double *u_next, float *work);

/* The most nodes a draft tree may have (sd_verify_tree). */
#define SD_MAX_TREE SD_MAX_TREE_NODES

/* The tree rule: one walk from the root over a tree of n draft nodes, so that the emitted tokens
 * are distributed exactly as the target's (recursive rejection sampling, Jeon et al. 2024, for
 * sampled children; Luo et al. 2024 and SpecInfer for deterministic ones). Node i holds token
 * tokens[i] and has parent parent[i] < i (-1: the root, the text's last token); siblings are
 * tried in index order and must hold distinct tokens.
 *   p: (n + 1, V) processed target distributions: row 0 at the root, row 1 + i after node i.
 *   q: (n, V) or NULL. With q, a node's children were drawn without replacement from one draft
 *      distribution, given as the row of each of them (its first child's row is read); without
 *      q, children are deterministic (top candidates, lookup, recycling).
 * At a node with current distribution p (and draft distribution q), for each child c in turn:
 *   sampled:       accept with min(1, p(c) / q(c)); on rejection p <- norm(max(0, p - q)) (left
 *                  as it is when that has no mass) and q <- q without c, renormalised;
 *   deterministic: accept with probability p(c); on rejection p(c) <- 0, renormalised.
 * An accepted child becomes the node, with its own row of p; when no child is accepted (or the
 * node has none) the next token is drawn from the current p.
 * u_accept: (n) the coin of node i (used at most once); u_next: (depth + 1) u_next[a] draws the
 * token emitted after a accepted nodes. path: (depth) receives the accepted nodes, root to leaf;
 * returns their count and sets *next. work: 2 V floats. For a chain (parent[i] = i - 1) this is
 * sd_verify_chain, bit for bit. */
int sd_verify_tree(int32_t *path, int32_t *next, const int32_t *tokens, const int32_t *parent,
                   int n, const float *p, const float *q, int V, const double *u_accept,
                   const double *u_next, float *work);
/* sd_verify_tree with the rows of p asked for as the walk reaches them: row(ctx, r) returns
 * processed row r (0 the root's, 1 + i node i's), so a caller can process only the rows of the
 * accepted path and the root (all of them, as in p, give the same result). */
int sd_verify_tree_rows(int32_t *path, int32_t *next, const int32_t *tokens, const int32_t *parent,
                        int n, const float *(*row)(void *ctx, int r), void *ctx, const float *q,
                        int V, const double *u_accept, const double *u_next, float *work);

/* The synthetic acceptance of benchmarks (sd_bench_synthetic): the drafts a drafter accepted
 * with probability alpha each would keep, the uniforms keyed by (seed, SD_STREAM_SYNTH, output
 * position pos0 + i); at most K. */
int sd_verify_synthetic(int K, double alpha, uint64_t seed, uint64_t pos0);

#endif /* SD_VERIFY_H */
