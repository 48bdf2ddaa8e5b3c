/* model.c — build a model from a GGUF file or a Hugging Face directory: read the
 * hyper-parameters, find every tensor by role, check its shape and type, and keep views into
 * the file mappings. Also the scratch buffers the forward pass reuses. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/config.h"
#include "model/sched.h"
#include "cpu/ops_cpu.h"
#include "cpu/dispatch.h"
#include "cpu/quant.h"
#include "util/status.h"
#ifdef SD_WITH_CUDA
#include "../cuda/sd_cuda.h"
#endif

/* ---- tensor roles and their names in each format --------------------------------------------- */

typedef enum {
    R_TOK_EMBD,
    R_OUT_NORM,
    R_OUTPUT,
    R_ATTN_NORM,
    R_WQ,
    R_WK,
    R_WV,
    R_WO,
    R_BQ,
    R_BK,
    R_BV,
    R_FFN_NORM,
    R_GATE,
    R_UP,
    R_DOWN,
    R_Q_NORM,
    R_K_NORM,
    R_ROPE_FREQS,
    R_ATTN_POST_NORM,
    R_FFN_POST_NORM,
    R_QKV,        /* phi3: q, k and v stacked by rows */
    R_GATE_UP,    /* phi3: gate and up stacked by rows */
    R_ROPE_LONG,  /* phi3's LongRoPE divisors (GGUF) */
    R_ROPE_SHORT, /* the same for the original context */
    R_COUNT
} role;

static const char *const g_gguf_names[R_COUNT] = {
    "token_embd.weight",
    "output_norm.weight",
    "output.weight",
    "blk.%d.attn_norm.weight",
    "blk.%d.attn_q.weight",
    "blk.%d.attn_k.weight",
    "blk.%d.attn_v.weight",
    "blk.%d.attn_output.weight",
    "blk.%d.attn_q.bias",
    "blk.%d.attn_k.bias",
    "blk.%d.attn_v.bias",
    "blk.%d.ffn_norm.weight",
    "blk.%d.ffn_gate.weight",
    "blk.%d.ffn_up.weight",
    "blk.%d.ffn_down.weight",
    "blk.%d.attn_q_norm.weight",
    "blk.%d.attn_k_norm.weight",
    "rope_freqs.weight",
    "blk.%d.post_attention_norm.weight",
    "blk.%d.post_ffw_norm.weight",
    "blk.%d.attn_qkv.weight",
    "blk.%d.ffn_up.weight", /* phi3's holds gate and up */
    "rope_factors_long.weight",
    "rope_factors_short.weight",
};

static const char *const g_hf_names[R_COUNT] = {
    "model.embed_tokens.weight",
    "model.norm.weight",
    "lm_head.weight",
    "model.layers.%d.input_layernorm.weight",
    "model.layers.%d.self_attn.q_proj.weight",
    "model.layers.%d.self_attn.k_proj.weight",
    "model.layers.%d.self_attn.v_proj.weight",
    "model.layers.%d.self_attn.o_proj.weight",
    "model.layers.%d.self_attn.q_proj.bias",
    "model.layers.%d.self_attn.k_proj.bias",
    "model.layers.%d.self_attn.v_proj.bias",
    "model.layers.%d.post_attention_layernorm.weight",
    "model.layers.%d.mlp.gate_proj.weight",
    "model.layers.%d.mlp.up_proj.weight",
    "model.layers.%d.mlp.down_proj.weight",
    "model.layers.%d.self_attn.q_norm.weight",
    "model.layers.%d.self_attn.k_norm.weight",
    "", /* Hugging Face computes RoPE's factors from config.json */
    /* gemma's sandwich norms; its pre-MLP norm is pre_feedforward_layernorm (load_hf) */
    "model.layers.%d.post_attention_layernorm.weight",
    "model.layers.%d.post_feedforward_layernorm.weight",
    "model.layers.%d.self_attn.qkv_proj.weight",
    "model.layers.%d.mlp.gate_up_proj.weight",
    "", /* LongRoPE's factors are in config.json */
    "",
};

typedef struct {
    sd_model *m;
    const char *const *names;
    size_t vec_used; /* floats of m->vectors handed out */
    size_t vec_cap;
    unsigned char *used; /* (the file's tensor count) tensors found by role, or NULL */
    float norm_shift;    /* added to every norm weight: HF's gemma norms scale by (1 + w) */
} builder;

/* The file's tensors, to tell which no role read (a random model has none of its own). */
static const sd_tensor_info *file_tensors(const sd_model *m, int64_t *n) {
    *n = m->gguf != NULL ? (int64_t)m->gguf->n_tensors : m->st != NULL ? m->st->n_tensors : 0;
    return m->gguf != NULL ? m->gguf->tensors : m->st != NULL ? m->st->tensors : NULL;
}

