/* verify.c — logits processing and the accept/reject rule of speculative sampling, as small pure
 * functions (see verify.h for the rule). Everything is deterministic given the uniforms. */
#include "spec/verify.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops_cpu.h"
#include "spec/sampler.h"
#include "util/hd.h"
#include "util/status.h"

sd_sampling sd_sampling_default(void) {
    sd_sampling s;
    s.temperature = 0.0f;
    s.top_k = 0;
    s.top_p = 1.0f;
    s.min_p = 0.0f;
    return s;
}

sd_status sd_sampling_check(const sd_sampling *s) {
    if (!(s->temperature >= 0.0f) || isinf(s->temperature)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "temperature must be >= 0 and finite, got %g",
                            (double)s->temperature);
    }
    if (s->top_k < 0) {
        return sd_set_error(SD_ERR_INVALID_ARG, "top_k must be >= 0 (0 = off), got %d", s->top_k);
    }
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "top_p must be in (0, 1], got %g",
                            (double)s->top_p);
    }
    if (!(s->min_p >= 0.0f && s->min_p < 1.0f)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "min_p must be in [0, 1), got %g",
                            (double)s->min_p);
    }
    return SD_OK;
}

/* qsort's comparator takes no context: the probabilities it orders by are this thread's. */
static __thread const float *g_sort_p;

static int by_prob_desc(const void *a, const void *b) {
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    const float pi = g_sort_p[i], pj = g_sort_p[j];
    if (pi != pj) {
        return pi > pj ? -1 : 1;
    }
    return i < j ? -1 : i > j;
}

/* ids[0 .. n), in increasing order, sorted by decreasing p[id] with equal values kept in id
 * order (by_prob_desc's order) in four stable passes of a radix sort over the complemented bits
 * of p (non-negative floats order as their bits), through tmp (n ints); a pass whose byte is
 * the same for every id is skipped. A sort of thousands of candidates (top-p over a flat row)
 * took qsort a few hundred microseconds. */
static void sort_by_prob(int32_t *ids, int32_t *tmp, int n, const float *p) {
    int32_t *src = ids, *dst = tmp;
    for (int shift = 0; shift < 32; shift += 8) {
        int at[257] = {0};
        for (int i = 0; i < n; i++) {
            uint32_t b;
            memcpy(&b, &p[src[i]], sizeof(b));
            at[1 + ((~b >> shift) & 0xFFu)]++;
        }
        int same = 0;
        for (int d = 1; d <= 256; d++) {
            same |= at[d] == n;
            at[d] += at[d - 1];
        }
        if (same) {
            continue;
        }
        for (int i = 0; i < n; i++) {
            uint32_t b;
            memcpy(&b, &p[src[i]], sizeof(b));
            dst[at[(~b >> shift) & 0xFFu]++] = src[i];
        }
        int32_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != ids) {
        memcpy(ids, src, (size_t)n * sizeof(int32_t));
    }
}

/* Top-k up to this many is chosen by one pass of insertions (top_k_of); larger k by the
 * threshold search and a sort. */
#define TOP_K_SELECT 256

/* The k largest of p (V) by decreasing value, ties to the lower id, into top[0 .. k) (k < V):
 * one pass in order of id, each value inserted after those at least as large (all of lower
 * id); once k are held, a run of 16 with none above the k-th is skipped. */
static void top_k_of(int32_t *top, const float *p, int V, int k) {
    int n = 0;
    for (int b = 0; b < V; b += 16) {
        const int e = b + 16 < V ? b + 16 : V;
        if (n == k) {
            const float kth = p[top[k - 1]];
            int any = 0;
            for (int i = b; i < e; i++) {
                any |= p[i] > kth;
            }
            if (!any) {
                continue;
            }
        }
        for (int i = b; i < e; i++) {
            const float x = p[i];
            if (n == k && !(x > p[top[k - 1]])) {
                continue;
            }
            int j = n < k ? n++ : k - 1;
            for (; j > 0 && x > p[top[j - 1]]; j--) {
                top[j] = top[j - 1];
            }
            top[j] = i;
        }
    }
}

