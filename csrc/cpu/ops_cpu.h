/* ops_cpu.h — the CPU operators of the forward pass. Output argument first; shapes in comments;
 * parallel ops take the pool and split their work into tasks. */
#ifndef SD_OPS_CPU_H
#define SD_OPS_CPU_H

#include <stdint.h>
#include <string.h>

#include "cpu/quant.h"
#include "util/threadpool.h"

/* out (T, n) = x (T, n) / sqrt(mean(x^2) + eps) * w (n); out may alias x. */
void sd_rmsnorm(float *out, const float *x, const float *w, int T, int n, float eps);

/* out (T, 2n) rows cat(rmsnorm(e_t) * w_in, rmsnorm(x_t) * w_hid), row by row: an EAGLE-3
 * head layer's attention input; with norm_residual x_t becomes the second half as well. */
void sd_head_input_rows(float *out, const float *e, float *x, const float *w_in, const float *w_hid,
                        int T, int n, float eps, int norm_residual);

/* x (n) += silu(u) = u / (1 + exp(-u)): a Medusa residual block after its linear layer. */
void sd_silu_add(float *x, const float *u, int64_t n);

/* Rotate pairs of every head of x (T, n_heads*Dh) in place by angles whose cos/sin are in
 * cs (T, Dh) as (cos, sin) pairs for frequency i at cs[t*Dh + 2i]. neox: pairs (i, i + Dh/2);
 * else adjacent pairs (2i, 2i + 1). */
void sd_rope(float *x, const float *cs, int T, int n_heads, int head_dim, int neox);
/* sd_rope over the first n_rot dimensions of each head (even, <= Dh), the rest left as they
 * are: frequencies i < n_rot/2, pairs (i, i + n_rot/2) or (2i, 2i + 1). Phi-4-mini's partial
 * rotary embeddings, as transformers and llama.cpp compute them. */
void sd_rope_part(float *x, const float *cs, int T, int n_heads, int head_dim, int n_rot, int neox);

/* One matrix product of a batch: y (T, W.rows) (=, or += when accumulate) x (T, W.cols) W^T. */
typedef struct {
    float *y;
    const float *x;
    const sd_mat *w;
    const float *bias; /* (W.rows) or NULL */
    int accumulate;
} sd_matmul_job;

/* Run n_jobs (<= 4) products over the same input x (same W.cols) in one parallel dispatch.
 * xq: the quantized activations, SD_Q8_BATCH_BYTES(T, W.cols) bytes, when the weights take them
 * (sd_matmul_wants_q8): filled here, or already by the op that made x when xq_ready. */
void sd_matmul(sd_threadpool *pool, int T, const sd_matmul_job *jobs, int n_jobs, unsigned char *xq,
               int xq_ready);
/* Whether these products read their input quantized (some weight is of a quantized type). */
int sd_matmul_wants_q8(const sd_matmul_job *jobs, int n_jobs);

/* x (T, n) quantized into the batch buffer xq (SD_Q8_BATCH_BYTES(T, n)), with the gathered
 * scalars the kernels want for T tokens. */
void sd_quantize_rows(sd_threadpool *pool, unsigned char *xq, const float *x, int T, int64_t n);
/* The same three split over the pool by tokens (one task when T is small); swiglu and rmsnorm
 * also quantize their output into xq as sd_quantize_rows does, when xq is not NULL, which saves
 * the matmul that reads it a dispatch. */
void sd_swiglu_rows(sd_threadpool *pool, float *out, const float *gate, const float *up, int T,
                    int64_t n, unsigned char *xq);
void sd_geglu_rows(sd_threadpool *pool, float *out, const float *gate, const float *up, int T,
                   int64_t n, unsigned char *xq);
void sd_rmsnorm_rows(sd_threadpool *pool, float *out, const float *x, const float *w, int T, int n,
                     float eps, unsigned char *xq);

/* Sampling's softmax over a row of logits: e[i] = exp((x[i] - mx) / t) for i < n (t > 0), each
 * by sd_hd_expf's arithmetic (util/hd.h), and their sum returned in double, added in eight lanes
 * (lane i mod 8, in order of i), then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)): the same
 * bits from every kernel. e may alias x. sd_softmax_exp is this CPU's kernel, _ref the portable
 * one. */