static const sd_tensor_info *find_tensor(const builder *b, const char *name) {
    const sd_tensor_info *t;
    if (b->m->gguf != NULL) {
        t = sd_gguf_find_tensor(b->m->gguf, name);
    } else if (b->m->dummy != NULL) {
        return sd_dummy_find(b->m->dummy, name);
    } else {
        t = sd_st_find(b->m->st, name);
    }
    int64_t n = 0;
    const sd_tensor_info *all = file_tensors(b->m, &n);
    if (t != NULL && b->used != NULL && t >= all && t < all + n) {
        b->used[t - all] = 1;
    }
    return t;
}

/* A tensor no role read would be silently ignored: refuse the model, naming it. Allowed: HF's
 * saved rotary buffers (recomputed from config.json, as HF does) and an lm_head that
 * tie_word_embeddings replaces (as HF does). */
static sd_status check_all_read(const builder *b) {
    int64_t n = 0;
    const sd_tensor_info *all = file_tensors(b->m, &n);
    for (int64_t i = 0; b->used != NULL && i < n; i++) {
        const char *name = all[i].name;
        const size_t len = strlen(name);
        const char *inv = ".rotary_emb.inv_freq";
        if (b->used[i] || (len >= strlen(inv) && strcmp(name + len - strlen(inv), inv) == 0) ||
            (b->m->st != NULL && b->m->cfg.tied_embeddings &&
             strcmp(name, "lm_head.weight") == 0)) {
            continue;
        }
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "tensor '%s' is not used by specdec's %s graph; refusing to load a "
                            "model whose arithmetic it would change",
                            name, b->m->cfg.arch_name);
    }
    return SD_OK;
}

static void role_name(char *buf, size_t n, const builder *b, role r, int layer) {
    snprintf(buf, n, b->names[r], layer);
}

/* Look up a matrix (rows, cols). `required` = 0 lets a missing tensor leave out->data NULL. */
static sd_status get_mat(sd_mat *out, builder *b, role r, int layer, int64_t rows, int64_t cols,
                         int required) {
    char name[128];
    role_name(name, sizeof(name), b, r, layer);
    memset(out, 0, sizeof(*out));
    const sd_tensor_info *t = find_tensor(b, name);
    if (t == NULL) {
        if (!required) {
            return SD_OK;
        }
        return sd_set_error(SD_ERR_FORMAT, "missing tensor '%s'", name);
    }
    if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        char got[96];
        sd_tensor_shape_str(got, sizeof(got), t);
        return sd_set_error(SD_ERR_FORMAT, "tensor '%s' has shape %s, expected [%lld, %lld]", name,
                            got, (long long)rows, (long long)cols);
    }
    const sd_type_traits *tr = t->type >= 0 ? sd_type_get(t->type) : NULL;
    if (tr == NULL || tr->to_float == NULL || tr->tile == NULL) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "tensor '%s' has type %s, which specdec cannot compute with yet "
                            "(supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, "
                            "Q5_K, Q6_K)",
                            name, t->type_name);
    }
    SD_TRY(sd_check_finite(NULL, name, t->type, t->data, rows * cols, cols));
    out->data = t->data;
    out->type = t->type;
    out->rows = rows;
    out->cols = cols;
    out->row_bytes = sd_row_bytes(t->type, cols);
    out->tensor_id = b->m->dummy != NULL ? (int)(t - b->m->dummy->t) : -1;
    if (r != R_TOK_EMBD) { /* a forward reads T rows of the embedding, not the table */
        b->m->weight_bytes += (size_t)rows * out->row_bytes;
    }
    return SD_OK;
}

/* Look up a vector of n elements and copy it to f32 (norms and biases are tiny and read for
 * every token; one f32 copy keeps the hot loop free of type dispatch). */
