/* loop.c — the speculative loop: one step on one sequence (propose, verify, accept, commit;
 * loop.h) for any drafter (drafter.h), on the CPU and on a CUDA target, stepped by sequence.c;
 * the services drafters share; and the synthetic-acceptance benchmark. */
#include "spec/loop.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops_cpu.h"
#include "model/forward.h"
#include "spec/drafters/lookup_history.h"
#include "spec/sampler.h"
#include "util/hd.h"
#include "util/status.h"

/* ---- the sequence -------------------------------------------------------------------------- */

/* The first n_first tokens go in one batch as the loop's prefill did (a long prefill may take
 * other kernels on a GPU); the rest in batches of at most SD_MAX_DRAFT + 1, which, the kernels'
 * results not depending on the batch size, is bit for bit what any sequence of correct steps
 * leaves. */
sd_status sd_spec_check_cache(sd_model *m, const sd_kv_cache *kv, const int32_t *toks, int n,
                              int n_first, const char *who, int step) {
    if (kv->length != n) {
        return sd_set_error(SD_ERR_INTERNAL,
                            "cache check after step %d: the %s cache holds %d slots, expected %d",
                            step, who, kv->length, n);
    }
    if (n == 0) {
        return SD_OK;
    }
    sd_kv_cache *fresh = NULL;
    SD_TRY(sd_kv_cache_create(&fresh, m, n));
    sd_status st = SD_OK;
    if (fresh->f16 != kv->f16) {
        st = sd_set_error(SD_ERR_INVALID_ARG,
                          "cache check after step %d: the model's KV cache type changed during "
                          "the call",
                          step);
    }
    for (int done = 0; st == SD_OK && done < n;) {
        sd_batch b = {0};
        const int chunk = n - done < SD_MAX_DRAFT + 1 ? n - done : SD_MAX_DRAFT + 1;
        b.n_tokens = done == 0 && n_first > 0 ? (n_first < n ? n_first : n) : chunk;
        b.tokens = toks + done;
        st = sd_forward(m, fresh, &b, NULL);
        done += b.n_tokens;
    }
    const void *ka = kv->k, *va = kv->v, *kf = fresh->k, *vf = fresh->v;
    /* a host cache's heads are kv->stride slots apart, its keys in tiles; a downloaded one's
     * capacity slots apart, its keys in rows */
    size_t sa = (size_t)kv->stride, sf = (size_t)fresh->stride;
    int tiled = 1;
    float *dl = NULL;
#ifdef SD_WITH_CUDA
    if (st == SD_OK && kv->cuda != NULL) { /* both caches to the host */
        const size_t floats = (size_t)kv->n_layers * (size_t)kv->n_kv_heads * (size_t)kv->head_dim;
        dl = malloc(2 * floats * ((size_t)kv->capacity + (size_t)fresh->capacity) * sizeof(float));
        if (dl == NULL) {
            st = sd_set_error(SD_ERR_NOMEM, "out of memory in the cache check");
        } else {
            float *k1 = dl, *v1 = k1 + floats * (size_t)kv->capacity;
            float *k2 = v1 + floats * (size_t)kv->capacity,
                  *v2 = k2 + floats * (size_t)fresh->capacity;
            st = sd_cuda_cache_download(kv->cuda, k1, v1);
            if (st == SD_OK) {
                st = sd_cuda_cache_download(fresh->cuda, k2, v2);
            }
            ka = k1;
            va = v1;
            kf = k2;
            vf = v2;
            sa = (size_t)kv->capacity;
            sf = (size_t)fresh->capacity;
            tiled = 0;
        }
    }
#endif
    /* the same model: both caches hold the same element type (f32 when downloaded) */
    const size_t elt = sd_kv_elt(kv), Dh = (size_t)kv->head_dim, row = Dh * elt;
    for (int l = 0; st == SD_OK && l < kv->n_layers * kv->n_kv_heads; l++) {
        /* where head l begins in each */
        const char *ha = (const char *)ka + (size_t)l * sa * row;
        const char *hf = (const char *)kf + (size_t)l * sf * row;
        for (int i = 0; i < n; i++) {
            const size_t a = ((size_t)l * sa + (size_t)i) * row;
            const size_t f = ((size_t)l * sf + (size_t)i) * row;
            int same = memcmp((const char *)va + a, (const char *)vf + f, row) == 0 &&
                       kv->pos[i] == fresh->pos[i];
            for (size_t d = 0; same && d < Dh; d++) {
                const size_t at = tiled ? sd_key_at(i, (int)d, (int)Dh) : (size_t)i * Dh + d;
                same = memcmp(ha + at * elt, hf + at * elt, elt) == 0;
            }
            if (!same) {
                st = sd_set_error(SD_ERR_INTERNAL,
                                  "cache check after step %d: the %s cache's slot %d (token %d) "
                                  "differs from a fresh forward in layer %d",
                                  step, who, i, (int)toks[i], l / kv->n_kv_heads);
                break;
            }
        }
    }
    free(dl);
    sd_kv_cache_free(fresh);
    return st;
}