void sd_process_logits(float *probs, const float *logits, int V, const sd_sampling *s,
                       int32_t *work) {
    if (s->temperature == 0.0f) {
        const int best = sd_argmax(logits, V);
        for (int i = 0; i < V; i++) {
            probs[i] = 0.0f;
        }
        probs[best] = 1.0f;
        return;
    }
    /* softmax(logits / T), the exponentials in float (sd_hd_expf's arithmetic, vectorised), the
     * normaliser in double */
    const float mx = logits[sd_argmax(logits, V)];
    const float inv = (float)(1.0 / sd_softmax_exp(probs, logits, V, mx, s->temperature));
    for (int i = 0; i < V; i++) {
        probs[i] *= inv;
    }
    const int filter = (s->top_k > 0 && s->top_k < V) || s->top_p < 1.0f || s->min_p > 0.0f;
    if (!filter) {
        return;
    }
    /* the candidates by decreasing probability (ties: lower id first). Only the head of the
     * order matters, so sort just the tokens above a threshold, lowering it 32-fold until they
     * hold enough mass for top-p and enough tokens for top-k (a full sort of a 50k vocabulary per
     * token would cost more than the forward pass; a 1000-fold step left thousands of tokens to
     * sort where a hundred were needed); every filter that is on drops the rest */
    const float pmax = probs[sd_argmax(probs, V)];
    const int top_k_on = s->top_k > 0 && s->top_k < V;
    const int need_k = top_k_on ? s->top_k : 1;
    /* (a hair more than top_p: this mass is summed in another order than the cut's below, which
     * must find its prefix among the candidates) */
    const double need_mass = s->top_p < 1.0f ? s->top_p * (1.0 + 1e-6) : 0.0;
    int nc = 0;
    for (float t = pmax * 1e-3f; !(top_k_on && s->top_k <= TOP_K_SELECT); t *= 0.03125f) {
        nc = 0;
        for (int b = 0; b < V; b += 16) { /* a run of 16 with none above t is skipped */
            const int e = b + 16 < V ? b + 16 : V;
            int any = 0;
            for (int i = b; i < e; i++) {
                any |= probs[i] >= t;
            }
            for (int i = b; any && i < e; i++) { /* no branch: which tokens pass is random */
                work[nc] = i;
                nc += probs[i] >= t;
            }
        }
        double mass = 0.0, m[4] = {0.0, 0.0, 0.0, 0.0}; /* only decides whether to go on */
        int j = 0;
        for (; j + 4 <= nc; j += 4) {
            for (int l = 0; l < 4; l++) {
                m[l] += probs[work[j + l]];
            }
        }
        for (; j < nc; j++) {
            mass += probs[work[j]];
        }
        mass += (m[0] + m[1]) + (m[2] + m[3]);
        /* with top-k on, top-p and min-p cut within the k largest: those are all it needs */
        const int enough =
            nc >= need_k &&
            (top_k_on || (mass >= need_mass && (s->min_p <= 0.0f || t <= s->min_p * pmax)));
        if (enough || nc == V || t == 0.0f) {
            break;
        }
    }
    if (top_k_on && s->top_k <= TOP_K_SELECT) {
        top_k_of(work, probs, V, s->top_k);
        nc = s->top_k;
    } else if (2 * (int64_t)nc <= V) { /* the rest of work holds the radix sort's copy */
        sort_by_prob(work, work + nc, nc, probs);
    } else {
        g_sort_p = probs;
        qsort(work, (size_t)nc, sizeof(int32_t), by_prob_desc);
    }
    int keep = nc;
    if (s->top_k > 0 && s->top_k < keep) {
        keep = s->top_k;
    }
    if (s->top_p < 1.0f) {
        /* the smallest prefix holding top_p of the mass that top-k left (all of it if off) */
        double total = 0.0, mass = 0.0;
        if (s->top_k > 0 && s->top_k < V) {
            for (int r = 0; r < keep; r++) {
                total += probs[work[r]];
            }
        } else {
            total = sd_sum_f32(probs, V);
        }
        int r = 0;
        while (r < keep) {
            mass += probs[work[r]];
            r++;
            if (mass >= s->top_p * total) {
                break;
            }
        }
        keep = r;
    }
    if (s->min_p > 0.0f) {
        const float floor_p = s->min_p * pmax;
        int r = 1;
        while (r < keep && probs[work[r]] >= floor_p) {
            r++;
        }
        keep = r;
    }
    double kept = 0.0;
    for (int r = 0; r < keep; r++) {
        kept += probs[work[r]];
        probs[work[r]] = -probs[work[r]]; /* mark the kept tokens */
    }
    for (int i = 0; i < V; i++) { /* the rest to 0, the kept ones still marked */
        probs[i] = probs[i] < 0.0f ? probs[i] : 0.0f;
    }
    for (int r = 0; r < keep; r++) {
        const float v = probs[work[r]];
        probs[work[r]] = v < 0.0f ? (float)(-v / kept) : 0.0f;
    }
}