static sd_status get_vec(const float **out, builder *b, role r, int layer, int64_t n,
                         int required) {
    char name[128];
    role_name(name, sizeof(name), b, r, layer);
    *out = NULL;
    const sd_tensor_info *t = find_tensor(b, name);
    if (t == NULL) {
        if (!required) {
            return SD_OK;
        }
        return sd_set_error(SD_ERR_FORMAT, "missing tensor '%s'", name);
    }
    if (t->n_dims != 1 || t->shape[0] != n) {
        char got[96];
        sd_tensor_shape_str(got, sizeof(got), t);
        return sd_set_error(SD_ERR_FORMAT, "tensor '%s' has shape %s, expected [%lld]", name, got,
                            (long long)n);
    }
    const sd_type_traits *tr = t->type >= 0 ? sd_type_get(t->type) : NULL;
    if (tr == NULL || tr->to_float == NULL) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "tensor '%s' has type %s, which specdec cannot read (supported for "
                            "norms and biases: F32, F16, BF16)",
                            name, t->type_name);
    }
    if (b->vec_used + (size_t)n > b->vec_cap) {
        return sd_set_error(SD_ERR_INTERNAL, "vector store too small for '%s'", name);
    }
    SD_TRY(sd_check_finite(NULL, name, t->type, t->data, n, 0));
    float *dst = b->m->vectors + b->vec_used;
    tr->to_float(dst, t->data, n);
    const int norm = r == R_ATTN_NORM || r == R_FFN_NORM || r == R_OUT_NORM || r == R_Q_NORM ||
                     r == R_K_NORM || r == R_ATTN_POST_NORM || r == R_FFN_POST_NORM;
    for (int64_t i = 0; norm && b->norm_shift != 0.0f && i < n; i++) {
        dst[i] += b->norm_shift;
    }
    b->vec_used += (size_t)n;
    b->m->weight_bytes += (size_t)n * sizeof(float);
    *out = dst;
    return SD_OK;
}

/* ---- build ----------------------------------------------------------------------------------- */

/* Find every tensor by role: views of the matrices, f32 copies of the vectors (m->vectors), and
 * RoPE's frequencies after the model's scaling. */
/* Rows [r0, r0 + rows) of m as a matrix of their own: a view (each row is whole blocks). */
static sd_mat row_view(const sd_mat *m, int64_t r0, int64_t rows) {
    sd_mat v = *m;
    v.data = (const unsigned char *)m->data + (size_t)r0 * m->row_bytes;
    v.rows = rows;
    return v;
}

/* q, k, v of layer l: phi3's fused matrix cut by rows (q first, then k, then v), else (GGUF
 * files may keep them apart) the three matrices. */
static sd_status get_qkv(sd_layer *L, builder *b, int l, int64_t QD, int64_t KVD, int64_t D) {
    if (b->m->cfg.arch == SD_ARCH_PHI3) {
        sd_mat qkv;
        SD_TRY(get_mat(&qkv, b, R_QKV, l, QD + 2 * KVD, D, b->m->gguf == NULL));
        if (qkv.data != NULL) {
            L->wq = row_view(&qkv, 0, QD);
            L->wk = row_view(&qkv, QD, KVD);
            L->wv = row_view(&qkv, QD + KVD, KVD);
            return SD_OK;
        }
    }
    SD_TRY(get_mat(&L->wq, b, R_WQ, l, QD, D, 1));
    SD_TRY(get_mat(&L->wk, b, R_WK, l, KVD, D, 1));
    return get_mat(&L->wv, b, R_WV, l, KVD, D, 1);
}

/* gate and up of layer l: phi3's one matrix (gate rows first, as HF's chunk(2) and llama.cpp's
 * fused SwiGLU read it), else two. */
static sd_status get_gate_up(sd_layer *L, builder *b, int l, int64_t F, int64_t D) {
    if (b->m->cfg.arch == SD_ARCH_PHI3) {
        sd_mat gu;
        SD_TRY(get_mat(&gu, b, R_GATE_UP, l, 2 * F, D, 1));
        L->w_gate = row_view(&gu, 0, F);
        L->w_up = row_view(&gu, F, F);
        return SD_OK;
    }
    SD_TRY(get_mat(&L->w_gate, b, R_GATE, l, F, D, 1));
    return get_mat(&L->w_up, b, R_UP, l, F, D, 1);
}

/* LongRoPE's divisors of a GGUF file (rope_dim / 2, each > 0) into dst. */
static sd_status longrope_tensor(float *dst, builder *b, role r) {
    const int64_t n = sd_config_rope_dim(&b->m->cfg) / 2;
    const float *f = NULL;
    SD_TRY(get_vec(&f, b, r, 0, n, 1));
    for (int64_t i = 0; i < n; i++) {
        if (!(f[i] > 0.0f) || !isfinite(f[i])) {
            return sd_set_error(SD_ERR_FORMAT,
                                "tensor '%s' holds %g at %lld; LongRoPE's divisors must be "
                                "positive",
                                b->names[r], (double)f[i], (long long)i);
        }
        dst[i] = f[i];
    }
    return SD_OK;
}