sd_status sd_spec_loop_begin(sd_spec_loop *L, sd_model *m, const int32_t *prompt, int n_prompt,
                             const sd_generate_params *p, const sd_sampling *s, int K, int ctx,
                             int draft_rows, int32_t *out, sd_spec_stats *ss, double t_start,
                             sd_kv_cache *kv, int reused) {
    const int V = m->cfg.vocab_size;
    memset(L, 0, sizeof(*L));
    L->kv = kv;
    L->pf.fed = reused;
    L->capacity = sd_spec_capacity(n_prompt, p->max_new_tokens, K, ctx);
    L->m = m;
    L->s = *s;
    L->seed = p->seed;
    L->n_prompt = n_prompt;
    L->len = n_prompt;
    L->ss = ss;
    L->t_start = t_start;
    L->check_cache = p->check_cache;
    L->p = p;
    L->max_nodes = K;
    sd_emitter_init(&L->e, m, p, out);
    SD_TRY(sd_emitter_want_logprobs(&L->e));
    SD_TRY(sd_emitter_want_penalties(&L->e, prompt, n_prompt));
    L->hist = malloc((size_t)(n_prompt + p->max_new_tokens) * sizeof(int32_t));
    L->batch = malloc((size_t)(K + 1) * sizeof(int32_t));
    L->chain = malloc((size_t)K * sizeof(int32_t));
    if (L->hist == NULL || L->batch == NULL || L->chain == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < K; i++) {
        L->chain[i] = i - 1;
    }
#ifdef SD_WITH_CUDA
    if (m->cuda != NULL) { /* rows and distributions live on the device */
        SD_TRY(sd_cuda_spec_create(&L->sp, m->cuda, K));
        draft_rows = -1;
    }
#endif
    if (draft_rows >= 0) {
        L->logits = malloc((size_t)(K + 1) * (size_t)V * sizeof(float));
        L->probs = malloc((size_t)(K + 1) * (size_t)V * sizeof(float));
        L->fwork = malloc(2 * (size_t)V * sizeof(float)); /* the tree rule takes 2 V */
        L->iwork = malloc((size_t)V * sizeof(int32_t));
        if (draft_rows) {
            L->q = malloc((size_t)K * (size_t)V * sizeof(float));
            L->dlog = malloc((size_t)V * sizeof(float));
        }
        if (L->logits == NULL || L->probs == NULL || L->fwork == NULL || L->iwork == NULL ||
            (draft_rows && (L->q == NULL || L->dlog == NULL))) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory");
        }
    }
    memcpy(L->hist, prompt, (size_t)n_prompt * sizeof(int32_t));
    return kv != NULL ? SD_OK
                      : sd_kv_cache_create(&L->kv, m,
                                           sd_spec_capacity(n_prompt, p->max_new_tokens, K, ctx));
}

int sd_spec_capacity(int n_prompt, int max_new_tokens, int K, int ctx) {
    const int total = n_prompt + max_new_tokens;
    return total + K < ctx ? total + K : ctx;
}

/* The prompt is in: the drafter begins its request. */
static sd_status begin_drafter(sd_spec_loop *L) {
    if (L->d != NULL && !L->begun) {
        L->begun = 1;
        L->draft_cost = L->d->ops->cost(L->d, L->m);
        SD_TRY(L->d->ops->begin(L->d, &L->dstate, L));
    }
    return SD_OK;
}

sd_status sd_spec_prefill(sd_spec_loop *L, int *ready) {
    SD_TRY(sd_prefill_step(&L->pf, L->m, L->kv, L->hist, L->n_prompt - 1, NULL));
    *ready = L->pf.fed >= L->n_prompt - 1;
    return *ready ? begin_drafter(L) : SD_OK;
}

sd_status sd_spec_loop_end(sd_spec_loop *L, sd_status st, int *n_out, sd_finish_reason *reason) {
    *n_out = L->e.n;
    if (reason != NULL) {
        *reason = L->e.reason;
    }
    L->ss->time_total_s = sd_now_s() - L->t_start;
#ifdef SD_WITH_CUDA
    sd_cuda_spec_free(L->sp);
#endif
    if (L->d != NULL && L->begun) {
        L->d->ops->end(L->d, L->dstate);
        if (L->d->history != NULL && L->len > L->n_prompt) { /* for the drafter's next requests */
            sd_lookup_history_add(L->d->history, L->hist + L->n_prompt, L->len - L->n_prompt);
        }
    }
    sd_kv_cache_free(L->kv);
    free(L->hist);
    free(L->batch);
    free(L->chain);
    free(L->logits);
    free(L->probs);
    free(L->fwork);
    free(L->iwork);
    free(L->q);
    free(L->dlog);
    free(L->tmask);
    free(L->row_top);
    free(L->feat);
    free(L->feat_pool);
    free(L->fbuf);
    sd_emitter_free(&L->e);
    return st;
}

int sd_spec_room(const sd_spec_loop *L) {
    const int K = L->max_nodes;
    int k = L->p->max_new_tokens - L->e.n - 1;
    k = k < K ? k : K;
    k = k < L->capacity - L->len ? k : L->capacity - L->len;
    return k < 0 ? 0 : k;
}

int sd_spec_tree_room(const sd_spec_loop *L, int *depth) {
    int d = L->p->max_new_tokens - L->e.n - 1;
    *depth = d < 0 ? 0 : d;
    int n = L->max_nodes < L->capacity - L->len ? L->max_nodes : L->capacity - L->len;
    /* The nodes take slots len .. len + n - 1, their ranks among the slots a node sees are
     * len .. len + depth - 1; both must lie in the same run of SD_ATTN_CHUNK slots for the
     * attention to give a node the bits of a sequence (ops_cpu.h), so no run starts inside. */
    const int next_run = (L->len / SD_ATTN_CHUNK + 1) * SD_ATTN_CHUNK;
    n = n < next_run - L->len ? n : next_run - L->len;
    return n < 0 || *depth == 0 ? 0 : n;
}