double sd_softmax_exp(float *e, const float *x, int64_t n, float mx, float t);
double sd_softmax_exp_ref(float *e, const float *x, int64_t n, float mx, float t);
/* The sum of x[0 .. n) in double as sd_softmax_exp adds its exponentials (eight lanes by i mod 8,
 * then pairwise), the same bits from every kernel. */
double sd_sum_f32(const float *x, int64_t n);
double sd_sum_f32_ref(const float *x, int64_t n);
/* The index of the largest x[i], i < n (the lowest on ties, NaNs passed over; 0 when x[0] is a
 * NaN or n < 1), the same from every kernel. */
int64_t sd_argmax_f32(const float *x, int64_t n);
int64_t sd_argmax_f32_ref(const float *x, int64_t n);

/* out (T, F) = silu(gate) * up, elementwise; out may alias gate. sd_swiglu is this CPU's kernel
 * (cpu/dispatch.c picks it), sd_swiglu_ref the portable one. */
void sd_swiglu(float *out, const float *gate, const float *up, int64_t n);
void sd_swiglu_ref(float *out, const float *gate, const float *up, int64_t n);
/* GeGLU's constants: 0.044715, and 2 sqrt(2 / pi) in float. */
#define SD_GELU_CUBIC 0.044715f
#define SD_GELU_2C 1.5957691216057308f
/* out = gelu(gate) * up with GELU's tanh form (Gemma's GeGLU), 0.5 x (1 + tanh(c (x + 0.044715
 * x^3))), c = sqrt(2 / pi), computed as x / (1 + exp(-2 c (x + 0.044715 x^3))), the same
 * function; out may alias gate. Kernel and portable twin as for swiglu. */
void sd_geglu(float *out, const float *gate, const float *up, int64_t n);
void sd_geglu_ref(float *out, const float *gate, const float *up, int64_t n);

/* Queries that attend over the same keys and values (heads sharing a KV head, tokens of a
 * batch), up to SD_ATTN_GROUP of them. */
#define SD_ATTN_GROUP 16
/* The largest head size the CPU attention takes (the model loaders refuse larger ones). */
#define SD_MAX_HEAD_DIM 512
typedef struct {
    int n;                           /* 1 <= n <= SD_ATTN_GROUP */
    float *o[SD_ATTN_GROUP];         /* (Dh) outputs */
    float *st[SD_ATTN_GROUP];        /* (2) out: the largest score, sum of exp(score - largest) */
    const float *q[SD_ATTN_GROUP];   /* (Dh) queries */
    const uint8_t *m[SD_ATTN_GROUP]; /* (n_attn) masks: nonzero = attend, at least one */
} sd_attn_group;

/* Attention of each query of g: o = the softmax(scale * q . k_s over the slots s < n_attn its
 * mask opens) weighted sum of v_s; k: one KV head's keys in tiles (SD_KV_TILE below; the tile
 * of slot n_attn - 1 whole: its later slots are read and their scores dropped), v (n_attn, Dh):
 * its values in rows; f32 or (kv_f16) IEEE halves. sc: (SD_ATTN_GROUP, n_attn) scratch. sd_attend
 * is this CPU's kernel, sd_attend_ref the portable one. */
void sd_attend(const sd_attn_group *g, const void *k, const void *v, int kv_f16, int n_attn, int Dh,
               float scale, float *sc);
void sd_attend_ref(const sd_attn_group *g, const void *k, const void *v, int kv_f16, int n_attn,
                   int Dh, float scale, float *sc);
/* sd_attend_ref over f32 keys in rows (n_attn, Dh), as the CUDA backend's cache holds them: the
 * CPU twin of its attention kernel (twins.c). */
void sd_attend_rows_ref(const sd_attn_group *g, const float *k, const float *v, int n_attn, int Dh,
                        float scale, float *sc);