/* Blocks of the scan below: a block whose sum takes the running sum past the target is walked
 * token by token, the others are added whole. */
#define SAMPLE_BLOCK 256

int sd_sample_probs(const float *p, int V, double u) {
    const double target = u * sd_sum_f32(p, V);
    double acc = 0.0;
    for (int b = 0; b < V; b += SAMPLE_BLOCK) {
        const int e = b + SAMPLE_BLOCK < V ? b + SAMPLE_BLOCK : V;
        const double s = sd_sum_f32(p + b, e - b);
        if (!(acc + s > target)) {
            acc += s;
            continue;
        }
        for (int i = b; i < e; i++) { /* the crossing is here, unless rounding says otherwise */
            if (p[i] > 0.0f) {
                acc += p[i];
                if (acc > target) {
                    return i;
                }
            }
        }
    }
    for (int i = V - 1; i > 0; i--) { /* none crossed: the last token of nonzero probability */
        if (p[i] > 0.0f) {
            return i;
        }
    }
    return 0;
}

int sd_accept(const float *p, const float *q, int d, double u) {
    const double qd = q != NULL ? q[d] : 1.0;
    return u * qd < (double)p[d];
}

int sd_sample_residual(const float *p, const float *q, int d, int V, double u, float *work) {
    int mass = 0; /* whether max(0, p - q) has any */
    if (q != NULL) {
        for (int i = 0; i < V; i++) {
            const float r = p[i] - q[i];
            work[i] = r > 0.0f ? r : 0.0f;
            mass |= r > 0.0f;
        }
    } else { /* q one-hot at d: p without d */
        for (int i = 0; i < V; i++) {
            work[i] = p[i] > 0.0f ? p[i] : 0.0f;
            mass |= p[i] > 0.0f && i != d;
        }
        const float r = p[d] - 1.0f;
        work[d] = r > 0.0f ? r : 0.0f;
    }
    return sd_sample_probs(mass ? work : p, V, u);
}

int sd_verify_chain(int32_t *next, const float *p, const float *q, const int32_t *draft, int K,
                    int V, const double *u_accept, const double *u_next, float *work) {
    for (int k = 0; k < K; k++) {
        const float *pk = p + (size_t)k * (size_t)V;
        const float *qk = q != NULL ? q + (size_t)k * (size_t)V : NULL;
        if (!sd_accept(pk, qk, draft[k], u_accept[k])) {
            *next = sd_sample_residual(pk, qk, draft[k], V, u_next[k], work);
            return k;
        }
    }
    *next = sd_sample_probs(p + (size_t)K * (size_t)V, V, u_next[K]);
    return K;
}