static sd_status find_weights(sd_model *m, builder *b) {
    sd_config *c = &m->cfg;
    const int64_t D = c->hidden_size, V = c->vocab_size, F = c->ffn_size;
    const int64_t QD = (int64_t)c->n_heads * c->head_dim;
    const int64_t KVD = (int64_t)c->n_kv_heads * c->head_dim;
    const int64_t Dh = c->head_dim;
    b->vec_cap =
        (size_t)(D * (4 * c->n_layers + 1) + (QD + 2 * KVD + 2 * Dh) * c->n_layers + 3 * Dh / 2);
    m->vectors = malloc(b->vec_cap * sizeof(float));
    m->w.layers = calloc((size_t)c->n_layers, sizeof(sd_layer));
    m->rope_freq = malloc((size_t)(Dh / 2) * sizeof(double));
    m->rope_freq_local = c->swa_pattern > 0 ? malloc((size_t)(Dh / 2) * sizeof(double)) : NULL;
    if (m->vectors == NULL || m->w.layers == NULL || m->rope_freq == NULL ||
        (c->swa_pattern > 0 && m->rope_freq_local == NULL)) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory allocating the model");
    }
    SD_TRY(get_mat(&m->w.tok_embd, b, R_TOK_EMBD, 0, V, D, 1));
    SD_TRY(get_vec(&m->w.out_norm, b, R_OUT_NORM, 0, D, 1));
    if (c->tied_embeddings) {
        m->w.output = m->w.tok_embd;
        m->weight_bytes += (size_t)V * m->w.output.row_bytes;
    } else {
        SD_TRY(get_mat(&m->w.output, b, R_OUTPUT, 0, V, D, 1));
    }
    for (int l = 0; l < c->n_layers; l++) {
        sd_layer *L = &m->w.layers[l];
        SD_TRY(get_vec(&L->attn_norm, b, R_ATTN_NORM, l, D, 1));
        SD_TRY(get_qkv(L, b, l, QD, KVD, D));
        SD_TRY(get_mat(&L->wo, b, R_WO, l, D, QD, 1));
        if (c->has_qkv_bias) { /* elsewhere a bias is left unread, so check_all_read refuses it */
            SD_TRY(get_vec(&L->bq, b, R_BQ, l, QD, 1));
            SD_TRY(get_vec(&L->bk, b, R_BK, l, KVD, 1));
            SD_TRY(get_vec(&L->bv, b, R_BV, l, KVD, 1));
        }
        if (c->has_qk_norm) {
            SD_TRY(get_vec(&L->q_norm, b, R_Q_NORM, l, Dh, 1));
            SD_TRY(get_vec(&L->k_norm, b, R_K_NORM, l, Dh, 1));
        }
        SD_TRY(get_vec(&L->ffn_norm, b, R_FFN_NORM, l, D, 1));
        if (sd_config_is_gemma(c)) {
            SD_TRY(get_vec(&L->attn_post_norm, b, R_ATTN_POST_NORM, l, D, 1));
            SD_TRY(get_vec(&L->ffn_post_norm, b, R_FFN_POST_NORM, l, D, 1));
        }
        SD_TRY(get_gate_up(L, b, l, F, D));
        SD_TRY(get_mat(&L->w_down, b, R_DOWN, l, D, F, 1));
    }
    c->weight_type = m->w.layers[0].wq.type;
    const float *factors = NULL;
    if (c->rope_scaling == SD_ROPE_FACTORS) {
        SD_TRY(get_vec(&factors, b, R_ROPE_FREQS, 0, Dh / 2, 1));
        for (int64_t i = 0; i < Dh / 2; i++) {
            if (!(factors[i] > 0.0f) || !isfinite(factors[i])) {
                return sd_set_error(SD_ERR_FORMAT,
                                    "tensor 'rope_freqs.weight' holds %g at %lld; RoPE "
                                    "frequency divisors must be positive",
                                    (double)factors[i], (long long)i);
            }
        }
    }
    if (c->rope_scaling == SD_ROPE_LONGROPE && m->gguf != NULL) { /* HF's: from config.json */
        SD_TRY(longrope_tensor(c->rope_long_factors, b, R_ROPE_LONG));
        SD_TRY(longrope_tensor(c->rope_short_factors, b, R_ROPE_SHORT));
    }
    sd_config_rope_freq(m->rope_freq, c, factors);
    if (m->rope_freq_local != NULL) { /* local layers: their own base, never scaled */
        sd_config local = *c;
        local.rope_theta = c->rope_theta_local;
        local.rope_scaling = SD_ROPE_DEFAULT;
        sd_config_rope_freq(m->rope_freq_local, &local, NULL);
    }
    return SD_OK;
}

