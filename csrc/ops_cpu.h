/* ops_cpu.h — the CPU operators of the forward pass. Output argument first; shapes in comments;
 * parallel ops take the pool and split their work into tasks. */
#ifndef SD_OPS_CPU_H
#define SD_OPS_CPU_H

#include <stdint.h>

#include "model.h"
#include "quant.h"
#include "threadpool.h"

/* out (T, n) = x (T, n) / sqrt(mean(x^2) + eps) * w (n); out may alias x. */
void sd_rmsnorm(float *out, const float *x, const float *w, int T, int n, float eps);

/* Rotate pairs of every head of x (T, n_heads*Dh) in place by angles whose cos/sin are in
 * cs (T, Dh) as (cos, sin) pairs for frequency i at cs[t*Dh + 2i]. neox: pairs (i, i + Dh/2);
 * else adjacent pairs (2i, 2i + 1). */
void sd_rope(float *x, const float *cs, int T, int n_heads, int head_dim, int neox);

/* One matrix product of a batch: y (T, W.rows) (=, or += when accumulate) x (T, W.cols) W^T. */
typedef struct {
    float *y;
    const float *x;
    const sd_mat *w;
    const float *bias; /* (W.rows) or NULL */
    int accumulate;
} sd_matmul_job;

/* Run n_jobs (<= 4) products over the same input x (same W.cols) in one parallel dispatch.
 * xq: scratch of T * SD_Q8_ROW_BYTES(W.cols) bytes for the quantized activations. */
void sd_matmul(sd_threadpool *pool, int T, const sd_matmul_job *jobs, int n_jobs,
               unsigned char *xq);

/* The same three, split over the pool by tokens (one task when T is small). */
void sd_quantize_rows(sd_threadpool *pool, unsigned char *xq, const float *x, int T, int64_t n);
void sd_swiglu_rows(sd_threadpool *pool, float *out, const float *gate, const float *up, int T,
                    int64_t n);
void sd_rmsnorm_rows(sd_threadpool *pool, float *out, const float *x, const float *w, int T, int n,
                     float eps);

/* out (T, F) = silu(gate) * up, elementwise; out may alias gate. sd_swiglu is this CPU's kernel
 * (quant.c picks it), sd_swiglu_ref the portable one. */
void sd_swiglu(float *out, const float *gate, const float *up, int64_t n);
void sd_swiglu_ref(float *out, const float *gate, const float *up, int64_t n);

/* One query row's attention: o (Dh) = softmax(scale * q . k_s over the slots s < n_attn with
 * m[s] != 0) weighted sum of v_s; k_s = k + s * ld, v_s likewise; at least one slot open.
 * sc: (n_attn) scratch. sd_attend is this CPU's kernel, sd_attend_ref the portable one. */
void sd_attend(float *o, const float *q, const float *k, const float *v, size_t ld,
               const uint8_t *m, int n_attn, int Dh, float scale, float *sc);
void sd_attend_ref(float *o, const float *q, const float *k, const float *v, size_t ld,
                   const uint8_t *m, int n_attn, int Dh, float scale, float *sc);

/* Attention of T queries q (T, H*Dh) over cache slots [0, n_attn) of one layer:
 * k, v (n_slots_total, Hkv*Dh); mask (T, n_attn) nonzero = attend. out (T, H*Dh).
 * scores: (n_threads, n_attn) scratch. */
void sd_attention(sd_threadpool *pool, float *out, const float *q, const float *k, const float *v,
                  const uint8_t *mask, int T, int n_attn, int n_heads, int n_kv_heads, int head_dim,
                  float *scores);

#endif /* SD_OPS_CPU_H */
