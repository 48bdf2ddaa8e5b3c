/* backend_cuda.cu — the CUDA backend: a model's weights in one device allocation, the KV
 * caches, the forward pass over a batch (the same steps as csrc/model/forward.c, kernel for
 * kernel), CUDA Graphs for the short fixed-shape forwards of decoding, and the device side of
 * the decoding loops (picking, drafting, verifying), whose only host synchronisation per step
 * is the copy of the step's result. */
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "sampling.cuh"
extern "C" {
#include "../csrc/model/model.h"
}

/* A matrix on the device: rows of `cols` elements of `type`, rows contiguous. */
typedef struct {
    const void *w;
    int type;
    int64_t rows, cols;
} dmat;

typedef struct {
    const float *attn_norm, *ffn_norm, *bq, *bk, *bv; /* (D), (D), (QD), (KVD), (KVD) or NULL */
    const float *hidden_norm; /* (D) an EAGLE-3 head's norm of its fused feature, or NULL */
    dmat wq, wk, wv, wo, gate, up, down; /* an EAGLE-3 head's wq, wk, wv: (., 2D) */
} dlayer;

/* The features a forward copies out (sd_cuda_batch's): the final-normed hidden states, and
 * the residual stream entering n_aux layers. */
typedef struct {
    int hidden, n_aux;
    int32_t layers[SD_MAX_AUX_LAYERS];
} feat_req;

/* A captured forward, found by its shape: every buffer it reads is the model's own (the
 * cache through the device descriptor in_kv, tokens copied into in_tokens first). */
typedef struct {
    int T, n_logits, n_layers;
    feat_req fr; /* the features it copies out */
    cudaGraphExec_t exec;
} graph_entry;

#define MAX_GRAPHS 96
#define GRAPH_MAX_TOKENS (SD_MAX_DRAFT + 1) /* verify batches and draft steps */
#define STAGE_SLOTS (SD_MAX_DRAFT + 8)      /* more than the forwards between two syncs */
#define STAGE_TOKENS (SD_MAX_DRAFT + 1)
#define CUBLAS_MIN_TOKENS 65 /* longer batches of float weights: cuBLAS (prefill) */

struct sd_cuda_model {
    sd_cuda_ctx ctx;
    sd_config cfg;
    uint8_t *weights; /* the one allocation of every weight */
    size_t weight_bytes;
    dmat tok_embd, output; /* a head's: the target's embeddings (and EAGLE-1/2's output) */
    const float *out_norm; /* NULL: none (an EAGLE-1/2 head) */
    dlayer *layers;        /* (L) host array of device views */
    double *rope_freq;     /* (Dh / 2) device */

    /* activations, for cap_tokens tokens and cap_attn attended slots */
    int cap_tokens, cap_attn, cap_logits;
    float *x, *xb, *q, *k, *v, *hb, *hb2; /* (T, D), (T, max(D, QD)), ... as sd_scratch */
    float *logits;                        /* (cap_logits, V) */
    float *feat;     /* (1 + n_aux, T, D) features asked for: hidden, then aux layers */
    size_t feat_cap; /* floats feat holds (0 until a forward asks for features) */
    uint16_t *xh;    /* (T, max cols) halves for cuBLAS */
    int32_t *in_tokens, *in_pos, *in_slots; /* (cap_tokens) */
    int *in_n_attn;                         /* (1) */
    sd_cuda_kv_desc *in_kv;                 /* (1) the cache of this forward (never moves) */
    uint8_t *in_mask;                       /* (cap_tokens, cap_attn), rows n_attn apart */

    /* pinned staging of the inputs of short batches; slot i is reused only after its event */
    uint8_t *stage[STAGE_SLOTS];
    cudaEvent_t stage_ev[STAGE_SLOTS];
    size_t stage_bytes;
    int stage_next;

    /* decoding */
    float *probs; /* (SPEC_ROWS, V) */
    float *work;  /* (2 V) */
    sd_cuda_sorter sorter;
    int32_t *pick_dev;  /* (2) */
    int32_t *pick_host; /* (2) pinned */
    cudaEvent_t join_ev;
    /* a speculative call's device state (one call at a time per model): batch (SD_MAX_DRAFT + 1),
     * result (2), k_stop (1), next_in (1), then a tree's tokens and parents (SD_MAX_TREE_NODES
     * each) and its result (2 + SD_MAX_TREE_NODES); q (SD_MAX_DRAFT, V); host copy (3 +
     * SD_MAX_DRAFT, then TREE_INTS) */
    int32_t *spec_ints;
    float *spec_q;
    int32_t *spec_host;

    int use_graphs, use_cublas;
    graph_entry graphs[MAX_GRAPHS];
    int n_graphs;
};

/* Rows a verify step processes at most: a tree of SD_MAX_TREE_NODES nodes and its root (a chain
 * has at most SD_MAX_DRAFT drafts, fewer). */
#define SPEC_ROWS (SD_MAX_TREE_NODES + 1)
/* A tree's device ints: tokens and parents (SD_MAX_TREE_NODES each), result (2 + nodes); then
 * the verified rows' top ids (SPEC_ROWS, SD_RECYCLE_MAX_TOP). */
#define TREE_INTS (3 * SD_MAX_TREE_NODES + 2 + SPEC_ROWS * SD_RECYCLE_MAX_TOP)
#define SPEC_INTS (SD_MAX_DRAFT + 5 + TREE_INTS)

struct sd_cuda_cache {
    sd_cuda_model *cm;
    int capacity;
    float *k, *v; /* (L, Hkv, capacity, Dh) */
};

struct sd_cuda_spec {
    sd_cuda_model *cm; /* the target */
    int K, V;
    int32_t *batch;   /* (K + 1) [last, d1 .. dK] */
    float *q;         /* (K, V) draft rows */
    int32_t *result;  /* (2) accepted, next */
    int32_t *k_stop;  /* (1) draft length after p_min */
    int32_t *next_in; /* (1) a model drafter's next input */
    int32_t *tree;    /* (TREE_INTS) a tree's tokens, parents and result */
    int32_t *host;    /* pinned: result, k_stop, drafts (3 + K); from host + 3 + SD_MAX_DRAFT,
                       * a tree's (TREE_INTS) */
};

static int env_flag(const char *name, int dflt) {
    const char *v = getenv(name);
    if (v == NULL || *v == '\0') {
        return dflt;
    }
    return strcmp(v, "0") != 0;
}

/* Every entry point makes the model's GPU current first: the calling thread may have another
 * one current (other models, other threads, kernel checks). */
#define USE_DEVICE(cm) SD_CUDA_TRY(cudaSetDevice((cm)->ctx.device))

/* ---- graphs ------------------------------------------------------------------------------------
 */

static void graphs_clear(sd_cuda_model *cm) {
    for (int i = 0; i < cm->n_graphs; i++) {
        cudaGraphExecDestroy(cm->graphs[i].exec);
    }
    cm->n_graphs = 0;
}

/* ---- model -------------------------------------------------------------------------------------
 */

static size_t mat_bytes(const sd_mat *w) {
    return (size_t)w->rows * w->row_bytes;
}