/* sd_spec_accept for k nodes of a tree of depth[i] (NULL: a chain, node i at depth i + 1): the
 * per-position counts are per depth. */
static sd_status spec_accept_tree(sd_spec_loop *L, int k, const int *depth, int n_acc,
                                  int32_t next) {
    const int V = L->m->cfg.vocab_size;
    sd_spec_stats *ss = L->ss;
    ss->steps++;
    ss->drafted += k;
    ss->accepted += n_acc;
    for (int i = 0; i < k; i++) {
        const int d = depth != NULL ? depth[i] - 1 : i;
        if (d < SD_MAX_DRAFT) {
            ss->drafted_at[d]++;
        }
    }
    for (int i = 0; i < n_acc && i < SD_MAX_DRAFT; i++) {
        ss->accepted_at[i]++;
    }
    if (k >= 0 && k <= SD_MAX_TREE_NODES && n_acc >= 0 && n_acc <= k) {
        ss->steps_by_nodes[k]++;
        ss->steps_by_accepted[n_acc]++;
    }
    for (int i = 0; i <= n_acc && !L->e.done; i++) {
        const int32_t tok = i < n_acc ? L->batch[1 + i] : next;
        L->hist[L->len++] = tok;
        SD_TRY(sd_emit(&L->e, tok,
                       L->e.logprobs ? L->logits + (size_t)L->emit_row[i] * (size_t)V : NULL));
    }
    /* roll back: keep last + the accepted drafts that were emitted */
    SD_TRY(sd_kv_cache_set_length(L->kv, L->len - 1));
    return L->check_cache ? sd_spec_check_cache(L->m, L->kv, L->hist, L->len - 1, L->n_prompt - 1,
                                                "target", ss->steps)
                          : SD_OK;
}

/* A chain's kept tokens come from rows 0 .. n_acc. */
static void chain_emit_rows(sd_spec_loop *L, int n_acc) {
    for (int i = 0; i <= n_acc; i++) {
        L->emit_row[i] = i;
    }
}

sd_status sd_spec_accept(sd_spec_loop *L, int k, int n_acc, int32_t next) {
    chain_emit_rows(L, n_acc);
    return spec_accept_tree(L, k, NULL, n_acc, next);
}

/* ---- the target's features, for drafters that read them ----------------------------------- */

const float *sd_spec_features(const sd_spec_loop *L, int pos) {
    return L->feat + (size_t)pos * (size_t)L->feat_w;
}

/* The drafter's wishes, read once it is known: the features' row, a row per slot. */
static sd_status feat_setup(sd_spec_loop *L) {
    L->feat_set = 1;
    if (L->d == NULL || L->d->ops->features == NULL) {
        return SD_OK;
    }
    L->feat_hidden = L->d->ops->features(L->d, L->m, L->feat_aux, &L->n_feat_aux) != 0;
    L->feat_w = L->m->cfg.hidden_size * (L->feat_hidden + L->n_feat_aux);
    L->feat = malloc((size_t)L->capacity * (size_t)L->feat_w * sizeof(float));
    if (L->feat == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory for features");
    }
    if (L->feat_pool != NULL) { /* the reused prefix's, computed by an earlier request */
        memcpy(L->feat, L->feat_pool, (size_t)L->pf.fed * (size_t)L->feat_w * sizeof(float));
        free(L->feat_pool);
        L->feat_pool = NULL;
    }
    return SD_OK;
}

/* The forward f gives its rows' features into L->fbuf (grown to its batch). */
static sd_status feat_ask(sd_spec_loop *L, sd_fwd *f) {
    const int T = f->b.n_tokens;
    if (L->feat == NULL || T == 0) {
        return SD_OK;
    }
    const size_t D = (size_t)L->m->cfg.hidden_size;
    if (T > L->fbuf_rows) {
        float *nb = realloc(L->fbuf, (size_t)T * (size_t)L->feat_w * sizeof(float));
        if (nb == NULL) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory for features");
        }
        L->fbuf = nb;
        L->fbuf_rows = T;
    }
    f->b.hidden = L->feat_hidden ? L->fbuf : NULL;
    f->b.aux = L->fbuf + (L->feat_hidden ? (size_t)T * D : 0);
    f->b.aux_layers = L->feat_aux;
    f->b.n_aux = L->n_feat_aux;
    return SD_OK;
}

/* Rows rows[0 .. n) of f's features kept as those of positions p0 .. p0 + n - 1. */
static void feat_keep(sd_spec_loop *L, const sd_fwd *f, const int32_t *rows, int n, int p0) {
    if (L->feat == NULL) {
        return;
    }
    const size_t D = (size_t)L->m->cfg.hidden_size, T = (size_t)f->b.n_tokens;
    for (int j = 0; j < n && p0 + j < L->capacity; j++) {
        float *dst = L->feat + (size_t)(p0 + j) * (size_t)L->feat_w;
        const size_t r = rows != NULL ? (size_t)rows[j] : (size_t)j;
        for (int i = 0; i < L->feat_hidden + L->n_feat_aux; i++) { /* hidden is block 0 */
            memcpy(dst + (size_t)i * D, L->fbuf + ((size_t)i * T + r) * D, D * sizeof(float));
        }
    }
}

/* ---- the verified rows' top ids ------------------------------------------------------------ */

const int32_t *sd_spec_row_top(const sd_spec_loop *L, int r, int top, int32_t *buf) {
    if (L->sp != NULL) {
        return L->row_top + (size_t)r * (size_t)L->d->row_top;
    }
    const int V = L->m->cfg.vocab_size;
    sd_top_ids(buf, top, L->logits + (size_t)r * (size_t)V, V);
    return buf;
}

