/* model.h — the model as the forward pass sees it: hyper-parameters, weight views (shapes in
 * comments, row-major, rows = output features), the KV cache and reusable scratch buffers. */
#ifndef SD_MODEL_H
#define SD_MODEL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "format/tensor.h"
#include "cpu/quant.h" /* sd_mat */
#include "format/safetensors.h"
#include "specdec.h"
#include "util/threadpool.h"

/* ---- the tensors of a model with random weights (dummy.c), found by name like a file's ---- */

typedef struct {
    uint64_t seed;
    int n;
    sd_tensor_info *t;    /* (n): GGUF names, shapes and types; tensor i is filled from id i */
    unsigned char *block; /* the bytes of the tensors kept on the host */
} sd_dummy;

/* The tensors of a model of shape c with matrices of `weight_type` (norms F32 ones, qwen2
 * biases small F32), random from `seed`. host_data: fill every tensor here; 0: only the norms
 * and biases (the matrices' data stays NULL, for a device to fill). */
sd_status sd_dummy_create(sd_dummy **out, const sd_config *c, int weight_type, uint64_t seed,
                          int host_data);
void sd_dummy_free(sd_dummy *d);
const sd_tensor_info *sd_dummy_find(const sd_dummy *d, const char *name);

/* Fill a (rows, cols) tensor of `type` as tensor id `tensor` of a dummy model (dummy.h); the
 * CPU twin of the CUDA fill kernel. */
void sd_dummy_fill(void *dst, int type, int64_t rows, int64_t cols, uint64_t seed, uint64_t tensor,
                   float scale);
/* The value range of a matrix with `cols` columns: 1 / sqrt(cols). */
float sd_dummy_scale(int64_t cols);

typedef struct {
    const float *attn_norm;      /* (D) */
    sd_mat wq;                   /* (H*Dh, D) */
    sd_mat wk;                   /* (Hkv*Dh, D) */
    sd_mat wv;                   /* (Hkv*Dh, D) */
    sd_mat wo;                   /* (D, H*Dh) */
    const float *bq;             /* (H*Dh) or NULL */
    const float *bk;             /* (Hkv*Dh) or NULL */
    const float *bv;             /* (Hkv*Dh) or NULL */
    const float *q_norm;         /* (Dh) per-head RMSNorm of q before RoPE (qwen3), or NULL */
    const float *k_norm;         /* (Dh) the same for k, or NULL */
    const float *attn_post_norm; /* (D) gemma3: RMSNorm of the attention output, or NULL */
    const float *ffn_norm;       /* (D) */
    const float *ffn_post_norm;  /* (D) gemma3: RMSNorm of the MLP output, or NULL */
    sd_mat w_gate;               /* (F, D) */
    sd_mat w_up;                 /* (F, D) */
    sd_mat w_down;               /* (D, F) */
    /* (D) EAGLE-3's norm of the feature half of its layer's (2D) input, or NULL; its attn_norm
     * then norms the token half, and wq/wk/wv are (., 2D) */
    const float *hidden_norm;
} sd_layer;

typedef struct {
    sd_mat tok_embd;       /* (V, D) */
    const float *out_norm; /* (D) */
    sd_mat output;         /* (V, D); the same view as tok_embd when tied */
    sd_layer *layers;      /* (L) */
    sd_mat fc;             /* (D, 2D or 3D) an EAGLE head's input projection (head.h), else none */
    const float *fc_bias;  /* (D) or NULL */
} sd_weights;

