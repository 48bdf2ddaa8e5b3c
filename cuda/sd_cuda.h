/* sd_cuda.h — the CUDA backend as the C core sees it. Compiled in when the build finds nvcc
 * (SD_WITH_CUDA); without it the core never calls these. Every call returns sd_status; a
 * failed CUDA or cuBLAS call is SD_ERR_CUDA with a message naming the call, its error and
 * file:line. Nothing here aborts, exits or prints.
 *
 * What lives on the device: one allocation holding every weight (matrices as the file stores
 * them, norms and biases as f32), the KV caches, the forward's activations, and the state of
 * the decoding loops (batch tokens, draft distributions, results), so a speculative step
 * needs one host synchronisation: the copy of its result. Launchers of single kernels (used by
 * the kernel checks) take the arguments of their CPU twins (twins.h) after the context.
 * Quantized weights are multiplied with f32 activations (the CPU forward rounds activations to
 * 8 bits first), so the backends agree on float models to rounding and on quantized models to
 * the CPU's activation rounding. */
#ifndef SD_CUDA_H
#define SD_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/quant.h"
#include "specdec.h"

#ifdef __cplusplus
extern "C" {
#endif

struct sd_model;
struct sd_kv_cache;
typedef struct sd_cuda_model sd_cuda_model;
typedef struct sd_cuda_cache sd_cuda_cache;
typedef struct sd_cuda_ctx sd_cuda_ctx;

/* ---- device, model, cache ------------------------------------------------------------------ */

/* Visible CUDA devices (0 without a driver or GPU; never fails). */
int sd_cuda_device_count(void);

/* Copy the weights of the host model m (its sd_mat views; dummy matrices with data NULL are
 * generated on the device) into one device allocation on GPU `gpu`, and set up the stream,
 * cuBLAS handle and workspace. */
sd_status sd_cuda_model_create(sd_cuda_model **out, const struct sd_model *m, int gpu);
void sd_cuda_model_free(sd_cuda_model *cm);
/* A drafter head on its target's GPU: hm, a one-layer head bound by sd_head_bind (its rows
 * given as floats, sd_cuda_batch.embd); its own matrices and vectors copied to one allocation,
 * the target's token embeddings (and, unless own_output, the target's output matrix: EAGLE-1/2)
 * read from the target's device copy, so the target must outlive it. Its forward is the
 * target's, layer for layer, but for the layer's input: none (EAGLE-1/2), or
 * sd_cuda_head_input's (EAGLE-3); and the final norm, absent for EAGLE-1/2. */
sd_status sd_cuda_head_create(sd_cuda_model **out, const struct sd_model *hm, sd_cuda_model *target,
                              int own_output);

/* The GPU the model is on. */
int sd_cuda_model_gpu(const sd_cuda_model *cm);

/* Keys and values for `capacity` slots of every layer, (L, Hkv, capacity, Dh) f32, zeroed, on
 * the model's device (the cache keeps a reference to cm, which must outlive it). */
sd_status sd_cuda_cache_create(sd_cuda_cache **out, sd_cuda_model *cm, int capacity);
void sd_cuda_cache_free(sd_cuda_cache *c);
/* Slot src's keys and values (every layer) onto slot dst. */
sd_status sd_cuda_cache_copy_slot(sd_cuda_cache *c, int dst, int src);
/* The model a cache belongs to. */
const sd_cuda_model *sd_cuda_cache_model(const sd_cuda_cache *c);
/* Copy K and V ((L, Hkv, capacity, Dh) each) to the host (the cache self-check). */
sd_status sd_cuda_cache_download(const sd_cuda_cache *c, float *k, float *v);

/* ---- Medusa's heads -------------------------------------------------------------------------- */

/* Medusa-1's heads on GPU `gpu`: mats (heads * (blocks + 1)) as model/head.c keeps them (head
 * i's residual blocks [i * (blocks + 1) + j] (D, D) with biases bias + (i * blocks + j) * D,
 * then its output head [i * (blocks + 1) + blocks] (V, D)), copied to a device allocation of
 * their own. */
typedef struct sd_cuda_medusa sd_cuda_medusa;
sd_status sd_cuda_medusa_create(sd_cuda_medusa **out, int gpu, int heads, int blocks,
                                const sd_mat *mats, const float *bias);
void sd_cuda_medusa_free(sd_cuda_medusa *md);
/* out (heads, T, V) on the host: every head's logits at the final-normed hidden states x
 * (T, D) on the host (sd_head_medusa_logits's); synchronises. One caller at a time. */
sd_status sd_cuda_medusa_logits(sd_cuda_medusa *md, int T, const float *x, float *out);

/* ---- forward ------------------------------------------------------------------------------- */

/* A batch as sd_forward validated and prepared it on the host: T tokens (token ids on the
 * host, or, when tokens_dev is set, already on the device), positions, slots, the effective
 * mask (T, n_attn) and how many layers and logits to compute. */
typedef struct {
    int n_tokens;
    const int32_t *tokens;     /* (T) host ids, or NULL when tokens_dev is used */
    const int32_t *tokens_dev; /* (T) device ids (a draft chain), or NULL */
    const int32_t *pos;        /* (T) */
    const int32_t *slots;      /* (T) */
    const uint8_t *mask;       /* (T, n_attn) */
    int n_attn;
    int n_logits;
    int n_layers; /* >= 1 */
    /* features for drafters that read the target's hidden states (EAGLE, Medusa), copied to
     * the host: hidden, when not NULL, (T, D) every row's final-normed hidden state; aux, when
     * n_aux > 0, (n_aux, T, D) the residual stream entering layers aux_layers[0 .. n_aux) (the
     * layers run: the output of the last), as sd_batch's */
    float *hidden;
    const int32_t *aux_layers;
    int n_aux;
    float *aux;
    /* a head's rows (T, D) on the host, in place of the token embeddings; NULL otherwise */
    const float *embd;
} sd_cuda_batch;

/* Run the batch; the last n_logits rows of logits stay in the model's device buffer (where
 * sd_cuda_pick and the speculative steps read them) and, when logits is not NULL, are copied
 * to it ((n_logits, V), V the output head's rows: a head's draft vocabulary; which
 * synchronises). */
sd_status sd_cuda_forward(sd_cuda_model *cm, sd_cuda_cache *c, const sd_cuda_batch *b,
                          float *logits);

/* ---- decoding steps on the device ---------------------------------------------------------- */

/* Sampling settings, as verify.h's sd_sampling. */
typedef struct {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
} sd_cuda_sampling;

/* The token chosen from the last forward's logits row `row`: greedy (argmax) or drawn with the
 * uniform keyed (seed, SD_STREAM_PLAIN, index); copied to *out (synchronises). */
sd_status sd_cuda_pick(sd_cuda_model *cm, int row, const sd_cuda_sampling *s, uint64_t seed,
                       uint64_t index, int32_t *out);

/* State of one speculative decoding call on the device: the batch [last, d1 .. dK] and, for
 * drafters with distributions, the drafts' processed rows q (K, V); the result of a step. */
typedef struct sd_cuda_spec sd_cuda_spec;
sd_status sd_cuda_spec_create(sd_cuda_spec **out, sd_cuda_model *cm, int K); /* K nodes at most */
void sd_cuda_spec_free(sd_cuda_spec *sp);
/* The device array of batch tokens (K + 1), and the one a model drafter's next forward reads
 * its input token from. */
int32_t *sd_cuda_spec_batch(sd_cuda_spec *sp);
int32_t *sd_cuda_spec_next_input(sd_cuda_spec *sp);
/* Make waiter's stream wait for the work queued so far on producer's (a draft model and its
 * target share the step's device buffers). No host synchronisation. */
sd_status sd_cuda_model_join(sd_cuda_model *waiter, sd_cuda_model *producer);

/* One draft token of a model drafter: process the draft model dm's last logits row into
 * q[i], pick d(i+1) (greedy, or drawn with (seed, SD_STREAM_DRAFT, pos0 + i)) into batch[1 + i];
 * with p_min > 0, the first i whose token the draft gave less than p_min marks the draft's end
 * (drafts after it are computed but not verified). No synchronisation. */
sd_status sd_cuda_spec_draft_pick(sd_cuda_spec *sp, sd_cuda_model *dm, int i,
                                  const sd_cuda_sampling *s, uint64_t seed, uint64_t pos0,
                                  float p_min);
/* Start a step on the drafter dm's stream: batch[0] = last, the draft length mark = k. */
sd_status sd_cuda_spec_begin(sd_cuda_spec *sp, sd_cuda_model *dm, int32_t last, int k);

/* The verify step after the target's forward over batch[0 .. k]: process its k + 1 logits
 * rows, run the chain rule of verify.h against q (with_q) or one-hot drafts, with uniforms
 * keyed (seed, SD_STREAM_ACCEPT / SD_STREAM_EMIT, pos0 + i); then copy to the host (the one
 * synchronisation of a step) *n_acc, the drafts (k) into drafts, the emitted token *next and
 * the draft length the p_min mark left (*k_used <= k). */
sd_status sd_cuda_spec_verify(sd_cuda_spec *sp, sd_cuda_model *target, int k, int with_q,
                              const sd_cuda_sampling *s, uint64_t seed, uint64_t pos0, int *n_acc,
                              int32_t *drafts, int32_t *next, int *k_used);

/* The verify step of a tree of n deterministic nodes (tokens, parents on the host) after the
 * target's forward over [last, nodes] with the tree's mask: process its n + 1 logits rows, run
 * the tree rule of verify.h (sd_verify_tree) with uniforms keyed as the CPU loop keys them (node
 * i: (seed, SD_STREAM_TREE, out_pos * SD_MAX_TREE_NODES + i); the token after a accepted nodes:
 * (seed, SD_STREAM_EMIT, out_pos + a)); copy back *n_acc, the path (*n_acc nodes) and *next:
 * the step's one synchronisation. */
sd_status sd_cuda_spec_verify_tree(sd_cuda_spec *sp, sd_cuda_model *target, int n,
                                   const int32_t *tokens, const int32_t *parent,
                                   const sd_cuda_sampling *s, uint64_t seed, uint64_t out_pos,
                                   int *n_acc, int32_t *path, int32_t *next);

/* After a verify step: the ids of the `top` largest logits of each of its `rows` rows (still in
 * the model's logits buffer) into ids (rows, top) on the host (sd_top_ids's order); one
 * synchronisation. */
sd_status sd_cuda_spec_row_top(sd_cuda_spec *sp, sd_cuda_model *target, int rows, int top,
                               int32_t *ids);

/* Benchmarks only (sd_bench_synthetic): after the target's forward over batch[0 .. k], accept
 * each draft with probability alpha (uniforms keyed (seed, SD_STREAM_SYNTH, pos0 + i)) instead
 * of by the rule, and take the argmax of the row after the accepted ones as the next token;
 * copies *n_acc and *next to the host. */
sd_status sd_cuda_spec_synthetic(sd_cuda_spec *sp, sd_cuda_model *target, int k, double alpha,
                                 uint64_t seed, uint64_t pos0, int *n_acc, int32_t *next);

/* ---- benchmarks ---------------------------------------------------------------------------- */

/* Wait for the model's queued work. */
sd_status sd_cuda_model_sync(sd_cuda_model *cm);
/* Seconds per device-to-device copy of `bytes` on GPU `gpu` (mean of iters, after a warm-up;
 * each copy reads and writes `bytes`): the memory bandwidth ceiling. */
sd_status sd_cuda_copy_bench(int gpu, size_t bytes, int iters, double *seconds);

/* ---- kernel checks --------------------------------------------------------------------------- */

/* A context for single launches (stream and scratch, no model): the kernel checks. */
sd_status sd_cuda_ctx_create(sd_cuda_ctx **out);
void sd_cuda_ctx_free(sd_cuda_ctx *ctx);
sd_status sd_cuda_alloc(sd_cuda_ctx *ctx, void **dev, size_t bytes);
void sd_cuda_free(sd_cuda_ctx *ctx, void *dev);
sd_status sd_cuda_upload(sd_cuda_ctx *ctx, void *dev, const void *host, size_t bytes);
sd_status sd_cuda_download(sd_cuda_ctx *ctx, void *host, const void *dev, size_t bytes);
sd_status sd_cuda_sync(sd_cuda_ctx *ctx);

/* Launchers with the twins' arguments (twins.h), device pointers, after the context. */
sd_status sd_cuda_embed(sd_cuda_ctx *ctx, float *out, const void *table, int type, int64_t D,
                        const int32_t *tokens, int T);
sd_status sd_cuda_rmsnorm(sd_cuda_ctx *ctx, float *out, const float *x, const float *w, int T,
                          int n, float eps);
sd_status sd_cuda_rope(sd_cuda_ctx *ctx, float *x, const int32_t *pos, const double *freq, int T,
                       int n_heads, int head_dim, int neox);
sd_status sd_cuda_swiglu(sd_cuda_ctx *ctx, float *out, const float *gate, const float *up,
                         int64_t n);
/* out (T, 2n) = cat(rmsnorm(e) * w_in, rmsnorm(x) * w_hid) (x = the second half too when
 * norm_residual): an EAGLE-3 head layer's input. */
sd_status sd_cuda_head_input(sd_cuda_ctx *ctx, float *out, const float *e, float *x,
                             const float *w_in, const float *w_hid, int T, int n, float eps,
                             int norm_residual);
/* x += silu(u): a Medusa residual block. */
sd_status sd_cuda_silu_add(sd_cuda_ctx *ctx, float *x, const float *u, int64_t n);
sd_status sd_cuda_kv_write(sd_cuda_ctx *ctx, float *kc, float *vc, const float *k, const float *v,
                           const int32_t *slots, int T, int n_kv_heads, int head_dim, int capacity);
sd_status sd_cuda_attention(sd_cuda_ctx *ctx, float *out, const float *q, const float *kc,
                            const float *vc, const uint8_t *mask, int T, int n_attn, int n_heads,
                            int n_kv_heads, int head_dim, int capacity);
sd_status sd_cuda_matmul(sd_cuda_ctx *ctx, float *y, int64_t ldy, const void *w, int type,
                         int64_t rows, int64_t cols, const float *x, int T, const float *bias,
                         int accumulate);
/* The BF16 matmul on the tensor cores (cols % 64 == 0; sd_cuda_matmul takes it for BF16 when
 * SPECDEC_CUDA_MMA=1): the same twin, x split into two bf16 halves (about 2^-16 relative). */
sd_status sd_cuda_matmul_mma(sd_cuda_ctx *ctx, float *y, int64_t ldy, const void *w, int type,
                             int64_t rows, int64_t cols, const float *x, int T, const float *bias,
                             int accumulate);
sd_status sd_cuda_process(sd_cuda_ctx *ctx, float *probs, const float *logits, int rows, int V,
                          float temperature, int top_k, float top_p, float min_p);
sd_status sd_cuda_argmax(sd_cuda_ctx *ctx, int32_t *out, const float *x, int rows, int V);
sd_status sd_cuda_sample(sd_cuda_ctx *ctx, int32_t *out, const float *probs, int rows, int V,
                         uint64_t seed, uint64_t stream, uint64_t index0);
sd_status sd_cuda_verify(sd_cuda_ctx *ctx, int32_t *result, const float *p, const float *q,
                         const int32_t *draft, int K, int V, uint64_t seed, uint64_t pos0);
/* out (rows, top): the ids of each row's top largest values (sd_top_ids). */
sd_status sd_cuda_row_top(sd_cuda_ctx *ctx, int32_t *out, const float *x, int rows, int V, int top);
/* result (2 + n): accepted nodes, the next token, the path (sd_verify_tree, uniforms keyed by
 * out_pos as the CPU loop keys them). */
sd_status sd_cuda_verify_tree(sd_cuda_ctx *ctx, int32_t *result, const float *p, const float *q,
                              const int32_t *tokens, const int32_t *parent, int n, int V,
                              uint64_t seed, uint64_t out_pos);
sd_status sd_cuda_synthetic_accept(sd_cuda_ctx *ctx, int32_t *n_acc, int K, double alpha,
                                   uint64_t seed, uint64_t pos0);
sd_status sd_cuda_dummy_fill(sd_cuda_ctx *ctx, void *dst, int type, int64_t rows, int64_t cols,
                             uint64_t seed, uint64_t tensor, float scale);

#ifdef __cplusplus
}
#endif

#endif /* SD_CUDA_H */