#ifdef SD_WITH_CUDA
/* After a CUDA verify forward of `rows` rows: their top ids into L->row_top, when the drafter
 * reads them. */
static sd_status row_top_cuda(sd_spec_loop *L, int rows) {
    const int top = L->d != NULL ? L->d->row_top : 0;
    if (top <= 0) {
        return SD_OK;
    }
    if (L->row_top == NULL) {
        L->row_top = malloc((size_t)(SD_MAX_TREE + 1) * (size_t)top * sizeof(int32_t));
        if (L->row_top == NULL) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory");
        }
    }
    return sd_cuda_spec_row_top(L->sp, L->m->cuda, rows, top, L->row_top);
}
#endif

/* ---- verify and accept ---------------------------------------------------------------------- */

#ifdef SD_WITH_CUDA
/* The verify step of a CUDA target: the forward over [last, d1 .. dk] (drafts from the
 * device batch for model drafters, else from L->batch), the processing and the chain rule on
 * the device, and one copy of the result back: the step's one synchronisation. */
static sd_status spec_verify_cuda(sd_spec_loop *L, int k, int with_q, int *n_acc_out,
                                  int *k_used_out, int32_t *next_out) {
    sd_fwd f;
    memset(&f, 0, sizeof(f));
    f.kv = L->kv;
    f.b.n_tokens = k + 1;
    f.b.tokens = L->batch;
    f.b.n_logits = k + 1;
    SD_TRY(feat_ask(L, &f)); /* the drafter's features, copied back with the forward */
    SD_TRY(sd_forward_ex(L->m, L->kv, &f.b, NULL, with_q ? sd_cuda_spec_batch(L->sp) : NULL));
    const sd_cuda_sampling cs = sd_cuda_sampling_of(&L->s);
    const uint64_t pos = (uint64_t)(L->len - L->n_prompt); /* output index of d1 */
    int n_acc = 0, k_used = k;
    int32_t next = 0;
    SD_TRY(sd_cuda_spec_verify(L->sp, L->m->cuda, k, with_q, &cs, L->seed, pos, &n_acc,
                               with_q ? L->batch + 1 : NULL, &next, &k_used));
    SD_TRY(row_top_cuda(L, k + 1));
    feat_keep(L, &f, NULL, n_acc + 1, L->len - 1);
    *n_acc_out = n_acc;
    *k_used_out = k_used;
    *next_out = next;
    return SD_OK;
}
#endif

/* Where the next run of a verify batch's rows to process ends, after `have` of its k + 1: runs
 * of 2, 2, 4, 8, ... rows, so the chain rule runs a few times at most. */
static int rows_next(int have, int k) {
    const int run = have < 2 ? 2 : have;
    return have + run < k + 1 ? have + run : k + 1;
}

/* The chain rule over the rows of L->logits after the verify forward of L->batch = [last, d1 ..
 * dk] (with_q: the drafts' distributions are L->q): *n_acc drafts kept and *next, the token
 * after them. */
static void chain_rows(sd_spec_loop *L, int k, int with_q, int *n_acc_out, int32_t *next_out) {
    const int V = L->m->cfg.vocab_size;
    /* uniforms keyed by the output position they decide: none is ever used twice */
    double ua[SD_MAX_TREE], un[SD_MAX_TREE + 1]; /* a chain of a tree drafter may be long */
    const uint64_t pos = (uint64_t)(L->len - L->n_prompt); /* output index of d1 */
    for (int i = 0; i <= k; i++) {
        if (i < k) {
            ua[i] = sd_rng_uniform(L->seed, SD_STREAM_ACCEPT, pos + (uint64_t)i);
        }
        un[i] = sd_rng_uniform(L->seed, SD_STREAM_EMIT, pos + (uint64_t)i);
    }
    /* The rows processed a run at a time, each run only once every draft before it is
     * accepted: the rows after a rejected draft are never processed (when sampling, a softmax
     * of the vocabulary each). The chain rule decides draft by draft, so it goes on from the
     * first undecided draft over the rows there are; when it rejects one, its decision is the
     * rule's over all k, and the step goes on only when all were accepted. */
    int have = 0, n_acc = 0; /* rows processed; drafts accepted */
    if (k >= 1) {
        /* the first draft alone, on the root's row: most often it is rejected, and then the
         * step needs no other row (its test and residual are sd_verify_chain's first) */
        const float *q0 = with_q ? L->q : NULL;
        sd_process_logits(L->probs, L->logits, V, &L->s, L->iwork);
        have = 1;
        if (!sd_accept(L->probs, q0, L->batch[1], ua[0])) {
            *n_acc_out = 0;
            *next_out = sd_sample_residual(L->probs, q0, L->batch[1], V, un[0], L->fwork);
            return;
        }
        n_acc = 1;
    }
    for (;;) {
        const int want = rows_next(have, k);
        for (int r = have; r < want; r++) {
            sd_process_logits(L->probs + (size_t)r * V, L->logits + (size_t)r * V, V, &L->s,
                              L->iwork);
        }
        have = want;
        int32_t next = 0;
        n_acc += sd_verify_chain(&next, L->probs + (size_t)n_acc * V,
                                 with_q ? L->q + (size_t)n_acc * V : NULL, L->batch + 1 + n_acc,
                                 have - 1 - n_acc, V, ua + n_acc, un + n_acc, L->fwork);
        if (n_acc < have - 1 || have == k + 1) {
            *n_acc_out = n_acc;
            *next_out = next;
            return;
        }
    }
}