/* Activations of one forward, grown on demand to the largest batch seen. */
typedef struct {
    int cap_tokens;       /* T the buffers hold */
    int cap_attn;         /* attention columns the mask/score buffers hold */
    float *x;             /* (T, D) residual stream */
    float *xb;            /* (T, max(D, H*Dh)) normed input / attention output */
    float *q;             /* (T, H*Dh) */
    float *k;             /* (T, Hkv*Dh) */
    float *v;             /* (T, Hkv*Dh) */
    float *hb;            /* (T, F) gate, then SwiGLU product */
    float *hb2;           /* (T, F) up */
    float *rope_cs;       /* (T, Dh) cos/sin pairs per position */
    float *rope_cs_local; /* (T, Dh) the same at the local layers' frequencies (gemma3) */
    float *xo;            /* (T, D) a block's output before its post-norm (gemma3) */
    uint8_t *mask;        /* (T, cap_attn) effective attention mask */
    uint8_t *mask_local;  /* (T, cap_attn) the mask of sliding-window layers when not all slide */
    float *scores;        /* sd_attention_scratch(cap_attn, head_dim, n_threads) floats */
    unsigned char *xq;    /* T rows of SD_Q8_ROW_BYTES(max(D, H*Dh, F)): quantized activations */
    float *rowbuf;        /* (n_threads, max row length) dequantized weight rows */
} sd_scratch;

struct sd_cuda_model;
struct sd_cuda_cache;

/* Verify costs measured on a model, kept for the tree drafters made after the first one
 * (spec/drafter.c, sd_cost_curve_measure, reads and fills it; a speculator made for each call
 * would otherwise measure again, about a second each time on SmolLM2): the seconds of a
 * forward of T = 1 .. max_T tokens after ctx[0] and ctx[1] cached tokens, valid for the thread
 * count and cache type they were measured with. */
typedef struct {
    pthread_mutex_t lock; /* guards what follows */
    int asked;            /* the size the measurement was asked for; 0: nothing measured */
    int max_T;            /* the size measured (less where the context is short) */
    int threads;
    int kv_f16;
    int ctx[2];
    double secs[2][SD_MAX_TREE_NODES + 2];
} sd_model_costs;

struct sd_model {
    sd_config cfg;
    sd_weights w;
    sd_gguf *gguf;              /* owner of the mapping when loaded from GGUF */
    sd_st_set *st;              /* owner of the mappings when loaded from safetensors */
    sd_dummy *dummy;            /* owner of the tensors of a model with random weights */
    int device;                 /* sd_device */
    struct sd_cuda_model *cuda; /* the device copy and state when device == SD_DEVICE_CUDA */
    float *vectors;             /* f32 copies of norms and biases (small; read every token) */
    void *packed;               /* one block holding the repacked matrices, or NULL */
    double *rope_freq;          /* (Dh/2) inverse frequencies, after any RoPE scaling */
    double *rope_freq_local;    /* (Dh/2) those of the sliding-window layers (gemma3), or NULL */
    sd_threadpool *pool;
    sd_scratch s;
    char *pieces;      /* token piece bytes, back to back (sd_model_set_token_pieces) */
    size_t *piece_off; /* (V + 1) offsets into pieces, or NULL */
    size_t weight_bytes;
    int kv_f16; /* caches created from now on keep keys and values as IEEE halves (CPU only) */
    struct sd_sched *sched;    /* the step scheduler of the requests running on it (sched.h) */
    struct sd_kv_pool *prefix; /* caches of finished requests, for prefix reuse (kv_cache.c);
                                * NULL for a CUDA model */
    int borrowed_pool;         /* a drafter head runs on its target's pool (not freed here) */
    sd_model_costs costs;      /* measured verify costs (its lock made by sd_model_alloc) */
};

struct sd_kv_cache {
    int capacity; /* slots */
    int length;   /* live slots [0, length) */
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int f16;    /* keys and values are IEEE halves (uint16_t), else f32 */
    int stride; /* slots per KV head: capacity rounded up to whole key tiles (sd_kv_slots) */
    /* (L, Hkv, stride, Dh): each KV head's keys and values are contiguous, so attention streams
     * them; the keys in tiles of SD_KV_TILE slots (sd_key_at, ops_cpu.h), the values in rows */
    void *k;      /* post-RoPE keys (NULL for a CUDA model's cache: they live on the device) */
    void *v;      /* values (likewise) */
    size_t bytes; /* of k and of v each (sd_alloc_zeroed) */
    int32_t *pos; /* (capacity) RoPE position of each slot, on the host for every backend */
    struct sd_cuda_cache *cuda; /* a CUDA model's keys and values, or NULL */
};

