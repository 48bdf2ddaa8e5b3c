/* layerskip.c — self-speculation (early exit, as in LayerSkip, Elhoushi et al. 2024, without its
 * training): the draft is the target's own first n_layers layers followed by its final norm and
 * head. It needs no weights or cache of its own: the first n_layers layers of a token compute
 * exactly what the target's do, so the drafts write the target's cache and the verify forward
 * rewrites the same slots; no second cache, no catch-up. With branching > 1 the draft is a tree
 * (model_tree.h), its nodes fed through the target's cache in the same way. */
#include "spec/drafter.h"
#include "spec/drafters/model_tree.h"
#include "spec/loop.h"
#include "util/status.h"

static sd_status skip_check(const sd_drafter *d, const sd_model *m, int n_prompt,
                            int max_new_tokens) {
    (void)n_prompt;
    (void)max_new_tokens;
    const int n_layers = d->u.m.n_layers;
    if (n_layers >= m->cfg.n_layers) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "the draft's layers must be in [1, %d) (the target has %d), got %d",
                            m->cfg.n_layers, m->cfg.n_layers, n_layers);
    }
    if (d->u.m.dp.branching > 1 && m->device != SD_DEVICE_CPU) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "layer skip with branching > 1 drafts trees, verified on CPU targets "
                            "only so far: use branching=1 on a GPU");
    }
    return SD_OK;
}

/* A tree's drafting (its buffers), or nothing for a chain. */
static sd_status skip_begin(const sd_drafter *d, void **state, sd_spec_loop *L) {
    *state = NULL;
    if (d->u.m.dp.branching > 1) {
        sd_model_tree *t = NULL;
        SD_TRY(sd_model_tree_create(&t, &d->u.m.dp, L));
        *state = t;
    }
    return SD_OK;
}

static sd_status skip_propose(const sd_drafter *d, void *state, sd_spec_loop *L, int room,
                              sd_draft *out) {
    if (state != NULL) {
        sd_cost_curve buf;
        const sd_cost_curve *cost = NULL;
        SD_TRY(sd_model_tree_costs(d, &d->u.m.dp, L, &buf, &cost));
        SD_TRY(sd_model_tree_propose(state, L, L->m, L->kv, d->u.m.n_layers, &d->u.m.dp, NULL, cost,
                                     out));
    } else {
        SD_TRY(sd_spec_model_propose(L, L->m, L->kv, d->u.m.n_layers, &d->u.m.dp, room, out));
    }
    /* the verify forward rewrites the drafts' slots (a tree's: the nodes' own, then compacts) */
    return sd_kv_cache_set_length(L->kv, L->len - 1);
}

static sd_status skip_commit(const sd_drafter *d, void *state, sd_spec_loop *L,
                             const sd_draft *draft, int n_acc, int32_t next) {
    (void)d;
    (void)state;
    (void)L;
    (void)draft;
    (void)n_acc;
    (void)next;
    return SD_OK; /* the target's own cache was rolled back with the step */
}

/* layers run per draft token over the target's */
static double skip_cost(const sd_drafter *d, const sd_model *target) {
    return (double)d->u.m.n_layers / (double)target->cfg.n_layers;
}

static void skip_end(const sd_drafter *d, void *state) {
    (void)d;
    sd_model_tree_free(state);
}

static const sd_drafter_ops skip_ops = {
    .name = "layerskip",
    .check = skip_check,
    .begin = skip_begin,
    .propose = skip_propose,
    .commit = skip_commit,
    .cost = skip_cost,
    .end = skip_end,
};

sd_status sd_drafter_layerskip(sd_drafter **out, int n_layers, const sd_draft_params *dp) {
    *out = NULL;
    if (n_layers < 1) {
        return sd_set_error(SD_ERR_INVALID_ARG, "the draft's layers must be >= 1, got %d",
                            n_layers);
    }
    SD_TRY(sd_drafter_check_draft_params(dp));
    SD_TRY(sd_drafter_alloc(out, &skip_ops, dp->branching > 1 ? dp->nodes : dp->k, 1));
    (*out)->u.m.dp = *dp;
    (*out)->u.m.n_layers = n_layers;
    return SD_OK;
}