/* find_weights, then refuse any tensor of the file that no role read. */
static sd_status build_weights(sd_model *m, const char *const *names, float norm_shift) {
    int64_t n_file = 0;
    file_tensors(m, &n_file);
    builder b = {m, names, 0, 0, calloc((size_t)n_file + 1, 1), norm_shift};
    if (b.used == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory allocating the model");
    }
    sd_status st = find_weights(m, &b);
    if (st == SD_OK) {
        st = check_all_read(&b);
    }
    free(b.used);
    return st;
}

/* Keep 8-row interleaved copies of the quantized matrices the VNNI tiles read without
 * unpacking (same size as the originals). The embedding keeps its rows as stored (a forward
 * reads only its tokens' rows); a tied output head gets its own copy. */
static sd_status repack_weights(sd_model *m) {
    const int n = 7 * m->cfg.n_layers + 1;
    sd_mat **mats = malloc((size_t)n * sizeof(*mats));
    if (mats == NULL) {
        return SD_OK; /* an optimisation, not a requirement: run from the file's rows */
    }
    for (int l = 0; l < m->cfg.n_layers; l++) {
        sd_layer *L = &m->w.layers[l];
        sd_mat *lm[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) {
            mats[7 * l + i] = lm[i];
        }
    }
    mats[n - 1] = &m->w.output;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        total += sd_repack_bytes(mats[i]->type, mats[i]->rows, mats[i]->cols);
    }
    m->packed = total > 0 ? sd_alloc_streamed(total) : NULL;
    unsigned char *p = (unsigned char *)m->packed;
    for (int i = 0; p != NULL && i < n; i++) {
        sd_mat *w = mats[i];
        const size_t bytes = sd_repack_bytes(w->type, w->rows, w->cols);
        if (bytes > 0) {
            sd_repack(p, w->type, w->data, w->row_bytes, w->rows, w->cols);
            w->packed = p;
            p += bytes;
            /* the forward reads the copy from now on: give the file's pages back (a tied
             * embedding faults its rows back in as tokens need them) */
            sd_map_release(w->data, (size_t)w->rows * w->row_bytes);
        }
    }
    free(mats);
    return SD_OK;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static sd_status load_hf(sd_model *m, const char *dir) {
    size_t n = strlen(dir);
    char *cfg_path = malloc(n + 16);
    if (cfg_path == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    snprintf(cfg_path, n + 16, "%s/config.json", dir);
    sd_json *cfg = NULL;
    sd_status st = sd_json_read_file(&cfg, cfg_path);
    if (st == SD_OK) {
        st = sd_st_open_dir(&m->st, dir);
    }
    if (st == SD_OK) {
        if (cfg->type != SD_JSON_OBJECT) {
            st = sd_set_error(SD_ERR_FORMAT, "%s is not a JSON object", cfg_path);
        } else {
            st = sd_config_from_hf(&m->cfg, cfg, cfg_path, m->st);
        }
    }
    sd_json_free(cfg);
    free(cfg_path);
    if (st == SD_OK) {
        const char *names[R_COUNT];
        memcpy(names, g_hf_names, sizeof(names));
        const int gemma = sd_config_is_gemma(&m->cfg);
        if (gemma) {
            names[R_FFN_NORM] = "model.layers.%d.pre_feedforward_layernorm.weight";
        }
        st = build_weights(m, names, gemma ? 1.0f : 0.0f);
    }
    return st;
}

static sd_status load_gguf(sd_model *m, const char *path) {
    SD_TRY(sd_gguf_open(&m->gguf, path));
    SD_TRY(sd_config_from_gguf(&m->cfg, m->gguf));
    return build_weights(m, g_gguf_names, 0.0f); /* llama.cpp's converter folds gemma's + 1 */
}

sd_model_params sd_model_default_params(void) {
    sd_model_params p;
    memset(&p, 0, sizeof(p));
    p.n_threads = 0;
    p.repack = 1;
    p.device = SD_DEVICE_CPU;
    p.gpu = 0;
    return p;
}

static sd_status check_params(const sd_model_params *p) {
    if (p->n_threads != 0) { /* 0: the cores this process may use */
        SD_TRY(sd_threadpool_check(p->n_threads));
    }
    if (p->device != SD_DEVICE_CPU && p->device != SD_DEVICE_CUDA) {
        return sd_set_error(SD_ERR_INVALID_ARG, "unknown device %d (0 = CPU, 1 = CUDA)", p->device);
    }
#ifndef SD_WITH_CUDA
    if (p->device == SD_DEVICE_CUDA) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "this build of specdec has no CUDA backend (nvcc was not found when "
                            "it was built, or SPECDEC_CPU_ONLY was set): reinstall on a machine "
                            "with the CUDA toolkit, or use the CPU");
    }