/* Offset (in elements) of the value row of `slot` in KV head `head` of `layer`; with slot 0,
 * where that head's keys and values begin. */
static inline size_t sd_kv_row(const sd_kv_cache *kv, int layer, int head, int slot) {
    return (((size_t)layer * (size_t)kv->n_kv_heads + (size_t)head) * (size_t)kv->stride +
            (size_t)slot) *
           (size_t)kv->head_dim;
}

/* Bytes of one element of the host cache, and the address of element `off` of p (kv->k or
 * kv->v). */
static inline size_t sd_kv_elt(const sd_kv_cache *kv) {
    return kv->f16 ? sizeof(uint16_t) : sizeof(float);
}
static inline void *sd_kv_at(const sd_kv_cache *kv, void *p, size_t off) {
    return (char *)p + off * sd_kv_elt(kv);
}

/* Prefix reuse: a model keeps the caches of its last prefix_max finished requests, each with
 * the tokens its slots hold, so that a request starting with the same tokens (a chat's next
 * turn, a shared system prompt) takes their keys and values instead of computing them again:
 * a token's keys and values do not depend on the batch that wrote them, so the bits are the
 * same. Safe from several threads (the pool has its own lock). CPU models only. */
/* A pool keeping at most max caches (its size changed by sd_kv_pool_resize, which frees the
 * least recently used beyond it). */
sd_status sd_kv_pool_create(struct sd_kv_pool **out, int max);
void sd_kv_pool_resize(struct sd_kv_pool *pool, int max);
int sd_kv_pool_max(struct sd_kv_pool *pool);
/* The features a drafter reads (EAGLE), kept row by row beside a pooled cache so that its
 * requests can reuse a prefix too: per slot, the final-normed hidden state (D floats, when
 * `hidden`), then the inputs of layers aux[0 .. n_aux) (D floats each). Like keys and values,
 * a token's features do not depend on the batch that computed them. */
typedef struct {
    int hidden;
    int n_aux;
    int32_t aux[SD_MAX_AUX_LAYERS];
} sd_feat_kind;

/* Gives `kv`, whose slots [0, kv->length) hold toks[0 .. kv->length), to m's pool (which owns
 * it from now on; it is freed when the pool is off, or a CUDA model's). feat (NULL: none), rows
 * of the kind *fk for at least those slots, goes with it, owned by the pool as well. */
sd_status sd_kv_pool_put(sd_model *m, sd_kv_cache *kv, const int32_t *toks, float *feat,
                         const sd_feat_kind *fk);
/* The pooled cache sharing the longest prefix with toks[0 .. n), at most max_reuse tokens of
 * it: *out receives a cache of at least `capacity` slots holding that prefix (*reused tokens;
 * the pool's own when large enough, else a copy) and leaves the pool; or NULL and 0. With want
 * (a drafter's features), only a cache kept with features of that kind is taken, and *feat
 * receives them (rows [0, *reused) of them hold the prefix; the caller frees them); else *feat
 * is NULL (feat may be NULL when want is). */
sd_status sd_kv_pool_take(sd_model *m, const int32_t *toks, int n, int max_reuse, int capacity,
                          const sd_feat_kind *want, sd_kv_cache **out, int *reused, float **feat);
void sd_kv_pool_free(struct sd_kv_pool *pool);

/* Slots [length, n) join the cache without keys or values computed (they keep what they hold:
 * zeros in a fresh cache), each at the position of its index; for a model whose attention never
 * reaches them (a sliding window over later positions). length <= n <= capacity. */
sd_status sd_kv_cache_skip(sd_kv_cache *kv, int n);

/* A zeroed model with its costs' lock made (sd_model_free undoes both), or NULL. */
sd_model *sd_model_alloc(void);

/* Grow scratch buffers for a batch of n_tokens attending n_attn columns. */
sd_status sd_scratch_reserve(sd_model *m, int n_tokens, int n_attn);

#endif /* SD_MODEL_H */
