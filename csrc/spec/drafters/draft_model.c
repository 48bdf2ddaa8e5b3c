/* draft_model.c — the draft-model drafter (speculative sampling: Leviathan et al. 2023, Chen et
 * al. 2023): a smaller model with the target's vocabulary and its own KV cache drafts k tokens
 * one forward at a time, greedily at temperature 0, else sampled from its processed
 * distribution q, which the verify step weighs against the target's; with branching > 1, a tree
 * of them (model_tree.h), whose accepted path the draft cache keeps, compacted. */
#include <stdlib.h>

#include "spec/drafter.h"
#include "spec/drafters/model_tree.h"
#include "spec/loop.h"
#include "util/status.h"
#ifdef SD_WITH_CUDA
#include "../cuda/sd_cuda.h"
#endif

static sd_status draft_check(const sd_drafter *d, const sd_model *m, int n_prompt,
                             int max_new_tokens) {
    const sd_model *dm = d->model;
    if (dm->cfg.vocab_size != m->cfg.vocab_size) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "the draft model's vocabulary (%d tokens) differs from the target's "
                            "(%d tokens): they must share one tokenizer",
                            dm->cfg.vocab_size, m->cfg.vocab_size);
    }
    if (dm->device != m->device) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "the draft model runs on the %s and the target on the %s: load both "
                            "on the same device",
                            dm->device == SD_DEVICE_CUDA ? "GPU" : "CPU",
                            m->device == SD_DEVICE_CUDA ? "GPU" : "CPU");
    }
#ifdef SD_WITH_CUDA
    if (m->cuda != NULL && sd_cuda_model_gpu(dm->cuda) != sd_cuda_model_gpu(m->cuda)) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "the draft model is on GPU %d and the target on GPU %d: load both on "
                            "one GPU",
                            sd_cuda_model_gpu(dm->cuda), sd_cuda_model_gpu(m->cuda));
    }
#endif
    if (d->u.m.dp.branching > 1 && m->device != SD_DEVICE_CPU) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "a draft model with branching > 1 drafts trees, verified on CPU "
                            "targets only so far: use branching=1 on a GPU");
    }
    if (max_new_tokens > 0 && (int64_t)n_prompt + max_new_tokens > dm->cfg.context_length) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "prompt (%d tokens) + max_new_tokens (%d) exceeds the context length "
                            "%d of the draft model",
                            n_prompt, max_new_tokens, dm->cfg.context_length);
    }
    return SD_OK;
}

/* A request's state: the draft's own cache, of the sequence's size (sd_spec_loop.capacity),
 * and for trees their drafting. */
typedef struct {
    sd_kv_cache *dkv;
    sd_model_tree *tree; /* NULL for a chain */
} draft_state;

static sd_status draft_begin(const sd_drafter *d, void **state, sd_spec_loop *L) {
    draft_state *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    *state = s;
    SD_TRY(sd_kv_cache_create(&s->dkv, d->model, L->capacity));
    return d->u.m.dp.branching > 1 ? sd_model_tree_create(&s->tree, &d->u.m.dp, L) : SD_OK;
}

static sd_status draft_propose(const sd_drafter *d, void *state, sd_spec_loop *L, int room,
                               sd_draft *out) {
    draft_state *s = state;
    if (s->tree != NULL) {
        sd_cost_curve buf;
        const sd_cost_curve *cost = NULL;
        SD_TRY(sd_model_tree_costs(d, &d->u.m.dp, L, &buf, &cost));
        return sd_model_tree_propose(s->tree, L, d->model, s->dkv, 0, &d->u.m.dp, NULL, cost, out);
    }
    return sd_spec_model_propose(L, d->model, s->dkv, 0, &d->u.m.dp, room, out);
}

/* A chain: the draft cache was fed up to d(k-1), so it keeps what was accepted; when all k
 * were, dk is left for the next step's first draft forward, which feeds it together with the
 * new last token. A tree: the accepted path's fed nodes are moved into consecutive slots
 * (sd_model_tree_commit), and the rest is forgotten in the same way. */
static sd_status draft_commit(const sd_drafter *d, void *state, sd_spec_loop *L,
                              const sd_draft *draft, int n_acc, int32_t next) {
    (void)draft;
    (void)next;
    draft_state *s = state;
    sd_kv_cache *dkv = s->dkv;
    if (s->tree != NULL) {
        SD_TRY(sd_model_tree_commit(s->tree, L, dkv, n_acc));
    }
    if (sd_kv_cache_length(dkv) > L->len - 1) {
        SD_TRY(sd_kv_cache_set_length(dkv, L->len - 1));
    }
    if (!L->check_cache) {
        return SD_OK;
    }
    /* the draft may lag (tokens it has not been fed yet) but never hold more than all but the
     * last token */
    const int n = sd_kv_cache_length(dkv);
    if (n > L->len - 1) {
        return sd_set_error(SD_ERR_INTERNAL,
                            "cache check after step %d: the draft model cache holds %d slots, "
                            "more than %d",
                            L->ss->steps, n, L->len - 1);
    }
    return sd_spec_check_cache(d->model, dkv, L->hist, n, L->n_prompt, "draft model", L->ss->steps);
}

/* weights read per token: the draft's over the target's */
static double draft_cost(const sd_drafter *d, const sd_model *target) {
    return (double)sd_model_weight_bytes(d->model) / (double)sd_model_weight_bytes(target);
}

static void draft_end(const sd_drafter *d, void *state) {
    (void)d;
    draft_state *s = state;
    if (s != NULL) {
        sd_kv_cache_free(s->dkv);
        sd_model_tree_free(s->tree);
        free(s);
    }
}

static const sd_drafter_ops draft_ops = {
    .name = "draft_model",
    .check = draft_check,
    .begin = draft_begin,
    .propose = draft_propose,
    .commit = draft_commit,
    .cost = draft_cost,
    .end = draft_end,
};

sd_status sd_drafter_draft_model(sd_drafter **out, sd_model *draft, const sd_draft_params *dp) {
    *out = NULL;
    if (draft == NULL) {
        return sd_set_error(SD_ERR_INVALID_ARG, "the draft model is missing");
    }
    SD_TRY(sd_drafter_check_draft_params(dp));
    SD_TRY(sd_drafter_alloc(out, &draft_ops, dp->branching > 1 ? dp->nodes : dp->k, 1));
    (*out)->model = draft;
    (*out)->context = draft->cfg.context_length;
    (*out)->u.m.dp = *dp;
    return SD_OK;
}