/* The verify forward of a chain: [last, d1 .. dk] with all rows of logits, in one pass (the
 * head's weights are read once for all rows). */
static void chain_batch(sd_spec_loop *L, int k, sd_fwd *f) {
    f->kv = L->kv;
    f->b.n_tokens = k + 1;
    f->b.tokens = L->batch;
    f->b.n_logits = k + 1;
    f->logits = L->logits;
}

/* The verify forward of a tree: [last, nodes] with the tree's mask (node i at position
 * len - 1 + depth(i), seeing the prefix, the root, its ancestors and itself; the attention gives
 * it a sequence's bits, ops_cpu.h). The mask and positions live in L until the step ends. */
static sd_status tree_batch(sd_spec_loop *L, const sd_draft *dr, const int *depth, sd_fwd *f) {
    if (L->sp != NULL && dr->q != NULL) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "the %s drafter proposed a tree of sampled children: on a CUDA "
                            "target trees are verified for deterministic children only so far",
                            L->d->ops->name);
    }
    const int n = dr->n, len = L->len;
    const int cols = len + n;
    L->tpos[0] = len - 1;
    for (int i = 0; i < n; i++) {
        L->tpos[1 + i] = len - 1 + depth[i];
    }
    free(L->tmask);
    L->tmask = calloc((size_t)(n + 1) * (size_t)cols, 1);
    if (L->tmask == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory for a tree's mask");
    }
    for (int r = 0; r <= n; r++) {
        uint8_t *row = L->tmask + (size_t)r * (size_t)cols;
        memset(row, 1, (size_t)len); /* the prefix and the root */
        for (int a = r - 1; a >= 0; a = dr->parent[a]) {
            row[len + a] = 1;
        }
    }
    f->kv = L->kv;
    f->b.n_tokens = n + 1;
    f->b.tokens = L->batch;
    f->b.pos = L->tpos;
    f->b.mask = L->tmask;
    f->b.n_mask_cols = cols;
    f->b.n_logits = n + 1;
    f->logits = L->logits;
    return SD_OK;
}

/* The accepted path (n_acc nodes, root to leaf) moved into consecutive slots after the root
 * (ascending copies: a path node's slot is never below its place in the path), and its tokens
 * into L->batch[1 .. n_acc]. */
static sd_status compact_path(sd_spec_loop *L, const int32_t *path, int n_acc) {
    int32_t toks[SD_MAX_TREE];
    for (int j = 0; j < n_acc; j++) {
        toks[j] = L->batch[1 + path[j]];
        if (path[j] != j) {
            SD_TRY(sd_kv_cache_copy_slot(L->kv, L->len + j, L->len + path[j]));
        }
    }
    memcpy(L->batch + 1, toks, (size_t)n_acc * sizeof(int32_t));
    return SD_OK;
}

/* After a tree's verify forward f decided the path (n_acc nodes): the features of its root and
 * path rows kept as the next positions', then the path compacted (compact_path). */
static sd_status keep_path(sd_spec_loop *L, const sd_fwd *f, const int32_t *path, int n_acc) {
    int32_t rows[SD_MAX_TREE + 1] = {0}; /* the root's row, then the path's */
    for (int j = 0; j < n_acc; j++) {
        rows[1 + j] = 1 + path[j];
    }
    memcpy(L->emit_row, rows, (size_t)(n_acc + 1) * sizeof(int32_t));
    feat_keep(L, f, rows, n_acc + 1, L->len - 1);
    return compact_path(L, path, n_acc);
}

/* Row r of a tree's verify forward, processed (sd_verify_tree_rows' row provider). */
static const float *tree_row(void *ctx, int r) {
    sd_spec_loop *L = ctx;
    const int V = L->m->cfg.vocab_size;
    sd_process_logits(L->probs + (size_t)r * V, L->logits + (size_t)r * V, V, &L->s, L->iwork);
    return L->probs + (size_t)r * V;
}

/* After a tree's verify forward: the tree rule of verify.h, and the accepted path compacted
 * (compact_path). */
static sd_status tree_rows(sd_spec_loop *L, const sd_fwd *f, const sd_draft *dr, const int *depth,
                           int *n_acc_out, int32_t *next_out) {
    const int V = L->m->cfg.vocab_size, n = dr->n, len = L->len;
    int32_t path[SD_MAX_TREE];
    if (L->s.temperature == 0.0f) {
        /* At temperature 0 every row is one-hot at its argmax, and the tree rule comes down to
         * the greedy walk: from the root, the first child whose token is its parent's row's
         * argmax, as deep as that goes, then the last row's argmax. Only the walk's rows are
         * read (the rule would process all n + 1, each a pass over the vocabulary and a
         * one-hot row written); the tests of greedy equality hold it to the rule. */
        int n_acc = 0;
        for (int node = -1;;) {
            const int32_t best = sd_argmax(L->logits + (size_t)(node + 1) * V, V);
            int c = node + 1;
            while (c < n && !(dr->parent[c] == node && L->batch[1 + c] == best)) {
                c++;
            }
            if (c == n) {
                *next_out = best;
                break;
            }
            path[n_acc++] = c;
            node = c;
        }
        *n_acc_out = n_acc;
        return keep_path(L, f, path, n_acc);
    }
    int max_depth = 0;
    for (int i = 0; i < n; i++) {
        max_depth = depth[i] > max_depth ? depth[i] : max_depth;
    }
    /* a node's coin is keyed by (step, node), the emitted token by its output position */
    double ua[SD_MAX_TREE], un[SD_MAX_TREE + 1];
    const uint64_t out_pos = (uint64_t)(len - L->n_prompt);
    for (int i = 0; i < n; i++) {
        ua[i] = sd_rng_uniform(L->seed, SD_STREAM_TREE, out_pos * SD_MAX_TREE + (uint64_t)i);
    }
    for (int a = 0; a <= max_depth; a++) {
        un[a] = sd_rng_uniform(L->seed, SD_STREAM_EMIT, out_pos + (uint64_t)a);
    }
    /* only the rows the walk reaches are processed (each a softmax of the vocabulary): the
     * root's and the accepted path's */
    const int n_acc = sd_verify_tree_rows(path, next_out, L->batch + 1, dr->parent, n, tree_row, L,
                                          dr->q, V, ua, un, L->fwork);
    *n_acc_out = n_acc;
    return keep_path(L, f, path, n_acc);
}