/* Place (and fill) one matrix in the block at *off. */
static sd_status put_mat(sd_cuda_model *cm, dmat *out, const sd_mat *w, size_t *off,
                         const sd_model *m) {
    uint8_t *dst = cm->weights + *off;
    out->w = dst;
    out->type = w->type;
    out->rows = w->rows;
    out->cols = w->cols;
    if (w->data != NULL) {
        SD_CUDA_TRY(
            cudaMemcpyAsync(dst, w->data, mat_bytes(w), cudaMemcpyHostToDevice, cm->ctx.stream));
        /* pageable host memory: the call returns once the bytes are staged */
    } else if (m->dummy != NULL && w->tensor_id >= 0) {
        SD_TRY(sd_cuda_dummy_fill(&cm->ctx, dst, w->type, w->rows, w->cols, m->dummy->seed,
                                  (uint64_t)w->tensor_id, sd_dummy_scale(w->cols)));
    } else {
        return sd_set_error(SD_ERR_INTERNAL, "a matrix without data to upload");
    }
    *off += sd_align256(mat_bytes(w));
    return SD_OK;
}

static sd_status put_vec(sd_cuda_model *cm, const float **out, const float *v, int64_t n,
                         size_t *off) {
    *out = NULL;
    if (v == NULL) {
        return SD_OK;
    }
    float *dst = (float *)(cm->weights + *off);
    SD_CUDA_TRY(
        cudaMemcpyAsync(dst, v, (size_t)n * sizeof(float), cudaMemcpyHostToDevice, cm->ctx.stream));
    *out = dst;
    *off += sd_align256((size_t)n * sizeof(float));
    return SD_OK;
}

/* The weights of m into one device allocation; a head (borrow: its target's device model) reads
 * the target's token embeddings there, and its output matrix too unless own_output. */
static sd_status model_upload(sd_cuda_model *cm, const sd_model *m, const sd_cuda_model *borrow,
                              int own_output) {
    const sd_config *c = &m->cfg;
    const int64_t D = c->hidden_size, QD = (int64_t)c->n_heads * c->head_dim;
    const int64_t KVD = (int64_t)c->n_kv_heads * c->head_dim;
    /* sizes first: one allocation */
    size_t total = sd_align256((size_t)D * 4);
    if (borrow == NULL) {
        total += sd_align256(mat_bytes(&m->w.tok_embd));
    }
    if (borrow == NULL ? !c->tied_embeddings : own_output) {
        total += sd_align256(mat_bytes(&m->w.output));
    }
    for (int l = 0; l < c->n_layers; l++) {
        const sd_layer *L = &m->w.layers[l];
        const sd_mat *ms[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) {
            total += sd_align256(mat_bytes(ms[i]));
        }
        total += 3 * sd_align256((size_t)D * 4) + sd_align256((size_t)QD * 4) +
                 2 * sd_align256((size_t)KVD * 4);
    }
    total += sd_align256((size_t)(c->head_dim / 2) * sizeof(double));
    cudaError_t e = cudaMalloc((void **)&cm->weights, total);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        return sd_set_error(SD_ERR_CUDA,
                            "the model's weights need %zu MiB of GPU memory, %zu MiB are free "
                            "(cudaMalloc: %s)",
                            total >> 20, free_b >> 20, cudaGetErrorString(e));
    }
    cm->weight_bytes = total;
    cm->layers = (dlayer *)calloc((size_t)c->n_layers, sizeof(dlayer));
    if (cm->layers == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    size_t off = 0;
    if (borrow != NULL) {
        cm->tok_embd = borrow->tok_embd;
        if (own_output) {
            SD_TRY(put_mat(cm, &cm->output, &m->w.output, &off, m));
        } else {
            cm->output = borrow->output;
        }
    } else {
        SD_TRY(put_mat(cm, &cm->tok_embd, &m->w.tok_embd, &off, m));
        if (c->tied_embeddings) {
            cm->output = cm->tok_embd;
        } else {
            SD_TRY(put_mat(cm, &cm->output, &m->w.output, &off, m));
        }
    }
    SD_TRY(put_vec(cm, &cm->out_norm, m->w.out_norm, D, &off));
    for (int l = 0; l < c->n_layers; l++) {
        const sd_layer *L = &m->w.layers[l];
        dlayer *G = &cm->layers[l];
        SD_TRY(put_mat(cm, &G->wq, &L->wq, &off, m));
        SD_TRY(put_mat(cm, &G->wk, &L->wk, &off, m));
        SD_TRY(put_mat(cm, &G->wv, &L->wv, &off, m));
        SD_TRY(put_mat(cm, &G->wo, &L->wo, &off, m));
        SD_TRY(put_mat(cm, &G->gate, &L->w_gate, &off, m));
        SD_TRY(put_mat(cm, &G->up, &L->w_up, &off, m));
        SD_TRY(put_mat(cm, &G->down, &L->w_down, &off, m));
        SD_TRY(put_vec(cm, &G->attn_norm, L->attn_norm, D, &off));
        SD_TRY(put_vec(cm, &G->ffn_norm, L->ffn_norm, D, &off));
        SD_TRY(put_vec(cm, &G->hidden_norm, L->hidden_norm, D, &off));
        SD_TRY(put_vec(cm, &G->bq, L->bq, QD, &off));
        SD_TRY(put_vec(cm, &G->bk, L->bk, KVD, &off));
        SD_TRY(put_vec(cm, &G->bv, L->bv, KVD, &off));
    }
    cm->rope_freq = (double *)(cm->weights + off);
    SD_CUDA_TRY(cudaMemcpyAsync(cm->rope_freq, m->rope_freq,
                                (size_t)(c->head_dim / 2) * sizeof(double), cudaMemcpyHostToDevice,
                                cm->ctx.stream));
    SD_CUDA_TRY(cudaStreamSynchronize(cm->ctx.stream));
    return SD_OK;
}