/* The slots of a cache, in runs of SD_ATTN_CHUNK from slot 0, are attended one run at a time
 * (sd_attend over the run), and a query's runs are then weighed together by their softmax sums
 * (a context of one run is left as sd_attend gives it). The runs sit at the same slots whatever
 * the batch and the threads, so a query keeps its bits; and the runs of one KV head can go to
 * different threads, which then read its keys and values once between them. */
#define SD_ATTN_CHUNK 512

/* Keys in a CPU cache lie in tiles of SD_KV_TILE slots, dimension-major: element d of slot
 * SD_KV_TILE t + i sits at t SD_KV_TILE Dh + d SD_KV_TILE + i. A vector load then holds one
 * dimension of sixteen keys, and a query's sixteen dot products are vertical multiply-adds
 * with no horizontal sums. A tile takes the room of SD_KV_TILE rows, so a run of slots from a
 * multiple of SD_KV_TILE starts at element s Dh as rows would (the runs above do); a KV head
 * holds its slots rounded up to whole tiles (sd_kv_slots). Values stay in rows. */
#define SD_KV_TILE 16
_Static_assert(SD_ATTN_CHUNK % SD_KV_TILE == 0, "runs of slots start at a tile");

/* Offset (in elements) of dimension d of slot `slot` in a KV head's tiled keys. */
static inline size_t sd_key_at(int slot, int d, int Dh) {
    return ((size_t)(slot / SD_KV_TILE) * (size_t)Dh + (size_t)d) * SD_KV_TILE +
           (size_t)(slot % SD_KV_TILE);
}

/* Slots a KV head's keys and values take for n of them: whole tiles. */
static inline int sd_kv_slots(int n) {
    return (n + SD_KV_TILE - 1) / SD_KV_TILE * SD_KV_TILE;
}

/* A key row (Dh floats) into slot `slot` of tiled keys k, f32 or (f16) IEEE halves rounded as
 * sd_f32_to_f16_row rounds; out of it as floats (halves widen exactly); and copied between
 * slots of one head unchanged. */
void sd_key_put(void *k, int f16, int slot, int Dh, const float *row);
void sd_key_get(float *row, const void *k, int f16, int slot, int Dh);
void sd_key_copy(void *k, int f16, int dst, int src, int Dh);

/* One past the last nonzero of m[0 .. n) (0 if none): the end of a mask row's open slots. */
static inline int sd_mask_end(const uint8_t *m, int n) {
    while (n >= 8) { /* eight at a time: a causal prefill's rows end in long shut runs */
        uint64_t w;
        memcpy(&w, m + n - 8, 8);
        if (w != 0) {
            break;
        }
        n -= 8;
    }
    while (n > 0 && m[n - 1] == 0) {
        n--;
    }
    return n;
}

/* Floats of scratch sd_attention needs for any batch over n_attn slots on n_threads. */
size_t sd_attention_scratch(int n_attn, int head_dim, int n_threads);

/* Attention of T queries q (T, H*Dh) over cache slots [0, n_attn) of one layer: k, v
 * (Hkv, head_stride / Dh, Dh) of f32 or (kv_f16) IEEE halves, KV head h's keys (in tiles) and
 * values (in rows) head_stride elements after KV head h - 1's, head_stride a multiple of
 * SD_KV_TILE Dh; mask (T, n_attn) nonzero = attend. out (T, H*Dh).
 * scratch: sd_attention_scratch(n_attn, Dh, the pool's threads) floats. */
void sd_attention(sd_threadpool *pool, float *out, const float *q, const void *k, const void *v,
                  int kv_f16, size_t head_stride, const uint8_t *mask, int T, int n_attn,
                  int n_heads, int n_kv_heads, int head_dim, float *scratch);
/* sd_attention with Gemma 2's soft-cap: each scaled score s is cap * tanh(s / cap) before the
 * softmax (softcap > 0; 0 = sd_attention). Capped attention runs the portable kernel. */
void sd_attention_capped(sd_threadpool *pool, float *out, const float *q, const void *k,
                         const void *v, int kv_f16, size_t head_stride, const uint8_t *mask, int T,
                         int n_attn, int n_heads, int n_kv_heads, int head_dim, float softcap,
                         float *scratch);

#endif /* SD_OPS_CPU_H */