#ifdef SD_WITH_CUDA
/* A tree's whole verify step on a CUDA target: the masked forward (its rows stay on the
 * device), the tree rule there (sd_cuda_spec_verify_tree, uniforms keyed as on the CPU), and
 * the accepted path compacted in the device cache. */
static sd_status tree_verify_cuda(sd_spec_loop *L, const sd_fwd *tf, int *n_acc, int32_t *next) {
    sd_fwd f = *tf;
    SD_TRY(feat_ask(L, &f)); /* the drafter's features, copied back with the forward */
    SD_TRY(sd_forward_ex(L->m, L->kv, &f.b, NULL, NULL));
    const sd_cuda_sampling cs = sd_cuda_sampling_of(&L->s);
    int32_t path[SD_MAX_TREE];
    SD_TRY(sd_cuda_spec_verify_tree(L->sp, L->m->cuda, L->dr.n, L->batch + 1, L->dr.parent, &cs,
                                    L->seed, (uint64_t)(L->len - L->n_prompt), n_acc, path, next));
    SD_TRY(row_top_cuda(L, L->dr.n + 1));
    return keep_path(L, &f, path, *n_acc);
}
#endif

/* ---- the step ------------------------------------------------------------------------------ */

/* A proposal's shape: parents before children, depths within the room, a chain's length
 * within the chain room, a tree's nodes within the tree room (a drafter's bug otherwise:
 * SD_ERR_INTERNAL). depth[i] receives node i's depth (1 for a child of the root); *chain
 * whether parent[i] = i - 1 throughout. */
static sd_status check_tree(const sd_drafter *d, const sd_draft *dr, const sd_spec_loop *L,
                            int *depth, int *chain) {
    int depth_room = 0;
    const int tree_room = sd_spec_tree_room(L, &depth_room);
    int deepest = 0;
    *chain = 1;
    if (dr->n < 0 || dr->n > SD_MAX_TREE || (dr->q != NULL && dr->q != L->q)) {
        return sd_set_error(SD_ERR_INTERNAL, "the %s drafter proposed %d nodes", d->ops->name,
                            dr->n);
    }
    for (int i = 0; i < dr->n; i++) {
        const int p = dr->parent[i];
        if (p < -1 || p >= i) {
            return sd_set_error(SD_ERR_INTERNAL, "the %s drafter gave node %d the parent %d",
                                d->ops->name, i, p);
        }
        depth[i] = p < 0 ? 1 : depth[p] + 1;
        deepest = depth[i] > deepest ? depth[i] : deepest;
        *chain &= p == i - 1;
    }
    const int room = *chain ? sd_spec_room(L) : tree_room;
    if (dr->n > room || deepest > depth_room) {
        return sd_set_error(SD_ERR_INTERNAL,
                            "the %s drafter proposed %d nodes %d deep (room for %d, %d deep)",
                            d->ops->name, dr->n, deepest, room, depth_room);
    }
    return SD_OK;
}

/* The end of a step once the verify has decided (k drafts, n_acc kept, then next): accept
 * (emit the kept tokens, roll the cache back), commit (the drafter), the timings. */
static sd_status finish_step(sd_spec_loop *L, int k, int n_acc, int32_t next) {
    const sd_draft *dr = &L->dr;
    sd_status st = spec_accept_tree(L, k, L->chain_step ? NULL : L->depth, n_acc, next);
    if (st == SD_OK && !L->e.done) {
        st = L->d->ops->commit(L->d, L->dstate, L, dr, n_acc, next);
    }
    L->ss->time_draft_s += L->t1 - L->t0;
    L->ss->time_verify_s += sd_now_s() - L->t1;
    return st;
}