static sd_status model_create(sd_cuda_model **out, const sd_model *m, int gpu,
                              const sd_cuda_model *borrow, int own_output) {
    *out = NULL;
    sd_cuda_model *cm = (sd_cuda_model *)calloc(1, sizeof(*cm));
    if (cm == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    cm->cfg = m->cfg;
    cm->use_graphs = env_flag("SPECDEC_CUDA_GRAPHS", 1);
    cm->use_cublas = env_flag("SPECDEC_CUDA_CUBLAS", 0);
    sd_status st = sd_cuda_ctx_init(&cm->ctx, gpu);
    if (st == SD_OK) {
        st = model_upload(cm, m, borrow, own_output);
    }
    /* a head's logits go to the host for its tree (never picked or verified on the device):
     * its decoding buffers are left at one column */
    const int V = borrow != NULL ? 1 : m->cfg.vocab_size;
    if (st == SD_OK) {
        st = sd_cuda_sorter_reserve(&cm->ctx, &cm->sorter, SPEC_ROWS, V);
    }
    if (st == SD_OK) {
        const cudaError_t e1 =
            cudaMalloc((void **)&cm->probs, (size_t)SPEC_ROWS * (size_t)V * sizeof(float));
        const cudaError_t e2 = cudaMalloc((void **)&cm->work, 2 * (size_t)V * sizeof(float));
        const cudaError_t e3 = cudaMalloc((void **)&cm->pick_dev, 2 * sizeof(int32_t));
        const cudaError_t e4 = cudaMallocHost((void **)&cm->pick_host, 2 * sizeof(int32_t));
        const cudaError_t e5 = cudaEventCreateWithFlags(&cm->join_ev, cudaEventDisableTiming);
        const cudaError_t e6 =
            cudaMalloc((void **)&cm->spec_ints, (size_t)SPEC_INTS * sizeof(int32_t));
        const cudaError_t e7 =
            cudaMalloc((void **)&cm->spec_q, (size_t)SD_MAX_DRAFT * (size_t)V * sizeof(float));
        const cudaError_t e8 =
            cudaMallocHost((void **)&cm->spec_host, (size_t)SPEC_INTS * sizeof(int32_t));
        const cudaError_t e9 = cudaMalloc((void **)&cm->in_kv, sizeof(sd_cuda_kv_desc));
        if (e1 != cudaSuccess || e2 != cudaSuccess || e3 != cudaSuccess || e4 != cudaSuccess ||
            e5 != cudaSuccess || e6 != cudaSuccess || e7 != cudaSuccess || e8 != cudaSuccess ||
            e9 != cudaSuccess) {
            st = sd_set_error(SD_ERR_CUDA, "%s:%d: allocating decoding buffers: %s", __FILE__,
                              __LINE__, cudaGetErrorString(cudaGetLastError()));
        }
    }
    for (int i = 0; st == SD_OK && i < STAGE_SLOTS; i++) {
        if (cudaEventCreateWithFlags(&cm->stage_ev[i], cudaEventDisableTiming) != cudaSuccess) {
            st = sd_set_error(SD_ERR_CUDA, "%s:%d: creating events: %s", __FILE__, __LINE__,
                              cudaGetErrorString(cudaGetLastError()));
        }
    }
    if (st != SD_OK) {
        sd_cuda_model_free(cm);
        return st;
    }
    *out = cm;
    return SD_OK;
}

extern "C" sd_status sd_cuda_model_create(sd_cuda_model **out, const sd_model *m, int gpu) {
    if (m->cfg.head) {
        return sd_set_error(SD_ERR_INTERNAL, "a head goes to the GPU by sd_cuda_head_create");
    }
    return model_create(out, m, gpu, NULL, 0);
}

extern "C" sd_status sd_cuda_head_create(sd_cuda_model **out, const sd_model *hm,
                                         sd_cuda_model *target, int own_output) {
    *out = NULL;
    if (!hm->cfg.head || hm->cfg.n_layers != 1) {
        return sd_set_error(SD_ERR_INTERNAL, "sd_cuda_head_create takes a bound one-layer head");
    }
    if (hm->cfg.hidden_size != target->cfg.hidden_size) {
        return sd_set_error(SD_ERR_INVALID_ARG, "the head's hidden size %d is not its target's %d",
                            hm->cfg.hidden_size, target->cfg.hidden_size);
    }
    if (!own_output && hm->w.output.rows != target->output.rows) {
        return sd_set_error(SD_ERR_INTERNAL, "a head that reads its target's output head has "
                                             "another vocabulary");
    }
    USE_DEVICE(target);
    return model_create(out, hm, target->ctx.device, target, own_output);
}

static void free_activations(sd_cuda_model *cm) {
    cudaFree(cm->x);
    cudaFree(cm->xb);
    cudaFree(cm->q);
    cudaFree(cm->k);
    cudaFree(cm->v);
    cudaFree(cm->hb);
    cudaFree(cm->hb2);
    cudaFree(cm->logits);
    cudaFree(cm->xh);
    cudaFree(cm->in_tokens);
    cudaFree(cm->in_mask);
    cm->x = cm->xb = cm->q = cm->k = cm->v = cm->hb = cm->hb2 = cm->logits = NULL;
    cm->xh = NULL;
    cm->in_tokens = cm->in_pos = cm->in_slots = NULL;
    cm->in_n_attn = NULL;
    cm->in_mask = NULL;
    cm->cap_tokens = cm->cap_attn = cm->cap_logits = 0;
}

extern "C" void sd_cuda_model_free(sd_cuda_model *cm) {
    if (cm == NULL) {
        return;
    }
    cudaSetDevice(cm->ctx.device);
    if (cm->ctx.stream != NULL) {
        cudaStreamSynchronize(cm->ctx.stream);
    }
    graphs_clear(cm);
    free_activations(cm);
    cudaFree(cm->feat);
    for (int i = 0; i < STAGE_SLOTS; i++) {
        if (cm->stage[i] != NULL) {
            cudaFreeHost(cm->stage[i]);
        }
        if (cm->stage_ev[i] != NULL) {
            cudaEventDestroy(cm->stage_ev[i]);
        }
    }
    sd_cuda_sorter_release(&cm->sorter);
    cudaFree(cm->probs);
    cudaFree(cm->work);
    cudaFree(cm->pick_dev);
    if (cm->pick_host != NULL) {
        cudaFreeHost(cm->pick_host);
    }
    if (cm->join_ev != NULL) {
        cudaEventDestroy(cm->join_ev);
    }
    cudaFree(cm->spec_ints);
    cudaFree(cm->spec_q);
    cudaFree(cm->in_kv);
    if (cm->spec_host != NULL) {
        cudaFreeHost(cm->spec_host);
    }
    cudaFree(cm->weights);
    free(cm->layers);
    sd_cuda_ctx_release(&cm->ctx);
    free(cm);
}

extern "C" int sd_cuda_model_gpu(const sd_cuda_model *cm) {
    return cm->ctx.device;
}

extern "C" sd_status sd_cuda_model_join(sd_cuda_model *waiter, sd_cuda_model *producer) {
    if (waiter == producer) {
        return SD_OK;
    }
    USE_DEVICE(producer);
    SD_CUDA_TRY(cudaEventRecord(producer->join_ev, producer->ctx.stream));
    SD_CUDA_TRY(cudaStreamWaitEvent(waiter->ctx.stream, producer->join_ev, 0));
    return SD_OK;
}

/* Grow the activation buffers for T tokens, n_attn attended slots and n_logits rows. Buffers
 * baked into captured graphs move, so the graphs go (after the stream is idle). */
static sd_status reserve(sd_cuda_model *cm, int T, int n_attn, int n_logits) {
    if (T <= cm->cap_tokens && n_attn <= cm->cap_attn && n_logits <= cm->cap_logits) {
        return SD_OK;
    }
    const sd_config *c = &cm->cfg;
    SD_CUDA_TRY(cudaStreamSynchronize(cm->ctx.stream));
    graphs_clear(cm);
    const int nt = T > cm->cap_tokens ? T : cm->cap_tokens;
    const int na = n_attn > cm->cap_attn ? n_attn : cm->cap_attn;
    const int nl = n_logits > cm->cap_logits ? n_logits : cm->cap_logits;
    free_activations(cm);
    const size_t D = (size_t)c->hidden_size, QD = (size_t)c->n_heads * (size_t)c->head_dim;
    const size_t KVD = (size_t)c->n_kv_heads * (size_t)c->head_dim, F = (size_t)c->ffn_size;
    /* xb: a head's (T, 2D) attention input too; hb2: a head's token embeddings (T, D) */
    const size_t XB0 = D > QD ? D : QD, XB = c->head && 2 * D > XB0 ? 2 * D : XB0;
    const size_t V = (size_t)c->vocab_size, FH = F > D ? F : D;
    const size_t maxc = F > XB ? F : XB;
    struct {
        void **p;
        size_t bytes;
    } bufs[] = {
        {(void **)&cm->x, (size_t)nt * D * 4},
        {(void **)&cm->xb, (size_t)nt * XB * 4},
        {(void **)&cm->q, (size_t)nt * QD * 4},
        {(void **)&cm->k, (size_t)nt * KVD * 4},
        {(void **)&cm->v, (size_t)nt * KVD * 4},
        {(void **)&cm->hb, (size_t)nt * F * 4},
        {(void **)&cm->hb2, (size_t)nt * FH * 4},
        {(void **)&cm->logits, (size_t)(nl > 0 ? nl : 1) * V * 4},
        {(void **)&cm->xh, (size_t)nt * maxc * 2 * 2},
        {(void **)&cm->in_tokens, (size_t)nt * 3 * 4 + 64},
        {(void **)&cm->in_mask, (size_t)nt * (size_t)na},
    };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        const cudaError_t e = cudaMalloc(bufs[i].p, bufs[i].bytes > 0 ? bufs[i].bytes : 1);
        if (e != cudaSuccess) {
            cudaGetLastError();
            free_activations(cm);
            return sd_set_error(SD_ERR_CUDA,
                                "out of GPU memory for a forward of %d tokens over %d slots "
                                "(%zu MiB for one buffer)",
                                T, n_attn, bufs[i].bytes >> 20);
        }
    }
    cm->in_pos = cm->in_tokens + nt;
    cm->in_slots = cm->in_pos + nt;
    cm->in_n_attn = (int *)(cm->in_slots + nt);
    /* pinned staging for short batches: tokens, pos, slots, n_attn, the cache descriptor, the
     * mask. The capacities are published only once it is in place: a failure here leaves the
     * model with no buffers (the next forward tries again), never with too small ones. */
    const size_t sb = (size_t)STAGE_TOKENS * 12 + 64 + (size_t)STAGE_TOKENS * (size_t)na;
    if (sb > cm->stage_bytes) {
        for (int i = 0; i < STAGE_SLOTS; i++) {
            if (cm->stage[i] != NULL) {
                cudaFreeHost(cm->stage[i]);
                cm->stage[i] = NULL;
            }
        }
        cm->stage_bytes = 0;
        for (int i = 0; i < STAGE_SLOTS; i++) {
            const cudaError_t e = cudaMallocHost((void **)&cm->stage[i], sb);
            if (e != cudaSuccess) {
                cudaGetLastError();
                free_activations(cm);
                return sd_set_error(SD_ERR_CUDA,
                                    "%s:%d: pinned staging of %zu KiB: cudaMallocHost failed: %s",
                                    __FILE__, __LINE__, sb >> 10, cudaGetErrorString(e));
            }
        }
        cm->stage_bytes = sb;
    }
    cm->cap_tokens = nt;
    cm->cap_attn = na;
    cm->cap_logits = nl;
    return SD_OK;
}

