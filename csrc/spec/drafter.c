/* drafter.c — what drafters share: allocation and release of a drafter, the checks of the model
 * drafters' parameters, and the adaptive draft length. */
#include "spec/drafter.h"

#include <limits.h>
#include <stdlib.h>

#include "util/status.h"

sd_status sd_drafter_alloc(sd_drafter **out, const sd_drafter_ops *ops, int max_nodes,
                           int wants_q) {
    *out = NULL;
    sd_drafter *d = calloc(1, sizeof(*d));
    if (d == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    d->ops = ops;
    d->max_nodes = max_nodes;
    d->wants_q = wants_q;
    d->context = INT_MAX;
    *out = d;
    return SD_OK;
}

void sd_drafter_free(sd_drafter *d) {
    free(d);
}

int sd_drafter_max_draft(const sd_drafter *d) {
    return d->max_nodes;
}

const char *sd_drafter_name(const sd_drafter *d) {
    return d->ops->name;
}

sd_status sd_check_max_draft(int k) {
    if (k < 1 || k > SD_MAX_DRAFT) {
        return sd_set_error(SD_ERR_INVALID_ARG, "k must be in [1, %d], got %d", SD_MAX_DRAFT, k);
    }
    return SD_OK;
}

sd_status sd_drafter_check_draft_params(const sd_draft_params *dp) {
    SD_TRY(sd_check_max_draft(dp->k));
    if (!(dp->p_min >= 0.0f && dp->p_min <= 1.0f)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "p_min must be in [0, 1], got %g",
                            (double)dp->p_min);
    }
    return sd_drafter_check_slope(dp->verify_slope);
}

sd_status sd_drafter_check_slope(float verify_slope) {
    if (!(verify_slope >= 0.0f)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "verify_slope must be >= 0, got %g",
                            (double)verify_slope);
    }
    return SD_OK;
}

/* Prompt lookup counts as trials the accepted tokens and the rejected drafts, the model drafters
 * all drafted tokens. */
int sd_adaptive_k(double accepted, double trials, float slope, int kmax, int step) {
    const double a = (accepted + 1.0) / (trials + 2.0);
    double best_v = 1.0, ak = a; /* k = 0: one token per unit cost */
    int best = 0;
    for (int k = 1; k <= kmax; k++) {
        ak *= a; /* a^(k+1) */
        const double v = (1.0 - ak) / ((1.0 - a) * (1.0 + (double)slope * k));
        if (v > best_v) {
            best_v = v;
            best = k;
        }
    }
    return best > 0 ? best : (step % 4 == 0 ? 1 : 0);
}

int sd_model_draft_k(const sd_draft_params *dp, const sd_spec_stats *ss, double draft_cost,
                     int room) {
    if (dp->verify_slope <= 0.0f || room == 0) {
        return room;
    }
    return sd_adaptive_k(ss->accepted, ss->drafted, (float)(dp->verify_slope + draft_cost), room,
                         ss->steps);
}
