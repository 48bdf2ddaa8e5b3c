/* forward.h — the forward pass's internal entry point, for the decoding loops. */
#ifndef SD_FORWARD_H
#define SD_FORWARD_H

#include "model/sched.h" /* sd_fwd */
#include "specdec.h"

/* sd_forward, with the batch's token ids optionally already on the device (tokens_dev, CUDA
 * models only: a draft chain feeding its own picks; b->tokens is then ignored and the ids are
 * trusted, the picking kernels writing only ids < V). On a CUDA model logits may be NULL with
 * n_logits > 0: the rows then stay on the device, for the device-side picking and verifying. */
sd_status sd_forward_ex(sd_model *m, sd_kv_cache *kv, const sd_batch *b, float *logits,
                        const int32_t *tokens_dev);

/* The forward of n requests' batches at once: one pass of the weights for all their rows, each
 * request's tokens attending only to its own cache (the caches distinct, the layer counts
 * equal). Every batch is checked before any cache changes; a request gets the bits of its own
 * sd_forward. A CUDA model runs the batches one after the other. On the CPU each batch's
 * `nonfinite` tells whether its rows of logits came from a finite hidden state: the caller
 * decides whose request that fails (sd_fwd_finite). */
sd_status sd_forward_multi(sd_model *m, sd_fwd *jobs, int n);

/* SD_ERR_INVALID_ARG unless 0 <= tok < the vocabulary size (index: where it stands, for the
 * message): the one check of a token id. */
sd_status sd_check_token(const sd_model *m, int32_t tok, int index);

#endif /* SD_FORWARD_H */