/* ---- cache -------------------------------------------------------------------------------------
 */

extern "C" sd_status sd_cuda_cache_create(sd_cuda_cache **out, sd_cuda_model *cm, int capacity) {
    *out = NULL;
    const sd_config *c = &cm->cfg;
    sd_cuda_cache *kc = (sd_cuda_cache *)calloc(1, sizeof(*kc));
    if (kc == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    kc->cm = cm;
    kc->capacity = capacity;
    if (cudaSetDevice(cm->ctx.device) != cudaSuccess) {
        free(kc);
        return sd_set_error(SD_ERR_CUDA, "%s:%d: cudaSetDevice(%d) failed", __FILE__, __LINE__,
                            cm->ctx.device);
    }
    const size_t n = (size_t)c->n_layers * (size_t)c->n_kv_heads * (size_t)capacity *
                     (size_t)c->head_dim * sizeof(float);
    cudaError_t e = cudaMalloc((void **)&kc->k, n);
    if (e == cudaSuccess) {
        e = cudaMalloc((void **)&kc->v, n);
    }
    if (e == cudaSuccess) {
        e = cudaMemsetAsync(kc->k, 0, n, cm->ctx.stream);
    }
    if (e == cudaSuccess) {
        e = cudaMemsetAsync(kc->v, 0, n, cm->ctx.stream);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        sd_cuda_cache_free(kc);
        return sd_set_error(SD_ERR_CUDA,
                            "a KV cache of %d slots needs 2 x %zu MiB of GPU memory: %s", capacity,
                            n >> 20, cudaGetErrorString(e));
    }
    *out = kc;
    return SD_OK;
}

extern "C" void sd_cuda_cache_free(sd_cuda_cache *kc) {
    if (kc == NULL) {
        return;
    }
    sd_cuda_model *cm = kc->cm;
    if (cm != NULL) { /* no queued work may still read it */
        cudaSetDevice(cm->ctx.device);
        cudaStreamSynchronize(cm->ctx.stream);
    }
    cudaFree(kc->k);
    cudaFree(kc->v);
    free(kc);
}

extern "C" sd_status sd_cuda_cache_copy_slot(sd_cuda_cache *kc, int dst, int src) {
    USE_DEVICE(kc->cm);
    const sd_config *c = &kc->cm->cfg;
    const size_t row = (size_t)c->head_dim * sizeof(float);
    const size_t pitch = (size_t)kc->capacity * row; /* one KV head of one layer */
    const size_t heads = (size_t)c->n_layers * (size_t)c->n_kv_heads;
    SD_CUDA_TRY(cudaMemcpy2DAsync((uint8_t *)kc->k + (size_t)dst * row, pitch,
                                  (const uint8_t *)kc->k + (size_t)src * row, pitch, row, heads,
                                  cudaMemcpyDeviceToDevice, kc->cm->ctx.stream));
    SD_CUDA_TRY(cudaMemcpy2DAsync((uint8_t *)kc->v + (size_t)dst * row, pitch,
                                  (const uint8_t *)kc->v + (size_t)src * row, pitch, row, heads,
                                  cudaMemcpyDeviceToDevice, kc->cm->ctx.stream));
    return SD_OK;
}

extern "C" sd_status sd_cuda_cache_download(const sd_cuda_cache *kc, float *k, float *v) {
    USE_DEVICE(kc->cm);
    const sd_config *c = &kc->cm->cfg;
    const size_t n = (size_t)c->n_layers * (size_t)c->n_kv_heads * (size_t)kc->capacity *
                     (size_t)c->head_dim * sizeof(float);
    SD_CUDA_TRY(cudaMemcpyAsync(k, kc->k, n, cudaMemcpyDeviceToHost, kc->cm->ctx.stream));
    SD_CUDA_TRY(cudaMemcpyAsync(v, kc->v, n, cudaMemcpyDeviceToHost, kc->cm->ctx.stream));
    SD_CUDA_TRY(cudaStreamSynchronize(kc->cm->ctx.stream));
    return SD_OK;
}

extern "C" const sd_cuda_model *sd_cuda_cache_model(const sd_cuda_cache *kc) {
    return kc->cm;
}

/* ---- forward -----------------------------------------------------------------------------------
 */

static sd_status mm(sd_cuda_model *cm, float *y, const dmat *w, const float *x, int T,
                    const float *bias, int accumulate, int cublas) {
    if (cublas && (w->type == 0 || w->type == 1 || w->type == 30)) {
        return sd_cuda_matmul_cublas(&cm->ctx, y, w->rows, w->w, w->type, w->rows, w->cols, x, T,
                                     bias, accumulate, cm->xh);
    }
    return sd_cuda_matmul(&cm->ctx, y, w->rows, w->w, w->type, w->rows, w->cols, x, T, bias,
                          accumulate);
}

/* The residual stream x (T, D) into the feature block of every aux layer equal to l. */
static sd_status copy_aux(sd_cuda_model *cm, const feat_req *fr, int l, int T) {
    const size_t n = (size_t)T * (size_t)cm->cfg.hidden_size;
    for (int i = 0; i < fr->n_aux; i++) {
        if (fr->layers[i] == l) {
            SD_CUDA_TRY(cudaMemcpyAsync(cm->feat + (size_t)(1 + i) * n, cm->x, n * sizeof(float),
                                        cudaMemcpyDeviceToDevice, cm->ctx.stream));
        }
    }
    return SD_OK;
}

/* out (T, D) = the final norm of x, or x itself (an EAGLE-1/2 head has none). */
static sd_status final_norm(sd_cuda_model *cm, float *out, const float *x, int T) {
    const int D = cm->cfg.hidden_size;
    if (cm->out_norm != NULL) {
        return sd_cuda_rmsnorm(&cm->ctx, out, x, cm->out_norm, T, D, cm->cfg.rms_eps);
    }
    SD_CUDA_TRY(cudaMemcpyAsync(out, x, (size_t)T * (size_t)D * sizeof(float),
                                cudaMemcpyDeviceToDevice, cm->ctx.stream));
    return SD_OK;
}

/* The kernels of one forward (what a graph captures): every input read from the device; the
 * features fr asks for into cm->feat (block 0 the hidden states, block 1 + i aux layer i). */
static sd_status run_forward(sd_cuda_model *cm, int T, int n_logits, int n_layers, int cublas,
                             const feat_req *fr) {
    const sd_config *c = &cm->cfg;
    sd_cuda_ctx *ctx = &cm->ctx;
    const int D = c->hidden_size, Dh = c->head_dim, H = c->n_heads, Hkv = c->n_kv_heads;
    const int F = c->ffn_size;
    if (!c->head) { /* a head's rows are in x already (sd_cuda_forward put them there) */
        SD_TRY(sd_cuda_embed(ctx, cm->x, cm->tok_embd.w, cm->tok_embd.type, D, cm->in_tokens, T));
    }
    for (int l = 0; l < n_layers; l++) {
        const dlayer *L = &cm->layers[l];
        SD_TRY(copy_aux(cm, fr, l, T));
        /* attention block: x += Wo . attn(rope(Wq n), rope(Wk n), Wv n), n = rmsnorm(x) */
        if (L->hidden_norm != NULL) { /* EAGLE-3: n = cat(rmsnorm(embedding), rmsnorm(x)) */
            SD_TRY(sd_cuda_embed(ctx, cm->hb2, cm->tok_embd.w, cm->tok_embd.type, D, cm->in_tokens,
                                 T));
            SD_TRY(sd_cuda_head_input(ctx, cm->xb, cm->hb2, cm->x, L->attn_norm, L->hidden_norm, T,
                                      D, c->rms_eps, c->head_norm_residual));
        } else if (L->attn_norm == NULL) { /* EAGLE-1/2: no input norm */
            SD_CUDA_TRY(cudaMemcpyAsync(cm->xb, cm->x, (size_t)T * (size_t)D * sizeof(float),
                                        cudaMemcpyDeviceToDevice, ctx->stream));
        } else {
            SD_TRY(sd_cuda_rmsnorm(ctx, cm->xb, cm->x, L->attn_norm, T, D, c->rms_eps));
        }
        SD_TRY(mm(cm, cm->q, &L->wq, cm->xb, T, L->bq, 0, cublas));
        SD_TRY(mm(cm, cm->k, &L->wk, cm->xb, T, L->bk, 0, cublas));
        SD_TRY(mm(cm, cm->v, &L->wv, cm->xb, T, L->bv, 0, cublas));
        SD_TRY(sd_cuda_rope(ctx, cm->q, cm->in_pos, cm->rope_freq, T, H, Dh, c->rope_neox));
        SD_TRY(sd_cuda_rope(ctx, cm->k, cm->in_pos, cm->rope_freq, T, Hkv, Dh, c->rope_neox));
        SD_TRY(sd_cuda_kv_write_dev(ctx, cm->in_kv, l, cm->k, cm->v, cm->in_slots, T, Hkv, Dh));
        SD_TRY(sd_cuda_attention_dev(ctx, cm->xb, cm->q, cm->in_kv, l, cm->in_mask, T,
                                     cm->in_n_attn, H, Hkv, Dh));
        SD_TRY(mm(cm, cm->x, &L->wo, cm->xb, T, NULL, 1, cublas));
        /* MLP block: x += Wdown . (silu(Wgate n) * (Wup n)), n = rmsnorm(x) */
        SD_TRY(sd_cuda_rmsnorm(ctx, cm->xb, cm->x, L->ffn_norm, T, D, c->rms_eps));
        SD_TRY(mm(cm, cm->hb, &L->gate, cm->xb, T, NULL, 0, cublas));
        SD_TRY(mm(cm, cm->hb2, &L->up, cm->xb, T, NULL, 0, cublas));
        SD_TRY(sd_cuda_swiglu(ctx, cm->hb, cm->hb, cm->hb2, (int64_t)T * F));
        SD_TRY(mm(cm, cm->x, &L->down, cm->hb, T, NULL, 1, cublas));
    }
    SD_TRY(copy_aux(cm, fr, n_layers, T));
    if (fr->hidden) { /* every row's, by the same kernel as the rows that get logits */
        SD_TRY(final_norm(cm, cm->feat, cm->x, T));
    }
    if (n_logits > 0) {
        const int first = T - n_logits;
        SD_TRY(final_norm(cm, cm->xb, cm->x + (size_t)first * (size_t)D, n_logits));
        SD_TRY(mm(cm, cm->logits, &cm->output, cm->xb, n_logits, NULL, 0,
                  cublas && n_logits >= CUBLAS_MIN_TOKENS));
    }
    return SD_OK;
}

/* The forward as a graph: found by shape, or captured now. */
static sd_status run_graph(sd_cuda_model *cm, int T, int n_logits, int n_layers,
                           const feat_req *fr) {
    for (int i = 0; i < cm->n_graphs; i++) {
        const graph_entry *g = &cm->graphs[i];
        if (g->T == T && g->n_logits == n_logits && g->n_layers == n_layers &&
            memcmp(&g->fr, fr, sizeof(*fr)) == 0) {
            SD_CUDA_TRY(cudaGraphLaunch(g->exec, cm->ctx.stream));
            return SD_OK;
        }
    }
    if (cm->n_graphs == MAX_GRAPHS) {
        graphs_clear(cm);
    }
    cudaGraph_t graph = NULL;
    SD_CUDA_TRY(cudaStreamBeginCapture(cm->ctx.stream, cudaStreamCaptureModeThreadLocal));
    const sd_status st = run_forward(cm, T, n_logits, n_layers, 0, fr);
    const cudaError_t e = cudaStreamEndCapture(cm->ctx.stream, &graph);
    if (st != SD_OK) {
        if (graph != NULL) {
            cudaGraphDestroy(graph);
        }
        return st;
    }
    SD_CUDA_TRY(e);
    cudaGraphExec_t exec = NULL;
    const cudaError_t ei = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    SD_CUDA_TRY(ei);
    graph_entry *g = &cm->graphs[cm->n_graphs++];
    g->T = T;
    g->n_logits = n_logits;
    g->n_layers = n_layers;
    g->fr = *fr;
    g->exec = exec;
    SD_CUDA_TRY(cudaGraphLaunch(exec, cm->ctx.stream));
    return SD_OK;
}

/* The batch's inputs to the device: positions, slots, the mask, its width and the cache's
 * descriptor (and the token ids, from the host or copied from a device array), through a pinned
 * slot for short batches (so the copies stay asynchronous and the host may prepare the next
 * batch at once), else from pageable memory. */
static sd_status stage_inputs(sd_cuda_model *cm, sd_cuda_cache *kc, const sd_cuda_batch *b) {
    const int T = b->n_tokens;
    const size_t mask_bytes = (size_t)T * (size_t)b->n_attn;
    cudaStream_t s = cm->ctx.stream;
    sd_cuda_kv_desc kd;
    memset(&kd, 0, sizeof(kd));
    kd.k = kc->k;
    kd.v = kc->v;
    kd.capacity = kc->capacity;
    if (b->tokens_dev != NULL) { /* a draft chain's own picks: device to device */
        SD_CUDA_TRY(cudaMemcpyAsync(cm->in_tokens, b->tokens_dev, (size_t)T * 4,
                                    cudaMemcpyDeviceToDevice, s));
    }
    if (T <= STAGE_TOKENS) {
        const int i = cm->stage_next;
        cm->stage_next = (i + 1) % STAGE_SLOTS;
        SD_CUDA_TRY(cudaEventSynchronize(cm->stage_ev[i])); /* its last copy is done */
        uint8_t *p = cm->stage[i];
        int32_t *st = (int32_t *)p;
        if (b->tokens != NULL && b->tokens_dev == NULL) {
            memcpy(st, b->tokens, (size_t)T * 4);
        }
        memcpy(st + STAGE_TOKENS, b->pos, (size_t)T * 4);
        memcpy(st + 2 * STAGE_TOKENS, b->slots, (size_t)T * 4);
        memcpy(st + 3 * STAGE_TOKENS, &b->n_attn, 4);
        memcpy(st + 3 * STAGE_TOKENS + 8, &kd, sizeof(kd));
        uint8_t *mask = p + (size_t)STAGE_TOKENS * 12 + 64;
        memcpy(mask, b->mask, mask_bytes);
        if (b->tokens != NULL && b->tokens_dev == NULL) {
            SD_CUDA_TRY(
                cudaMemcpyAsync(cm->in_tokens, st, (size_t)T * 4, cudaMemcpyHostToDevice, s));
        }
        SD_CUDA_TRY(cudaMemcpyAsync(cm->in_pos, st + STAGE_TOKENS, (size_t)T * 4,
                                    cudaMemcpyHostToDevice, s));
        SD_CUDA_TRY(cudaMemcpyAsync(cm->in_slots, st + 2 * STAGE_TOKENS, (size_t)T * 4,
                                    cudaMemcpyHostToDevice, s));
        SD_CUDA_TRY(
            cudaMemcpyAsync(cm->in_n_attn, st + 3 * STAGE_TOKENS, 4, cudaMemcpyHostToDevice, s));
        SD_CUDA_TRY(cudaMemcpyAsync(cm->in_kv, st + 3 * STAGE_TOKENS + 8, sizeof(kd),
                                    cudaMemcpyHostToDevice, s));
        SD_CUDA_TRY(cudaMemcpyAsync(cm->in_mask, mask, mask_bytes, cudaMemcpyHostToDevice, s));
        SD_CUDA_TRY(cudaEventRecord(cm->stage_ev[i], s));
        return SD_OK;
    }
    if (b->tokens != NULL && b->tokens_dev == NULL) {
        SD_CUDA_TRY(
            cudaMemcpyAsync(cm->in_tokens, b->tokens, (size_t)T * 4, cudaMemcpyHostToDevice, s));
    }
    SD_CUDA_TRY(cudaMemcpyAsync(cm->in_pos, b->pos, (size_t)T * 4, cudaMemcpyHostToDevice, s));
    SD_CUDA_TRY(cudaMemcpyAsync(cm->in_slots, b->slots, (size_t)T * 4, cudaMemcpyHostToDevice, s));
    SD_CUDA_TRY(cudaMemcpyAsync(cm->in_n_attn, &b->n_attn, 4, cudaMemcpyHostToDevice, s));
    SD_CUDA_TRY(cudaMemcpyAsync(cm->in_kv, &kd, sizeof(kd), cudaMemcpyHostToDevice, s));
    SD_CUDA_TRY(cudaMemcpyAsync(cm->in_mask, b->mask, mask_bytes, cudaMemcpyHostToDevice, s));
    SD_CUDA_TRY(cudaStreamSynchronize(s)); /* the caller's arrays and kd go on return */
    return SD_OK;
}

/* Room for `floats` floats of features (allocated when a forward first asks for them, grown
 * as needed; the graphs that captured the old buffer go). */
static sd_status feat_reserve(sd_cuda_model *cm, size_t floats) {
    if (floats <= cm->feat_cap) {
        return SD_OK;
    }
    SD_CUDA_TRY(cudaStreamSynchronize(cm->ctx.stream));
    graphs_clear(cm);
    cudaFree(cm->feat);
    cm->feat = NULL;
    cm->feat_cap = 0;
    const cudaError_t e = cudaMalloc((void **)&cm->feat, floats * sizeof(float));
    if (e != cudaSuccess) {
        cudaGetLastError();
        cm->feat = NULL;
        return sd_set_error(SD_ERR_CUDA,
                            "out of GPU memory for the features of a forward (%zu MiB)",
                            (floats * sizeof(float)) >> 20);
    }
    cm->feat_cap = floats;
    return SD_OK;
}

extern "C" sd_status sd_cuda_forward(sd_cuda_model *cm, sd_cuda_cache *kc, const sd_cuda_batch *b,
                                     float *logits) {
    USE_DEVICE(cm);
    if (kc->cm != cm) {
        return sd_set_error(SD_ERR_INVALID_ARG, "the cache was made for a different model");
    }
    const int T = b->n_tokens;
    SD_TRY(reserve(cm, T, kc->capacity > b->n_attn ? kc->capacity : b->n_attn, b->n_logits));
    SD_TRY(stage_inputs(cm, kc, b));
    if (b->embd != NULL) { /* a head's rows, ahead of the forward on the same stream */
        SD_CUDA_TRY(cudaMemcpyAsync(cm->x, b->embd,
                                    (size_t)T * (size_t)cm->cfg.hidden_size * sizeof(float),
                                    cudaMemcpyHostToDevice, cm->ctx.stream));
    }
    const int cublas = cm->use_cublas && T >= CUBLAS_MIN_TOKENS;
    feat_req fr; /* zeroed whole: graphs compare it bytewise */
    memset(&fr, 0, sizeof(fr));
    fr.hidden = b->hidden != NULL;
    fr.n_aux = b->n_aux > 0 && b->aux != NULL ? b->n_aux : 0;
    if (fr.n_aux > SD_MAX_AUX_LAYERS) {
        return sd_set_error(SD_ERR_INVALID_ARG, "%d aux layers asked for, at most %d", fr.n_aux,
                            SD_MAX_AUX_LAYERS);
    }
    for (int i = 0; i < fr.n_aux; i++) {
        fr.layers[i] = b->aux_layers[i];
    }
    if (fr.hidden || fr.n_aux > 0) {
        SD_TRY(feat_reserve(cm, (size_t)(1 + fr.n_aux) * (size_t)T * (size_t)cm->cfg.hidden_size));
    }
    if (cm->use_graphs && T <= GRAPH_MAX_TOKENS && !cublas) {
        SD_TRY(run_graph(cm, T, b->n_logits, b->n_layers, &fr));
    } else {
        SD_TRY(run_forward(cm, T, b->n_logits, b->n_layers, cublas, &fr));
    }
    int sync = 0;
    const size_t td = (size_t)T * (size_t)cm->cfg.hidden_size;
    if (fr.hidden) {
        SD_CUDA_TRY(cudaMemcpyAsync(b->hidden, cm->feat, td * sizeof(float), cudaMemcpyDeviceToHost,
                                    cm->ctx.stream));
        sync = 1;
    }
    if (fr.n_aux > 0) { /* the aux blocks are consecutive there as here */
        SD_CUDA_TRY(cudaMemcpyAsync(b->aux, cm->feat + td, (size_t)fr.n_aux * td * sizeof(float),
                                    cudaMemcpyDeviceToHost, cm->ctx.stream));
        sync = 1;
    }
    if (logits != NULL && b->n_logits > 0) {
        /* rows of the output head's width: an EAGLE-3 head's draft vocabulary */
        const size_t V = cm->cfg.head ? (size_t)cm->output.rows : (size_t)cm->cfg.vocab_size;
        const size_t n = (size_t)b->n_logits * V * sizeof(float);
        SD_CUDA_TRY(cudaMemcpyAsync(logits, cm->logits, n, cudaMemcpyDeviceToHost, cm->ctx.stream));
        sync = 1;
    }
    if (sync) {
        SD_CUDA_TRY(cudaStreamSynchronize(cm->ctx.stream));
    }
    return SD_OK;
}

/* ---- decoding ----------------------------------------------------------------------------------
 */

extern "C" sd_status sd_cuda_pick(sd_cuda_model *cm, int row, const sd_cuda_sampling *s,
                                  uint64_t seed, uint64_t index, int32_t *out) {
    USE_DEVICE(cm);
    const int V = cm->cfg.vocab_size;
    const float *l = cm->logits + (size_t)row * (size_t)V;
    if (s->temperature == 0.0f) {
        SD_TRY(sd_cuda_argmax_rows(&cm->ctx, cm->pick_dev, l, 1, V));
    } else {
        SD_TRY(sd_cuda_process_rows(&cm->ctx, &cm->sorter, cm->probs, l, 1, V, s->temperature,
                                    s->top_k, s->top_p, s->min_p));
        SD_TRY(sd_cuda_sample_rows(&cm->ctx, cm->pick_dev, cm->probs, 1, V, seed, SD_STREAM_PLAIN,
                                   index));
    }
    SD_CUDA_TRY(cudaMemcpyAsync(cm->pick_host, cm->pick_dev, sizeof(int32_t),
                                cudaMemcpyDeviceToHost, cm->ctx.stream));
    SD_CUDA_TRY(cudaStreamSynchronize(cm->ctx.stream));
    *out = cm->pick_host[0];
    return SD_OK;
}

__global__ void set_int_kernel(int32_t *p, int v) {
    *p = v;
}

extern "C" sd_status sd_cuda_spec_create(sd_cuda_spec **out, sd_cuda_model *cm, int K) {
    *out = NULL;
    if (K < 1 || K > SD_MAX_TREE_NODES) { /* a chain drafter's k, or a tree drafter's nodes */
        return sd_set_error(SD_ERR_INVALID_ARG, "k must be in [1, %d], got %d", SD_MAX_TREE_NODES,
                            K);
    }
    sd_cuda_spec *sp = (sd_cuda_spec *)calloc(1, sizeof(*sp));
    if (sp == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    /* the model's own buffers: one call at a time uses a model */
    sp->cm = cm;
    sp->K = K;
    sp->V = cm->cfg.vocab_size;
    sp->batch = cm->spec_ints;
    sp->result = sp->batch + SD_MAX_DRAFT + 1;
    sp->k_stop = sp->result + 2;
    sp->next_in = sp->k_stop + 1;
    sp->tree = sp->next_in + 1;
    sp->q = cm->spec_q;
    sp->host = cm->spec_host;
    *out = sp;
    return SD_OK;
}

extern "C" void sd_cuda_spec_free(sd_cuda_spec *sp) {
    if (sp == NULL) {
        return;
    }
    cudaSetDevice(sp->cm->ctx.device);
    cudaStreamSynchronize(sp->cm->ctx.stream);
    free(sp);
}

extern "C" int32_t *sd_cuda_spec_batch(sd_cuda_spec *sp) {
    return sp->batch;
}

extern "C" int32_t *sd_cuda_spec_next_input(sd_cuda_spec *sp) {
    return sp->next_in;
}

extern "C" sd_status sd_cuda_spec_begin(sd_cuda_spec *sp, sd_cuda_model *dm, int32_t last, int k) {
    USE_DEVICE(dm);
    /* batch[0] = the last token, the draft length mark = k: on the drafter's stream */
    set_int_kernel<<<1, 1, 0, dm->ctx.stream>>>(sp->batch, last);
    SD_CUDA_LAUNCHED("set_int_kernel");
    set_int_kernel<<<1, 1, 0, dm->ctx.stream>>>(sp->k_stop, k);
    SD_CUDA_LAUNCHED("set_int_kernel");
    return SD_OK;
}

extern "C" sd_status sd_cuda_spec_draft_pick(sd_cuda_spec *sp, sd_cuda_model *dm, int i,
                                             const sd_cuda_sampling *s, uint64_t seed,
                                             uint64_t pos0, float p_min) {
    USE_DEVICE(dm);
    const int V = sp->V;
    float *qi = sp->q + (size_t)i * (size_t)V;
    SD_TRY(sd_cuda_process_rows(&dm->ctx, &dm->sorter, qi, dm->logits, 1, V, s->temperature,
                                s->top_k, s->top_p, s->min_p));
    return sd_cuda_draft_pick_dev(&dm->ctx, sp->batch, sp->next_in, sp->k_stop, qi, dm->logits, V,
                                  i, s->temperature, seed, pos0, p_min);
}

/* The step's result to the host: the one synchronisation of a step. */
static sd_status spec_result(sd_cuda_spec *sp, sd_cuda_model *cm, int k, const int32_t *drafts_dev,
                             int *n_acc, int32_t *drafts, int32_t *next, int *k_used) {
    cudaStream_t s = cm->ctx.stream;
    SD_CUDA_TRY(
        cudaMemcpyAsync(sp->host, sp->result, 3 * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    if (drafts != NULL && k > 0) {
        SD_CUDA_TRY(cudaMemcpyAsync(sp->host + 3, drafts_dev, (size_t)k * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, s));
    }
    SD_CUDA_TRY(cudaStreamSynchronize(s));
    *n_acc = sp->host[0];
    *next = sp->host[1];
    if (k_used != NULL) {
        *k_used = sp->host[2] < k ? sp->host[2] : k;
    }
    if (drafts != NULL && k > 0) {
        memcpy(drafts, sp->host + 3, (size_t)k * sizeof(int32_t));
    }
    return SD_OK;
}

extern "C" sd_status sd_cuda_spec_verify(sd_cuda_spec *sp, sd_cuda_model *cm, int k, int with_q,
                                         const sd_cuda_sampling *s, uint64_t seed, uint64_t pos0,
                                         int *n_acc, int32_t *drafts, int32_t *next, int *k_used) {
    USE_DEVICE(cm);
    const int V = sp->V;
    SD_TRY(sd_cuda_process_rows(&cm->ctx, &cm->sorter, cm->probs, cm->logits, k + 1, V,
                                s->temperature, s->top_k, s->top_p, s->min_p));
    /* the drafts: in the spec batch for model drafters, in the forward's inputs otherwise */
    const int32_t *d = with_q ? sp->batch + 1 : cm->in_tokens + 1;
    if (!with_q) {
        set_int_kernel<<<1, 1, 0, cm->ctx.stream>>>(sp->k_stop, k);
        SD_CUDA_LAUNCHED("set_int_kernel");
    }
    SD_TRY(sd_cuda_verify_dev(&cm->ctx, sp->result, cm->probs, with_q ? sp->q : NULL, d, k,
                              with_q ? sp->k_stop : NULL, V, seed, pos0, cm->work));
    /* k_stop sits right after result: copied with it */
    return spec_result(sp, cm, k, d, n_acc, drafts, next, k_used);
}

extern "C" sd_status sd_cuda_spec_verify_tree(sd_cuda_spec *sp, sd_cuda_model *cm, int n,
                                              const int32_t *tokens, const int32_t *parent,
                                              const sd_cuda_sampling *s, uint64_t seed,
                                              uint64_t out_pos, int *n_acc, int32_t *path,
                                              int32_t *next) {
    USE_DEVICE(cm);
    if (n < 1 || n > SD_MAX_TREE_NODES) {
        return sd_set_error(SD_ERR_INTERNAL, "a tree of %d nodes (at most %d)", n,
                            SD_MAX_TREE_NODES);
    }
    const int V = sp->V;
    cudaStream_t st = cm->ctx.stream;
    int32_t *h = sp->host + 3 + SD_MAX_DRAFT; /* tokens, parents, then the result comes back */
    int32_t *tok = sp->tree, *par = tok + SD_MAX_TREE_NODES, *res = par + SD_MAX_TREE_NODES;
    memcpy(h, tokens, (size_t)n * sizeof(int32_t));
    memcpy(h + SD_MAX_TREE_NODES, parent, (size_t)n * sizeof(int32_t));
    SD_CUDA_TRY(cudaMemcpyAsync(tok, h, 2 * SD_MAX_TREE_NODES * sizeof(int32_t),
                                cudaMemcpyHostToDevice, st));
    SD_TRY(sd_cuda_process_rows(&cm->ctx, &cm->sorter, cm->probs, cm->logits, n + 1, V,
                                s->temperature, s->top_k, s->top_p, s->min_p));
    SD_TRY(sd_cuda_verify_tree_dev(&cm->ctx, res, cm->probs, NULL, tok, par, n, V, seed, out_pos,
                                   cm->work));
    int32_t *hr = h + 2 * SD_MAX_TREE_NODES;
    SD_CUDA_TRY(
        cudaMemcpyAsync(hr, res, (size_t)(2 + n) * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
    SD_CUDA_TRY(cudaStreamSynchronize(st));
    *n_acc = hr[0];
    *next = hr[1];
    memcpy(path, hr + 2, (size_t)hr[0] * sizeof(int32_t));
    return SD_OK;
}

extern "C" sd_status sd_cuda_spec_row_top(sd_cuda_spec *sp, sd_cuda_model *cm, int rows, int top,
                                          int32_t *ids) {
    USE_DEVICE(cm);
    if (rows < 1 || rows > SPEC_ROWS) {
        return sd_set_error(SD_ERR_INTERNAL, "top ids of %d rows (at most %d)", rows, SPEC_ROWS);
    }
    cudaStream_t st = cm->ctx.stream;
    int32_t *dev = sp->tree + 3 * SD_MAX_TREE_NODES + 2;
    int32_t *h = sp->host + 3 + SD_MAX_DRAFT + 3 * SD_MAX_TREE_NODES + 2;
    const size_t n = (size_t)rows * (size_t)top;
    SD_TRY(sd_cuda_row_top_dev(&cm->ctx, dev, cm->logits, rows, sp->V, top));
    SD_CUDA_TRY(cudaMemcpyAsync(h, dev, n * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
    SD_CUDA_TRY(cudaStreamSynchronize(st));
    memcpy(ids, h, n * sizeof(int32_t));
    return SD_OK;
}

extern "C" sd_status sd_cuda_spec_synthetic(sd_cuda_spec *sp, sd_cuda_model *cm, int k,
                                            double alpha, uint64_t seed, uint64_t pos0, int *n_acc,
                                            int32_t *next) {
    USE_DEVICE(cm);
    SD_TRY(sd_cuda_synthetic_dev(&cm->ctx, sp->result, k, alpha, seed, pos0, cm->logits, sp->V));
    return spec_result(sp, cm, k, NULL, n_acc, NULL, next, NULL);
}

extern "C" int sd_cuda_probe(int *cublas_version) {
    int v = 0;
    if (cublasGetProperty(MAJOR_VERSION, &v) == CUBLAS_STATUS_SUCCESS) {
        int minor = 0;
        cublasGetProperty(MINOR_VERSION, &minor);
        v = v * 1000 + minor;
    }
    *cublas_version = v;
    return sd_cuda_device_count();
}

/* ---- benchmarks --------------------------------------------------------------------------------
 */

extern "C" sd_status sd_cuda_model_sync(sd_cuda_model *cm) {
    USE_DEVICE(cm);
    SD_CUDA_TRY(cudaStreamSynchronize(cm->ctx.stream));
    return SD_OK;
}

extern "C" sd_status sd_cuda_copy_bench(int gpu, size_t bytes, int iters, double *seconds) {
    *seconds = 0.0;
    sd_cuda_ctx ctx;
    sd_status st = sd_cuda_ctx_init(&ctx, gpu);
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (st == SD_OK &&
        (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
         cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)) {
        st = sd_set_error(SD_ERR_CUDA, "%s:%d: setting up the copy benchmark (%zu MiB): %s",
                          __FILE__, __LINE__, bytes >> 20, cudaGetErrorString(cudaGetLastError()));
    }
    if (st == SD_OK && cudaMemsetAsync(a, 1, bytes, ctx.stream) != cudaSuccess) {
        st = sd_set_error(SD_ERR_CUDA, "%s:%d: memset", __FILE__, __LINE__);
    }
    for (int w = 0; st == SD_OK && w < 2; w++) { /* warm-up, then timed */
        const int n = w == 0 ? 2 : iters;
        cudaEventRecord(e0, ctx.stream);
        for (int i = 0; i < n; i++) {
            cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice,
                            ctx.stream);
        }
        cudaEventRecord(e1, ctx.stream);
        const cudaError_t e = cudaEventSynchronize(e1);
        if (e != cudaSuccess) {
            st = sd_set_error(SD_ERR_CUDA, "%s:%d: copy benchmark: %s", __FILE__, __LINE__,
                              cudaGetErrorString(e));
        }
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, e0, e1);
        *seconds = ms * 1e-3 / n;
    }
    cudaFree(a);
    cudaFree(b);
    if (e0 != NULL) {
        cudaEventDestroy(e0);
    }
    if (e1 != NULL) {
        cudaEventDestroy(e1);
    }
    sd_cuda_ctx_release(&ctx);
    return st;
}
