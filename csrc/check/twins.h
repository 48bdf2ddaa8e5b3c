/* twins.h — the CPU twin of every CUDA kernel launcher (cuda/sd_cuda.h): the same arguments
 * after the launcher's context, the same function of them up to float rounding. The kernel
 * checks (kcheck.c) run a launcher and its twin on the same inputs; the twins themselves are
 * checked against NumPy references, and most are the forward pass's own CPU kernels.
 * Arrays are row-major; T tokens. */
#ifndef SD_TWINS_H
#define SD_TWINS_H

#include <stddef.h>
#include <stdint.h>

/* out (T, D) = rows tokens[t] of the embedding table (V, D) of ggml type `type`, as floats. */
void sd_twin_embed(float *out, const void *table, int type, int64_t D, const int32_t *tokens,
                   int T);
/* out (T, n) = x / sqrt(mean(x^2) + eps) * w, per row. */
void sd_twin_rmsnorm(float *out, const float *x, const float *w, int T, int n, float eps);
/* Rotate every head of x (T, n_heads * head_dim) in place by the angles pos[t] * freq[i]
 * (freq: head_dim / 2 inverse frequencies); neox: pairs (i, i + Dh/2), else (2i, 2i + 1). */
void sd_twin_rope(float *x, const int32_t *pos, const double *freq, int T, int n_heads,
                  int head_dim, int neox);
/* out (n) = silu(gate) * up. */
void sd_twin_swiglu(float *out, const float *gate, const float *up, int64_t n);
/* out (T, 2n) rows cat(rmsnorm(e_t) * w_in, rmsnorm(x_t) * w_hid): the attention input of an
 * EAGLE-3 head's layer (its token's embedding e, its fused feature x); with norm_residual, x_t
 * becomes rmsnorm(x_t) * w_hid as well (the residual of speculators' norm_before_residual). */
void sd_twin_head_input(float *out, const float *e, float *x, const float *w_in, const float *w_hid,
                        int T, int n, float eps, int norm_residual);
/* x (n) += silu(u): a Medusa residual block y + SiLU(W y + b) after its linear layer. */
void sd_twin_silu_add(float *x, const float *u, int64_t n);
/* One layer's cache kc, vc (n_kv_heads, capacity, head_dim): token t's rows of k and v
 * (T, n_kv_heads * head_dim) go to slot slots[t]. */
void sd_twin_kv_write(float *kc, float *vc, const float *k, const float *v, const int32_t *slots,
                      int T, int n_kv_heads, int head_dim, int capacity);
/* out (T, n_heads * head_dim) = softmax(q . k / sqrt(head_dim)) v over the slots s < n_attn
 * that mask (T, n_attn) opens (at least one per row), one layer's kc, vc as above. */
void sd_twin_attention(float *out, const float *q, const float *kc, const float *vc,
                       const uint8_t *mask, int T, int n_attn, int n_heads, int n_kv_heads,
                       int head_dim, int capacity);
/* y (T, ldy) (= or += when accumulate) x (T, cols) W^T (+ bias (rows)) for W = rows rows of
 * `type`; the products of the dequantized weights with f32 activations, summed in double. */
void sd_twin_matmul(float *y, int64_t ldy, const void *w, int type, int64_t rows, int64_t cols,
                    const float *x, int T, const float *bias, int accumulate);
/* probs (rows, V) = the processed distributions of logits (rows, V) (verify.h). */
void sd_twin_process(float *probs, const float *logits, int rows, int V, float temperature,
                     int top_k, float top_p, float min_p);
/* out (rows) = the argmax of each row (lowest index on ties). */
void sd_twin_argmax(int32_t *out, const float *x, int rows, int V);
/* out (rows) = the token drawn from probs row r with the uniform (seed, stream, index0 + r). */
void sd_twin_sample(int32_t *out, const float *probs, int rows, int V, uint64_t seed,
                    uint64_t stream, uint64_t index0);
/* result (2) = {accepted drafts, next token} of the chain rule over K drafts: p (K + 1, V),
 * q (K, V) or NULL (one-hot drafts), uniforms keyed (seed, SD_STREAM_ACCEPT / SD_STREAM_EMIT,
 * pos0 + i) as the decoding loops key them. */
void sd_twin_verify(int32_t *result, const float *p, const float *q, const int32_t *draft, int K,
                    int V, uint64_t seed, uint64_t pos0);
/* out (rows, top): each row's top ids (sd_top_ids; sd_cuda_row_top's twin). */
void sd_twin_row_top(int32_t *out, const float *x, int rows, int V, int top);
/* result (2 + n): accepted nodes, the next token, the path: the tree rule (sd_verify_tree) with
 * the uniforms keyed by out_pos as the CPU loop keys them (sd_cuda_verify_tree's twin). */
void sd_twin_verify_tree(int32_t *result, const float *p, const float *q, const int32_t *tokens,
                         const int32_t *parent, int n, int V, uint64_t seed, uint64_t out_pos);
/* *n_acc = how many of K drafts the synthetic rule of benchmarks accepts: draft i while the
 * uniform (seed, SD_STREAM_SYNTH, pos0 + i) < alpha. */
void sd_twin_synthetic_accept(int32_t *n_acc, int K, double alpha, uint64_t seed, uint64_t pos0);
/* A dummy tensor (dummy.h): (rows, cols) of `type` as tensor id `tensor`. */
void sd_twin_dummy_fill(void *dst, int type, int64_t rows, int64_t cols, uint64_t seed,
                        uint64_t tensor, float scale);

#endif /* SD_TWINS_H */