/* Rejecting child token t at a node: the current p (sum P) and, for sampled children, q (sum
 * Q) lose t as the rule says. P and Q stay 1 until the node's first rejection, so a node's first
 * test and residual are the chain rule's to the bit (sd_accept, sd_sample_residual). */
static void tree_reject(float *cp, double *P, float *cq, double *Q, int t, int V) {
    const double p_sum = *P, q_sum = *Q;
    if (cq == NULL) { /* deterministic: p(t) <- 0 */
        cp[t] = 0.0f;
    } else { /* sampled: p <- max(0, p/P - q/Q), unless that has no mass (no p/P above q/Q) */
        int mass = 0;
        for (int i = 0; i < V && !mass; i++) {
            mass = cp[i] / p_sum > cq[i] / q_sum;
        }
        if (mass && p_sum == 1.0 && q_sum == 1.0) {
            for (int i = 0; i < V; i++) {
                const float r = cp[i] - cq[i];
                cp[i] = r > 0.0f ? r : 0.0f;
            }
        } else if (mass) {
            for (int i = 0; i < V; i++) {
                const float r = (float)(cp[i] / p_sum - cq[i] / q_sum);
                cp[i] = r > 0.0f ? r : 0.0f;
            }
        }
        cq[t] = 0.0f;
        *Q = sd_sum_f32(cq, V);
    }
    *P = sd_sum_f32(cp, V);
}

typedef struct {
    const float *p;
    int V;
} rows_of_p;

static const float *row_of_p(void *ctx, int r) {
    const rows_of_p *a = ctx;
    return a->p + (size_t)r * (size_t)a->V;
}

int sd_verify_tree(int32_t *path, int32_t *next, const int32_t *tokens, const int32_t *parent,
                   int n, const float *p, const float *q, int V, const double *u_accept,
                   const double *u_next, float *work) {
    rows_of_p a = {p, V};
    return sd_verify_tree_rows(path, next, tokens, parent, n, row_of_p, &a, q, V, u_accept, u_next,
                               work);
}

int sd_verify_tree_rows(int32_t *path, int32_t *next, const int32_t *tokens, const int32_t *parent,
                        int n, const float *(*row)(void *ctx, int r), void *ctx, const float *q,
                        int V, const double *u_accept, const double *u_next, float *work) {
    float *cp = work, *cq = q != NULL ? work + V : NULL;
    int node = -1, n_acc = 0;
    memcpy(cp, row(ctx, 0), (size_t)V * sizeof(float));
    double P = 1.0;
    for (;;) {
        int acc = -1, first = 1;
        double Q = 1.0;
        for (int c = node + 1; c < n && acc < 0; c++) {
            if (parent[c] != node) {
                continue;
            }
            const int t = tokens[c];
            if (cq != NULL && first) {
                memcpy(cq, q + (size_t)c * (size_t)V, (size_t)V * sizeof(float));
            }
            first = 0;
            /* u < p'(t) / q'(t) with p' = cp / P and q' = cq / Q (q' one-hot at t without q) */
            const double qt = cq != NULL ? (double)cq[t] * P : P;
            const double pt = cq != NULL ? (double)cp[t] * Q : (double)cp[t];
            if (P == 1.0 && Q == 1.0 ? sd_accept(cp, cq, t, u_accept[c]) : u_accept[c] * qt < pt) {
                acc = c;
            } else {
                tree_reject(cp, &P, cq, &Q, t, V);
            }
        }
        if (acc < 0) {
            *next = sd_sample_probs(cp, V, u_next[n_acc]);
            return n_acc;
        }
        path[n_acc++] = acc;
        node = acc;
        memcpy(cp, row(ctx, 1 + acc), (size_t)V * sizeof(float));
        P = 1.0;
    }
}

int sd_verify_synthetic(int K, double alpha, uint64_t seed, uint64_t pos0) {
    int n = 0;
    while (n < K && sd_rng_uniform(seed, SD_STREAM_SYNTH, pos0 + (uint64_t)n) < alpha) {
        n++;
    }
    return n;
}