#endif
    if (p->gpu < 0) {
        return sd_set_error(SD_ERR_INVALID_ARG, "gpu index must be >= 0, got %d", p->gpu);
    }
    return SD_OK;
}

/* The longest sequence the model takes: `n` (0: the file's), at most the file's context. A
 * LongRoPE model runs with its short factors up to its original context (the limit when n is
 * 0), and with its long factors, for every position, above it: as llama.cpp chooses them by its
 * context size, and as transformers does for a text longer than the original context. */
static sd_status set_context(sd_model *m, int n) {
    sd_config *c = &m->cfg;
    c->context_file = c->context_length;
    if (n < 0 || n > c->context_length) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "context_length %d is not in [1, %d], the model's context length", n,
                            c->context_length);
    }
    if (c->rope_scaling == SD_ROPE_LONGROPE) { /* find_weights computed the short ones */
        n = n > 0 ? n : c->rope_original_context;
        c->rope_long = n > c->rope_original_context;
        if (c->rope_long) {
            sd_config_rope_freq(m->rope_freq, c, NULL);
        }
    }
    c->context_length = n > 0 ? n : c->context_length;
    return SD_OK;
}

/* What a model needs once its weights are found: the CPU's repacked copies or the device
 * copy, and the thread pool (which also runs the host-side work of a CUDA model). */
static sd_status finish_model(sd_model *m, const sd_model_params *p) {
    m->device = p->device;
    m->kv_f16 = p->device != SD_DEVICE_CUDA;
    SD_TRY(sd_sched_create(&m->sched));
    if (p->device != SD_DEVICE_CUDA) {
        SD_TRY(sd_kv_pool_create(&m->prefix, SD_PREFIX_CACHE_DEFAULT));
    }
    SD_TRY(set_context(m, p->context_length));
    const sd_config *c = &m->cfg;
    if (p->device == SD_DEVICE_CUDA &&
        (c->has_qk_norm || sd_config_is_gemma(c) || c->arch == SD_ARCH_PHI3 || c->swa_pattern > 0 ||
         c->no_rope_interval > 0 || c->embed_scale > 0.0f || c->residual_scale > 0.0f ||
         c->logit_scale > 0.0f || (c->rope_attn_factor != 0.0f && c->rope_attn_factor != 1.0f) ||
         sd_config_rope_dim(c) != c->head_dim || c->attn_scale > 0.0f || c->final_softcap > 0.0f ||
         c->attn_softcap > 0.0f)) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "the CUDA backend cannot compute this %s model yet (it has no q/k "
                            "norms, gemma's sandwich norms, GeGLU, local layers, soft-caps, "
                            "fused matrices, layers without RoPE, YaRN's or LongRoPE's scaled "
                            "cos and sin, partial rotary embeddings, granite's scales): use the "
                            "CPU",
                            c->arch_name);
    }
    if (p->device == SD_DEVICE_CUDA) {
#ifdef SD_WITH_CUDA
        SD_TRY(sd_cuda_model_create(&m->cuda, m, p->gpu));
#endif
    } else if (p->repack) {
        SD_TRY(repack_weights(m));
    }
    return sd_threadpool_create(&m->pool, p->n_threads > 0 ? p->n_threads : sd_available_cpus());
}

sd_model *sd_model_alloc(void) {
    sd_model *m = calloc(1, sizeof(*m));
    if (m != NULL && pthread_mutex_init(&m->costs.lock, NULL) != 0) {
        free(m);
        return NULL;
    }
    return m;
}

sd_status sd_model_create_dummy(sd_model **out, const sd_config *cfg, int weight_type,
                                uint64_t seed, const sd_model_params *params) {
    *out = NULL;
    sd_kernels_init();
    sd_model_params p = params != NULL ? *params : sd_model_default_params();
    SD_TRY(check_params(&p));
    sd_model *m = sd_model_alloc();
    if (m == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory allocating the model");
    }
    sd_config *c = &m->cfg;
    *c = *cfg;
    /* the documented fields only: no window, RoPE scaling or scales from an unset struct */
    c->sliding_window = c->swa_pattern = 0;
    c->rope_scaling = SD_ROPE_DEFAULT;
    c->attn_scale = c->final_softcap = c->attn_softcap = 0.0f;
    sd_status st = SD_OK;
    if (cfg->arch != SD_ARCH_LLAMA && cfg->arch != SD_ARCH_QWEN2) {
        st = sd_set_error(SD_ERR_INVALID_ARG, "unknown architecture %d (0 = llama, 1 = qwen2)",
                          (int)cfg->arch);
    }
    if (st == SD_OK) {
        const char *name = cfg->arch == SD_ARCH_QWEN2 ? "qwen2" : "llama";
        st = sd_config_set_arch(c, name, strlen(name));
    }
    if (st == SD_OK) {
        c->rope_neox = c->arch != SD_ARCH_LLAMA; /* as a GGUF file of this architecture */
        st = sd_config_check(c);
    }
    if (st == SD_OK) {
        st = sd_dummy_create(&m->dummy, c, weight_type, seed, p.device != SD_DEVICE_CUDA);
    }
    if (st == SD_OK) {
        st = build_weights(m, g_gguf_names, 0.0f);
    }
    if (st == SD_OK) {
        st = finish_model(m, &p);
    }
    if (st != SD_OK) {
        sd_model_free(m);
        return st;
    }
    *out = m;
    return SD_OK;
}