sd_status sd_spec_step_before(sd_spec_loop *L, sd_fwd *f) {
    memset(f, 0, sizeof(*f));
    L->phase = SD_SPEC_PHASE_NONE;
    if (!L->feat_set) {
        SD_TRY(feat_setup(L));
    }
    if (!L->begun) { /* a part of the prompt; the drafter begins once it is all in */
        sd_prefill_next(&L->pf, L->m, L->kv, L->hist, L->n_prompt - 1, NULL, f);
        if (f->b.n_tokens > 0) {
            L->phase = SD_SPEC_PHASE_PREFILL;
            return feat_ask(L, f);
        }
        return begin_drafter(L);
    }
    const sd_drafter *d = L->d;
    L->t0 = sd_now_s();
    memset(&L->dr, 0, sizeof(L->dr));
    SD_TRY(d->ops->propose(d, L->dstate, L, sd_spec_room(L), &L->dr));
    const sd_draft *dr = &L->dr;
    L->chain_step = 1;
    if (!dr->on_device) {
        SD_TRY(check_tree(d, dr, L, L->depth, &L->chain_step));
        if (dr->n > 0 && dr->tokens != L->batch + 1) {
            memmove(L->batch + 1, dr->tokens, (size_t)dr->n * sizeof(int32_t));
        }
    }
    L->batch[0] = L->hist[L->len - 1];
    L->t1 = sd_now_s();
    if (!L->chain_step) {
        SD_TRY(tree_batch(L, dr, L->depth, f));
#ifdef SD_WITH_CUDA
        if (L->sp != NULL) { /* the whole step here, as a CUDA chain's */
            int n_acc = 0;
            int32_t next = 0;
            const sd_fwd tf = *f;
            memset(f, 0, sizeof(*f));
            SD_TRY(tree_verify_cuda(L, &tf, &n_acc, &next));
            return finish_step(L, dr->n, n_acc, next);
        }
#endif
        L->phase = SD_SPEC_PHASE_TREE;
        return feat_ask(L, f);
    }
#ifdef SD_WITH_CUDA
    if (L->sp != NULL) { /* the whole step here (its forward reads the drafts on the device) */
        int n_acc = 0, k_used = dr->n;
        int32_t next = 0;
        SD_TRY(spec_verify_cuda(L, dr->n, dr->q != NULL || dr->on_device, &n_acc, &k_used, &next));
        return finish_step(L, k_used, n_acc, next);
    }
#endif
    chain_batch(L, dr->n, f);
    L->phase = SD_SPEC_PHASE_CHAIN;
    return feat_ask(L, f);
}

/* The logit bias and penalties on each row of a verify forward: row 0 after the text, row
 * 1 + i after node i, counting the drafted tokens on the way there (a chain's nodes before it,
 * a tree's node and its ancestors). */
static void penalize_rows(sd_spec_loop *L, int chain) {
    if (L->e.count == NULL) {
        return;
    }
    const int V = L->m->cfg.vocab_size, n = L->dr.n;
    int32_t path[SD_MAX_TREE];
    for (int r = 0; r <= n; r++) {
        int len = 0;
        if (chain) {
            memcpy(path, L->batch + 1, (size_t)r * sizeof(int32_t));
            len = r;
        } else {
            for (int a = r - 1; a >= 0; a = L->dr.parent[a]) {
                path[len++] = L->batch[1 + a];
            }
        }
        sd_emitter_penalize(&L->e, L->logits + (size_t)r * (size_t)V, path, len);
    }
}

sd_status sd_spec_step_after(sd_spec_loop *L, const sd_fwd *f, sd_status forward) {
    const int phase = L->phase;
    L->phase = SD_SPEC_PHASE_NONE;
    SD_TRY(forward);
    int n_acc = 0;
    int32_t next = 0;
    switch (phase) {
    case SD_SPEC_PHASE_PREFILL:
        feat_keep(L, f, NULL, f->b.n_tokens, (int)(f->b.tokens - L->hist));
        sd_prefill_fed(&L->pf, f);
        return L->pf.fed >= L->n_prompt - 1 ? begin_drafter(L) : SD_OK;
    case SD_SPEC_PHASE_CHAIN:
        penalize_rows(L, 1);
        chain_rows(L, L->dr.n, L->dr.q != NULL, &n_acc, &next);
        chain_emit_rows(L, n_acc);
        feat_keep(L, f, NULL, n_acc + 1, L->len - 1);
        return finish_step(L, L->dr.n, n_acc, next);
    case SD_SPEC_PHASE_TREE:
        penalize_rows(L, 0);
        SD_TRY(tree_rows(L, f, &L->dr, L->depth, &n_acc, &next));
        return finish_step(L, L->dr.n, n_acc, next);
    default: return SD_OK;
    }
}

/* ---- drafting with a model (a draft model, or the target's first layers) ------------------- */

/* The largest probability of softmax(logits): how sure a greedy draft is of its token (the
 * exponentials as sampling's softmax takes them, into work (V)). */
static double top_prob(const float *logits, int V, float *work) {
    const float mx = logits[sd_argmax(logits, V)];
    return 1.0 / sd_softmax_exp(work, logits, V, mx, 1.0f);
}

#ifdef SD_WITH_CUDA
/* draft_autoregressive on the device: each draft forward reads the token the previous pick
 * wrote (no copy to the host); a p_min cut marks the draft's end on the device, and the verify
 * step uses only the drafts before it. The draft model's stream and the target's are joined
 * around the drafting, which shares the step's device buffers with the verify. */
static sd_status draft_cuda(sd_spec_loop *L, sd_model *dm, sd_kv_cache *dkv, int n_layers, int k,
                            float p_min) {
    const uint64_t pos = (uint64_t)(L->len - L->n_prompt);
    const int have = sd_kv_cache_length(dkv);
    L->batch[0] = L->hist[L->len - 1];
    SD_TRY(sd_cuda_model_join(dm->cuda, L->m->cuda));
    SD_TRY(sd_cuda_spec_begin(L->sp, dm->cuda, L->batch[0], k));
    const sd_cuda_sampling cs = sd_cuda_sampling_of(&L->s);
    for (int i = 0; i < k; i++) {
        sd_batch b = {0};
        b.n_tokens = i == 0 ? L->len - have : 1;
        b.tokens = i == 0 ? L->hist + have : NULL;
        b.n_logits = 1;
        b.n_layers = n_layers;
        SD_TRY(sd_forward_ex(dm, dkv, &b, NULL, i == 0 ? NULL : sd_cuda_spec_next_input(L->sp)));
        SD_TRY(sd_cuda_spec_draft_pick(L->sp, dm->cuda, i, &cs, L->seed, pos, p_min));
    }
    return sd_cuda_model_join(L->m->cuda, dm->cuda);
}
#endif

