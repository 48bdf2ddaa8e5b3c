/* sampling.cuh — the sampling kernels' launchers as the backend's loops use them (device
 * arrays and scalars, no synchronisation). */
#ifndef SD_CUDA_SAMPLING_CUH
#define SD_CUDA_SAMPLING_CUH

#include "common.cuh"

/* Scratch for sorting rows of V probabilities (top-k / top-p / min-p need the order). */
typedef struct {
    int rows, V;
    float *keys;      /* (rows, V) sorted probabilities */
    int32_t *ids_in;  /* (rows, V) 0..V-1 per row */
    int32_t *ids_out; /* (rows, V) ids in sorted order */
    int *offsets;     /* (rows + 1) r * V */
    void *temp;
    size_t temp_bytes;
} sd_cuda_sorter;

sd_status sd_cuda_sorter_reserve(sd_cuda_ctx *ctx, sd_cuda_sorter *s, int rows, int V);
void sd_cuda_sorter_release(sd_cuda_sorter *s);

/* probs (rows, V) = processed logits (rows, V) (sd_process_logits row by row). */
sd_status sd_cuda_process_rows(sd_cuda_ctx *ctx, sd_cuda_sorter *sorter, float *probs,
                               const float *logits, int rows, int V, float temperature, int top_k,
                               float top_p, float min_p);
sd_status sd_cuda_argmax_rows(sd_cuda_ctx *ctx, int32_t *out, const float *x, int rows, int V);
sd_status sd_cuda_sample_rows(sd_cuda_ctx *ctx, int32_t *out, const float *probs, int rows, int V,
                              uint64_t seed, uint64_t stream, uint64_t index0);
/* The chain rule over K drafts (K cut to *k_dev when given); result[0] = accepted, [1] = next. */
sd_status sd_cuda_verify_dev(sd_cuda_ctx *ctx, int32_t *result, const float *p, const float *q,
                             const int32_t *draft, int K, const int32_t *k_dev, int V,
                             uint64_t seed, uint64_t pos0, float *work);
/* The ids of each row's `top` largest values, (rows, top) (sd_top_ids). */
sd_status sd_cuda_row_top_dev(sd_cuda_ctx *ctx, int32_t *out, const float *x, int rows, int V,
                              int top);
/* The tree rule (sd_verify_tree) over n nodes: result[0] = accepted, [1] = next, [2 ..] = the
 * path; uniforms keyed by out_pos as the CPU loop keys them. work: 2 V floats. */
sd_status sd_cuda_verify_tree_dev(sd_cuda_ctx *ctx, int32_t *result, const float *p,
                                  const float *q, const int32_t *tokens, const int32_t *parent,
                                  int n, int V, uint64_t seed, uint64_t out_pos, float *work);
/* Benchmarks: result[0] = drafts accepted with probability alpha each, [1] = argmax of logits
 * row result[0] (logits may be NULL). */
sd_status sd_cuda_synthetic_dev(sd_cuda_ctx *ctx, int32_t *result, int K, double alpha,
                                uint64_t seed, uint64_t pos0, const float *logits, int V);
/* A model drafter's token i from its processed row q (see sampling.cu). */
sd_status sd_cuda_draft_pick_dev(sd_cuda_ctx *ctx, int32_t *batch, int32_t *next_in,
                                 int32_t *k_stop, const float *q, const float *logits, int V, int i,
                                 float temperature, uint64_t seed, uint64_t pos0, float p_min);

#endif /* SD_CUDA_SAMPLING_CUH */