int sd_model_device(const sd_model *m) {
    return m->device;
}

sd_status sd_model_load(sd_model **out, const char *path, const sd_model_params *params) {
    *out = NULL;
    sd_kernels_init();
    sd_model_params p = params != NULL ? *params : sd_model_default_params();
    SD_TRY(check_params(&p));
    sd_model *m = sd_model_alloc();
    if (m == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory allocating the model");
    }
    sd_status st;
    if (is_dir(path)) {
        st = load_hf(m, path);
    } else {
        st = load_gguf(m, path);
    }
    if (st != SD_OK && (m->gguf != NULL || m->st != NULL)) { /* the file opened: name it */
        sd_error_prefix(st, "%s", path);
    }
    if (st == SD_OK) {
        st = finish_model(m, &p);
    }
    if (st != SD_OK) {
        sd_model_free(m);
        return st;
    }
    *out = m;
    return SD_OK;
}

static void scratch_free(sd_scratch *s) {
    free(s->x);
    free(s->xb);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->hb);
    free(s->hb2);
    free(s->rope_cs);
    free(s->rope_cs_local);
    free(s->xo);
    free(s->mask_local);
    free(s->mask);
    free(s->scores);
    free(s->xq);
    memset(s, 0, sizeof(*s));
}

void sd_model_free(sd_model *m) {
    if (m == NULL) {
        return;
    }
    sd_kv_pool_free(m->prefix);
    sd_sched_free(m->sched);
    if (!m->borrowed_pool) {
        sd_threadpool_free(m->pool);
    }
    scratch_free(&m->s);
    free(m->w.layers);
    free(m->vectors);
    free(m->packed);
    free(m->rope_freq);
    free(m->rope_freq_local);
    free(m->pieces);
    free(m->piece_off);
    sd_gguf_close(m->gguf);
    sd_st_close(m->st);
    sd_dummy_free(m->dummy);
#ifdef SD_WITH_CUDA
    sd_cuda_model_free(m->cuda);
#endif
    pthread_mutex_destroy(&m->costs.lock);
    free(m);
}

const sd_config *sd_model_config(const sd_model *m) {
    return &m->cfg;
}

size_t sd_model_weight_bytes(const sd_model *m) {
    return m->weight_bytes;
}

int sd_model_threads(const sd_model *m) {
    return sd_threadpool_size(m->pool);
}

sd_status sd_model_set_prefix_cache(sd_model *m, int n) {
    if (n < 0 || n > SD_PREFIX_CACHE_MAX) {
        return sd_set_error(SD_ERR_INVALID_ARG, "prefix_cache must be in [0, %d], got %d",
                            SD_PREFIX_CACHE_MAX, n);
    }
    if (m->prefix == NULL) {
        return n == 0 ? SD_OK
                      : sd_set_error(SD_ERR_UNSUPPORTED,
                                     "prefix reuse is for CPU models only so far (prefix_cache=0)");
    }
    sd_kv_pool_resize(m->prefix, n);
    return SD_OK;
}

void sd_model_sched_counts(sd_model *m, long long *forwards, long long *steps) {
    sd_sched_counts(m->sched, forwards, steps);
}

int sd_model_prefix_cache(const sd_model *m) {
    return m->prefix != NULL ? sd_kv_pool_max(m->prefix) : 0;
}

int sd_model_kv_f16(const sd_model *m) {
    return m->kv_f16;
}

sd_status sd_model_set_kv_f16(sd_model *m, int f16) {
    if (f16 && m->device == SD_DEVICE_CUDA) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "the CUDA backend keeps its KV cache in f32 only (kv_dtype='f32')");
    }
    m->kv_f16 = f16 != 0;
    return SD_OK;
}