sd_status sd_spec_draft_autoregressive(sd_spec_loop *L, sd_model *dm, sd_kv_cache *dkv,
                                       int n_layers, int *k, float p_min) {
#ifdef SD_WITH_CUDA
    if (L->sp != NULL) {
        return draft_cuda(L, dm, dkv, n_layers, *k, p_min);
    }
#endif
    const int V = dm->cfg.vocab_size;
    const uint64_t pos = (uint64_t)(L->len - L->n_prompt); /* output index of d1 */
    const int have = sd_kv_cache_length(dkv);
    L->batch[0] = L->hist[L->len - 1];
    for (int i = 0; i < *k; i++) {
        sd_batch b = {0};
        b.n_tokens = i == 0 ? L->len - have : 1;
        b.tokens = i == 0 ? L->hist + have : &L->batch[i];
        b.n_logits = 1;
        b.n_layers = n_layers;
        SD_TRY(sd_forward(dm, dkv, &b, L->dlog));
        float *qi = L->q + (size_t)i * V;
        sd_process_logits(qi, L->dlog, V, &L->s, L->iwork);
        const double u = sd_rng_uniform(L->seed, SD_STREAM_DRAFT, pos + (uint64_t)i);
        const int32_t d = L->s.temperature == 0.0f ? sd_argmax(qi, V) : sd_sample_probs(qi, V, u);
        L->batch[1 + i] = d;
        if (p_min > 0.0f && (L->s.temperature == 0.0f ? top_prob(L->dlog, V, L->fwork)
                                                      : (double)qi[d]) < (double)p_min) {
            *k = i + 1;
            break;
        }
    }
    return SD_OK;
}

sd_status sd_spec_model_propose(sd_spec_loop *L, sd_model *dm, sd_kv_cache *dkv, int n_layers,
                                const sd_draft_params *dp, int room, sd_draft *out) {
    int k = sd_model_draft_k(dp, L->ss, L->draft_cost, room);
    SD_TRY(sd_spec_draft_autoregressive(L, dm, dkv, n_layers, &k, dp->p_min));
    out->n = k;
    out->tokens = L->batch + 1;
    out->parent = L->chain;
    out->q = L->sp == NULL ? L->q : NULL;
    out->on_device = L->sp != NULL;
    return SD_OK;
}

/* ---- benchmarks: synthetic acceptance ------------------------------------------------------ */

sd_status sd_bench_synthetic(int32_t *out, int *n_out, sd_spec_stats *stats, sd_model *m,
                             const int32_t *prompt, int n_prompt, int max_new_tokens, int k,
                             double alpha, uint64_t seed) {
    const double t_start = sd_now_s();
    sd_spec_stats local;
    sd_spec_stats *ss = stats != NULL ? stats : &local;
    sd_generate_params p = sd_generate_default_params();
    p.max_new_tokens = max_new_tokens;
    p.seed = seed;
    sd_sampling s;
    *n_out = 0;
    memset(ss, 0, sizeof(*ss));
    SD_TRY(sd_decode_check(m, prompt, n_prompt, &p, &s));
    SD_TRY(sd_check_max_draft(k));
    if (!(alpha >= 0.0 && alpha <= 1.0)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "alpha must be in [0, 1], got %g", alpha);
    }
    if (max_new_tokens == 0) {
        return SD_OK;
    }
    const int V = m->cfg.vocab_size;
    sd_spec_loop L;
    sd_status st = sd_spec_loop_begin(&L, m, prompt, n_prompt, &p, &s, k, m->cfg.context_length, 0,
                                      out, ss, t_start, NULL, 0);
    for (int ready = 0; st == SD_OK && !ready;) {
        st = sd_spec_prefill(&L, &ready);
    }
    while (st == SD_OK && !L.e.done) {
        const double t0 = sd_now_s();
        /* free drafting: copies of the last token, valid ids whose values do not matter */
        const int kk = sd_spec_room(&L);
        L.batch[0] = L.hist[L.len - 1];
        for (int i = 0; i < kk; i++) {
            L.batch[1 + i] = L.batch[0];
        }
        const double t1 = sd_now_s();
        const uint64_t pos = (uint64_t)(L.len - L.n_prompt);
        int n_acc = 0;
        int32_t next = 0;
        sd_batch b = {0};
        b.n_tokens = kk + 1;
        b.tokens = L.batch;
        b.n_logits = kk + 1;
#ifdef SD_WITH_CUDA
        if (L.sp != NULL) {
            st = sd_forward_ex(m, L.kv, &b, NULL, NULL);
            if (st == SD_OK) {
                st = sd_cuda_spec_synthetic(L.sp, m->cuda, kk, alpha, seed, pos, &n_acc, &next);
            }
        } else
#endif
        {
            st = sd_forward(m, L.kv, &b, L.logits);
            if (st == SD_OK) {
                n_acc = sd_verify_synthetic(kk, alpha, seed, pos);
                next = sd_argmax(L.logits + (size_t)n_acc * (size_t)V, V);
            }
        }
        if (st == SD_OK) {
            st = sd_spec_accept(&L, kk, n_acc, next);
        }
        ss->time_draft_s += t1 - t0;
        ss->time_verify_s += sd_now_s() - t1;
    }
    return sd_spec_loop_end(&L, st, n_out, NULL);
}