sd_status sd_model_set_threads(sd_model *m, int n_threads) {
    SD_TRY(sd_threadpool_check(n_threads));
    if (n_threads == sd_threadpool_size(m->pool)) {
        return SD_OK;
    }
    sd_threadpool *pool = NULL;
    SD_TRY(sd_threadpool_create(&pool, n_threads));
    sd_threadpool_free(m->pool);
    m->pool = pool;
    /* per-thread scratch is sized by the thread count: rebuild on next use */
    free(m->s.scores);
    m->s.scores = NULL;
    m->s.cap_tokens = 0;
    m->s.cap_attn = 0;
    return SD_OK;
}

static sd_status grow(void *pp, size_t bytes) {
    void **p = (void **)pp;
    void *n = realloc(*p, bytes > 0 ? bytes : 1);
    if (n == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory growing forward buffers (%zu bytes)",
                            bytes);
    }
    *p = n;
    return SD_OK;
}

sd_status sd_scratch_reserve(sd_model *m, int n_tokens, int n_attn) {
    sd_scratch *s = &m->s;
    const sd_config *c = &m->cfg;
    int nt = sd_threadpool_size(m->pool);
    size_t T = (size_t)n_tokens;
    size_t QD = (size_t)c->n_heads * (size_t)c->head_dim;
    size_t KVD = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    size_t D = (size_t)c->hidden_size, F = (size_t)c->ffn_size;
    if (n_tokens > s->cap_tokens || s->x == NULL) {
        size_t xbw = D > QD ? D : QD;
        xbw = c->head == SD_HEAD_EAGLE3 && 2 * D > xbw ? 2 * D : xbw; /* its layer's input */
        SD_TRY(grow(&s->x, T * D * sizeof(float)));
        SD_TRY(grow(&s->xb, T * xbw * sizeof(float)));
        SD_TRY(grow(&s->q, T * QD * sizeof(float)));
        SD_TRY(grow(&s->k, T * KVD * sizeof(float)));
        SD_TRY(grow(&s->v, T * KVD * sizeof(float)));
        SD_TRY(grow(&s->hb, T * F * sizeof(float)));
        SD_TRY(grow(&s->hb2, T * F * sizeof(float)));
        SD_TRY(grow(&s->rope_cs, T * (size_t)c->head_dim * sizeof(float)));
        SD_TRY(grow(&s->rope_cs_local, T * (size_t)c->head_dim * sizeof(float)));
        SD_TRY(grow(&s->xo, T * D * sizeof(float)));
        SD_TRY(grow(&s->xq, SD_Q8_BATCH_BYTES(T, xbw > F ? xbw : F)));
        s->cap_tokens = n_tokens;
        s->cap_attn = 0; /* mask size depends on T too */
    }
    if (n_attn > s->cap_attn || s->scores == NULL) {
        SD_TRY(grow(&s->mask, (size_t)s->cap_tokens * (size_t)n_attn));
        SD_TRY(grow(&s->mask_local, (size_t)s->cap_tokens * (size_t)n_attn));
        SD_TRY(grow(&s->scores, sd_attention_scratch(n_attn, c->head_dim, nt) * sizeof(float)));
        s->cap_attn = n_attn;
    }
    return SD_OK;
}

int sd_model_metadata_count(const sd_model *m) {
    return m->gguf != NULL ? (int)m->gguf->n_kv : 0;
}

sd_status sd_model_metadata_entry(const sd_model *m, int i, const char **key, int *type,
                                  const unsigned char **value) {
    if (i < 0 || i >= sd_model_metadata_count(m)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "metadata entry %d out of range [0, %d)", i,
                            sd_model_metadata_count(m));
    }
    const sd_gguf_kv *kv = &m->gguf->kv[i];
    *key = kv->key;
    *type = (int)kv->type;
    *value = kv->raw;
    return SD_OK;
}

sd_status sd_model_set_token_pieces(sd_model *m, const char *const *pieces, const size_t *lens,
                                    int n) {
    if (n != m->cfg.vocab_size) {
        return sd_set_error(SD_ERR_INVALID_ARG, "%d token pieces given for a vocabulary of %d", n,
                            m->cfg.vocab_size);
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        total += lens[i];
    }
    char *buf = malloc(total > 0 ? total : 1);
    size_t *off = malloc(((size_t)n + 1) * sizeof(size_t));
    if (buf == NULL || off == NULL) {
        free(buf);
        free(off);
        return sd_set_error(SD_ERR_NOMEM, "out of memory storing token pieces");
    }
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        off[i] = o;
        memcpy(buf + o, pieces[i], lens[i]);
        o += lens[i];
    }
    off[n] = o;
    free(m->pieces);
    free(m->piece_off);
    m->pieces = buf;
    m->piece_off = off;
    return SD_OK;
}
