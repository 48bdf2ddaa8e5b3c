/* head.c — learned drafters' heads (head.h): EAGLE-1/2, EAGLE-3 and Medusa files read and
 * checked, their matrices kept as views or Q8_0 copies, an EAGLE head bound to a target as a
 * one-layer model with the rows entering its layer computed here, Medusa's heads run here. */
#include "model/head.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/config.h"
#ifdef SD_WITH_CUDA
#include "../cuda/sd_cuda.h"
#endif
#include "model/forward.h"
#include "cpu/ops_cpu.h"
#include "cpu/quant.h"
#include "format/torch_bin.h"
#include "format/types.h"
#include "util/status.h"

struct sd_head {
    int kind;          /* sd_head_kind */
    sd_config cfg;     /* the layer's, from config.json */
    sd_st_set *st;     /* the weights file */
    char file[1024];   /* its path, for messages */
    const char *layer; /* "layers.0." or "midlayer." */
    int vocab;         /* the vocabulary config.json names (the target's) */
    int draft_vocab;   /* EAGLE-3: rows of lm_head; EAGLE: vocab */
    int32_t *ids;      /* EAGLE-3: (draft_vocab) target id of each draft id */
    int n_aux;         /* EAGLE-3: 3 taps named by the config, or 0 (2, L / 2, L - 3) */
    int32_t aux[3];
    /* Medusa: head i's residual blocks mats[i * (blocks + 1) + j] (D, D) with biases
     * bias + (i * blocks + j) * D, then its output head mats[i * (blocks + 1) + blocks] (V, D) */
    int heads, blocks;
    sd_mat *mats;
    float *bias;
    /* EAGLE: the layer's matrices (g_layer_mats' order), fc, and EAGLE-3's lm_head, as read:
     * views of the file, or Q8_0 copies (sd_head_quantize) */
    sd_mat layer_mats[7], fc, lm_head;
    /* the Q8_0 copies and repacked twins: [0] of the matrices stored in blocks (at load), [1] of
     * the float ones (sd_head_quantize) */
    void *q8[2];
    int quantized; /* the float matrices are Q8_0 copies */
#ifdef SD_WITH_CUDA
    /* Medusa beside a CUDA target: its matrices' copy on that target's GPU (made at the first
     * step there); the lock keeps one caller at a time on it */
    pthread_mutex_t lock;
    sd_cuda_medusa *cuda_medusa;
    int cuda_gpu;
#endif
};

static sd_status convert(sd_head *h, int quantize);

#ifdef SD_WITH_CUDA
/* A head beside a CUDA target runs on the target's GPU (an EAGLE head's layer, Medusa's
 * heads), unless SPECDEC_CUDA_HEAD=0 keeps it on the CPU (an EAGLE head's rows, fc over the
 * target's features, are made on the host either way). */
static int head_on_gpu(void) {
    const char *v = getenv("SPECDEC_CUDA_HEAD");
    return v == NULL || *v == '\0' || strcmp(v, "0") != 0;
}
#endif

static const char *const g_layer_mats[7] = {
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
};

static const sd_tensor_info *find(const sd_head *h, const char *prefix, const char *name) {
    char full[160];
    snprintf(full, sizeof(full), "%s%s", prefix, name);
    return sd_st_find(h->st, full);
}

/* The block type a matrix tensor is stored in, or -1 for none: specdec's compact form of a
 * shipped head stores a matrix of (rows, cols) as U8 rows of ggml blocks of 32 elements,
 * safetensors having no such dtype: (rows, cols / 32 * 34) or (rows, cols / 32, 34) for Q8_0 (an
 * f16 scale, 32 int8), (rows, cols / 32, 20) for Q4_1 (f16 scale and minimum, 32 nibbles) and
 * (rows, cols / 32, 18) for Q4_0 (an f16 scale, 32 nibbles less 8). */
static int block_type(const sd_tensor_info *t) {
    if (strcmp(t->type_name, "U8") != 0) {
        return -1;
    }
    if (t->n_dims == 2) {
        return t->shape[1] % 34 == 0 ? SD_TYPE_Q8_0 : -1;
    }
    if (t->n_dims != 3) {
        return -1;
    }
    switch (t->shape[2]) {
    case 34: return SD_TYPE_Q8_0;
    case 20: return SD_TYPE_Q4_1;
    case 18: return SD_TYPE_Q4_0;
    default: return -1;
    }
}

/* A matrix tensor's columns: its elements per row. */
static int64_t cols_of(const sd_tensor_info *t) {
    if (block_type(t) < 0) {
        return t->shape[1];
    }
    return t->n_dims == 3 ? t->shape[1] * 32 : t->shape[1] / 34 * 32;
}

/* The tensor prefix+name, which must be a float tensor of the given shape (cols 0: a vector),
 * or a matrix in blocks (block_type); every value (scale) finite. */
static sd_status need(const sd_head *h, const sd_tensor_info **out, const char *prefix,
                      const char *name, int64_t rows, int64_t cols) {
    const sd_tensor_info *t = find(h, prefix, name);
    if (t == NULL) {
        return sd_set_error(SD_ERR_FORMAT, "%s: missing tensor '%s%s'", h->file, prefix, name);
    }
    const int dims = cols > 0 ? 2 : 1;
    if (dims == 2 && block_type(t) >= 0 && t->shape[0] == rows && cols_of(t) == cols) {
        SD_TRY(sd_check_finite(h->file, t->name, block_type(t), t->data, rows * cols, cols));
        *out = t;
        return SD_OK;
    }
    if (t->n_dims != dims || t->shape[0] != rows || (dims == 2 && t->shape[1] != cols)) {
        char got[SD_MAX_DIMS * 24], want[48];
        sd_tensor_shape_str(got, sizeof(got), t);
        if (dims == 2) {
            snprintf(want, sizeof(want), "[%lld, %lld]", (long long)rows, (long long)cols);
        } else {
            snprintf(want, sizeof(want), "[%lld]", (long long)rows);
        }
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: tensor '%s' has shape %s, expected %s (from config.json)", h->file,
                            t->name, got, want);
    }
    if (t->type != SD_TYPE_F32 && t->type != SD_TYPE_F16 && t->type != SD_TYPE_BF16) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "%s: tensor '%s' has type %s (a head's tensors must be F32, F16 or "
                            "BF16)",
                            h->file, t->name, t->type_name);
    }
    SD_TRY(sd_check_finite(h->file, t->name, t->type, t->data, dims == 2 ? rows * cols : rows,
                           dims == 2 ? cols : 0));
    *out = t;
    return SD_OK;
}

/* A view of the tensor as a matrix (its shape checked at load). */
static sd_mat mat_of(const sd_tensor_info *t) {
    sd_mat m;
    memset(&m, 0, sizeof(m));
    m.data = t->data;
    m.type = block_type(t) >= 0 ? block_type(t) : t->type;
    m.rows = t->shape[0];
    m.cols = cols_of(t);
    m.row_bytes = sd_row_bytes(m.type, m.cols);
    m.tensor_id = -1;
    return m;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* EAGLE-3's d2t (draft id -> target id offset, I64) and t2d (BOOL, optional) into h->ids,
 * each target id checked to be in range, distinct, and marked in t2d. */
static sd_status read_ids(sd_head *h) {
    const sd_tensor_info *d2t = sd_st_find(h->st, "d2t");
    if (d2t == NULL) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: missing tensor 'd2t' (an EAGLE-3 head's draft "
                            "-> target vocabulary map)",
                            h->file);
    }
    if (d2t->n_dims != 1 || d2t->shape[0] != h->draft_vocab || strcmp(d2t->type_name, "I64") != 0) {
        return sd_set_error(SD_ERR_FORMAT, "%s: tensor 'd2t' must be I64 [%d], got %s of %d dims",
                            h->file, h->draft_vocab, d2t->type_name, d2t->n_dims);
    }
    const sd_tensor_info *t2d = sd_st_find(h->st, "t2d");
    if (t2d != NULL &&
        (t2d->n_dims != 1 || t2d->shape[0] != h->vocab || strcmp(t2d->type_name, "BOOL") != 0)) {
        return sd_set_error(SD_ERR_FORMAT, "%s: tensor 't2d' must be BOOL [%d]", h->file, h->vocab);
    }
    h->ids = malloc((size_t)h->draft_vocab * sizeof(int32_t));
    uint8_t *seen = calloc((size_t)h->vocab, 1);
    if (h->ids == NULL || seen == NULL) {
        free(seen);
        return sd_set_error(SD_ERR_NOMEM, "out of memory reading an EAGLE-3 head");
    }
    sd_status st = SD_OK;
    for (int d = 0; d < h->draft_vocab && st == SD_OK; d++) {
        int64_t off = 0;
        memcpy(&off, (const char *)d2t->data + (size_t)d * 8, 8);
        const int64_t id = (int64_t)d + off;
        if (id < 0 || id >= h->vocab || seen[id]) {
            st =
                sd_set_error(SD_ERR_FORMAT, "%s: d2t maps draft id %d to target id %lld, %s",
                             h->file, d, (long long)id,
                             id < 0 || id >= h->vocab ? "outside the vocabulary" : "already taken");
        } else if (t2d != NULL && ((const uint8_t *)t2d->data)[id] == 0) {
            st = sd_set_error(SD_ERR_FORMAT,
                              "%s: d2t maps draft id %d to target id %lld, which t2d leaves out",
                              h->file, d, (long long)id);
        } else {
            seen[id] = 1;
            h->ids[d] = (int32_t)id;
        }
    }
    free(seen);
    return st;
}

/* Whether `name` is one of the tensors an EAGLE head of h's kind reads (embed_tokens, a copy of
 * the target's embedding some trainers save, is allowed and not read). */
static int known_tensor(const sd_head *h, const char *name) {
    static const char *const top[] = {"fc.weight",   "fc.bias",        "embed_tokens.weight",
                                      "norm.weight", "lm_head.weight", "d2t",
                                      "t2d"};
    static const char *const norms[] = {"post_attention_layernorm.weight", "input_layernorm.weight",
                                        "hidden_norm.weight"};
    const int e3 = h->kind == SD_HEAD_EAGLE3;
    for (int i = 0; i < (e3 ? 7 : 3); i++) {
        if (strcmp(name, top[i]) == 0) {
            return 1;
        }
    }
    const size_t n = strlen(h->layer);
    if (strncmp(name, h->layer, n) != 0) {
        return 0;
    }
    for (int i = 0; i < 7; i++) {
        if (strcmp(name + n, g_layer_mats[i]) == 0) {
            return 1;
        }
    }
    for (int i = 0; i < (e3 ? 3 : 1); i++) {
        if (strcmp(name + n, norms[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Every tensor of the file is one the head reads. */
static sd_status check_all_known(const sd_head *h) {
    for (int i = 0; i < h->st->n_tensors; i++) {
        if (!known_tensor(h, h->st->tensors[i].name)) {
            return sd_set_error(SD_ERR_FORMAT,
                                "%s: tensor '%s' is not part of an EAGLE%s head as specdec reads "
                                "it",
                                h->file, h->st->tensors[i].name,
                                h->kind == SD_HEAD_EAGLE3 ? "-3" : "-1/2");
        }
    }
    return SD_OK;
}

/* Shapes of every tensor, from the config; the kind from fc's width. */
static sd_status check_tensors(sd_head *h, const sd_json *top, const sd_json *layer_cfg) {
    const sd_config *c = &h->cfg;
    const int64_t D = c->hidden_size, F = c->ffn_size;
    const int64_t QD = (int64_t)c->n_heads * c->head_dim,
                  KVD = (int64_t)c->n_kv_heads * c->head_dim;
    const sd_tensor_info *fc = sd_st_find(h->st, "fc.weight");
    if (fc == NULL || (fc->n_dims != 2 && block_type(fc) < 0) || fc->shape[0] != D ||
        (cols_of(fc) != 2 * D && cols_of(fc) != 3 * D)) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: no tensor 'fc.weight' of shape [%lld, %lld] (EAGLE-1/2) or "
                            "[%lld, %lld] (EAGLE-3): not an EAGLE head",
                            h->file, (long long)D, (long long)(2 * D), (long long)D,
                            (long long)(3 * D));
    }
    h->kind = cols_of(fc) == 2 * D ? SD_HEAD_EAGLE : SD_HEAD_EAGLE3;
    const int e3 = h->kind == SD_HEAD_EAGLE3;
    h->layer =
        e3 && sd_st_find(h->st, "midlayer.hidden_norm.weight") != NULL ? "midlayer." : "layers.0.";
    const sd_tensor_info *t = NULL;
    SD_TRY(need(h, &t, "", "fc.weight", D, e3 ? 3 * D : 2 * D));
    const int64_t in = e3 ? 2 * D : D;
    const int64_t rows[7] = {QD, KVD, KVD, D, F, F, D}, cols[7] = {in, in, in, QD, D, D, F};
    for (int i = 0; i < 7; i++) {
        SD_TRY(need(h, &t, h->layer, g_layer_mats[i], rows[i], cols[i]));
    }
    SD_TRY(need(h, &t, h->layer, "post_attention_layernorm.weight", D, 0));
    /* fc's bias: EAGLE-1/2 has one unless config.json says "bias": false (an absent key means
     * a bias, as the authors' code reads it); EAGLE-3 may have one */
    int bias = 1, said = 0;
    SD_TRY(sd_config_json_bool(top, "bias", &bias, &said, h->file));
    const int has_bias = sd_st_find(h->st, "fc.bias") != NULL;
    if (!e3 && bias != has_bias) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: config.json %s fc has a bias but the file %s 'fc.bias'", h->file,
                            said ? (bias ? "says (\"bias\": true)" : "says (\"bias\": false) no")
                                 : "has no \"bias\" key, which means",
                            has_bias ? "holds" : "has no");
    }
    if (has_bias) {
        SD_TRY(need(h, &t, "", "fc.bias", D, 0));
    }
    if (!e3) {
        if (find(h, h->layer, "input_layernorm.weight") != NULL) {
            return sd_set_error(SD_ERR_UNSUPPORTED,
                                "%s: an EAGLE-1/2 layer with an input_layernorm is not the "
                                "published layout (its layer reads fc's output unnormed)",
                                h->file);
        }
        h->draft_vocab = h->vocab;
        return check_all_known(h);
    }
    SD_TRY(need(h, &t, h->layer, "input_layernorm.weight", D, 0));
    SD_TRY(need(h, &t, h->layer, "hidden_norm.weight", D, 0));
    SD_TRY(need(h, &t, "", "norm.weight", D, 0));
    const sd_tensor_info *lm = sd_st_find(h->st, "lm_head.weight");
    if (lm == NULL || (lm->n_dims != 2 && block_type(lm) < 0)) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: missing tensor 'lm_head.weight' [draft vocab, %lld]", h->file,
                            (long long)D);
    }
    h->draft_vocab = (int)lm->shape[0];
    int64_t dv = 0;
    if ((sd_json_get_int(top, "draft_vocab_size", &dv) ||
         sd_json_get_int(layer_cfg, "draft_vocab_size", &dv)) &&
        dv != h->draft_vocab) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: config.json's draft_vocab_size %lld disagrees with lm_head's %d "
                            "rows",
                            h->file, (long long)dv, h->draft_vocab);
    }
    if (h->draft_vocab < 1 || h->draft_vocab > h->vocab) {
        return sd_set_error(SD_ERR_FORMAT, "%s: a draft vocabulary of %d for a vocabulary of %d",
                            h->file, h->draft_vocab, h->vocab);
    }
    SD_TRY(need(h, &t, "", "lm_head.weight", h->draft_vocab, D));
    SD_TRY(read_ids(h));
    return check_all_known(h);
}

/* vLLM speculators' settings (its config nests the layer's in transformer_layer_config). */
static sd_status speculators_settings(sd_head *h, const sd_json *top, const char *cfg_path) {
    int nbr = 0, said = 0;
    SD_TRY(sd_config_json_bool(top, "norm_before_residual", &nbr, &said, cfg_path));
    if (said) {
        h->cfg.head_norm_residual = nbr;
    }
    const sd_json *ids = sd_json_get(top, "eagle_aux_hidden_state_layer_ids");
    if (ids != NULL && ids->type != SD_JSON_NULL) {
        if (ids->type != SD_JSON_ARRAY || ids->n != 3) {
            return sd_set_error(SD_ERR_FORMAT,
                                "%s: \"eagle_aux_hidden_state_layer_ids\" must list 3 layers",
                                cfg_path);
        }
        for (int i = 0; i < 3; i++) {
            const sd_json *v = &ids->items[i];
            if (v->type != SD_JSON_NUMBER || !v->is_integer || v->integer < 0 ||
                v->integer > 100000) {
                return sd_set_error(SD_ERR_FORMAT,
                                    "%s: \"eagle_aux_hidden_state_layer_ids\"[%d] is not a layer",
                                    cfg_path, i);
            }
            h->aux[i] = (int32_t)v->integer;
        }
        h->n_aux = 3;
    }
    int64_t th = 0;
    if (sd_json_get_int(top, "target_hidden_size", &th) && th != h->cfg.hidden_size) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "%s: \"target_hidden_size\" %lld differs from the head's hidden size "
                            "%d (a projected target is not supported)",
                            cfg_path, (long long)th, h->cfg.hidden_size);
    }
    return SD_OK;
}

/* y = W x (+ b) over T rows, with the activations quantized when W is of a quantized type. */
static sd_status head_matmul(sd_threadpool *pool, int T, const sd_matmul_job *job) {
    unsigned char *xq = NULL;
    if (sd_matmul_wants_q8(job, 1)) {
        xq = malloc(SD_Q8_BATCH_BYTES((size_t)T, (size_t)job->w->cols));
        if (xq == NULL) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory for a head's activations");
        }
    }
    sd_matmul(pool, T, job, 1, xq, 0);
    free(xq);
    return SD_OK;
}

/* ---- Medusa ---------------------------------------------------------------------------------- */

/* The tensor "{i}.{j}.{what}" of a Medusa file, or NULL. */
static const sd_tensor_info *medusa_find(const sd_head *h, int i, int j, const char *what) {
    char name[96];
    snprintf(name, sizeof(name), "%d.%d.%s", i, j, what);
    return sd_st_find(h->st, name);
}

/* Medusa-1's heads (Cai et al. 2024) as medusa_model.py saves them: head i is `blocks` residual
 * blocks y + SiLU(W y + b) ("{i}.{j}.linear.weight/bias") and an output head "{i}.{blocks}.weight"
 * [V, D]. The counts come from the tensors (the published Vicuna-7B config says 2 heads where
 * the file holds 5). */
static sd_status load_medusa(sd_head *h) {
    const sd_tensor_info *t = NULL;
    while (medusa_find(h, h->heads, 0, "linear.weight") != NULL ||
           medusa_find(h, h->heads, 0, "weight") != NULL) {
        h->heads++;
    }
    while (medusa_find(h, 0, h->blocks, "linear.weight") != NULL) {
        h->blocks++;
    }
    const sd_tensor_info *o = h->heads > 0 ? medusa_find(h, 0, h->blocks, "weight") : NULL;
    if (o == NULL || (o->n_dims != 2 && block_type(o) < 0)) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: no Medusa heads ('0.0.linear.weight' ... '0.<blocks>.weight')",
                            h->file);
    }
    const int64_t V = o->shape[0], D = cols_of(o);
    h->cfg.hidden_size = (int)D;
    h->vocab = (int)V;
    h->kind = SD_HEAD_MEDUSA;
    h->mats = calloc((size_t)h->heads * (size_t)(h->blocks + 1), sizeof(sd_mat));
    h->bias = malloc(((size_t)h->heads * (size_t)h->blocks + 1) * (size_t)D * sizeof(float));
    if (h->mats == NULL || h->bias == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory loading Medusa heads");
    }
    for (int i = 0; i < h->heads; i++) {
        char pre[32];
        for (int j = 0; j < h->blocks; j++) {
            snprintf(pre, sizeof(pre), "%d.%d.", i, j);
            SD_TRY(need(h, &t, pre, "linear.weight", D, D));
            h->mats[i * (h->blocks + 1) + j] = mat_of(t);
            SD_TRY(need(h, &t, pre, "linear.bias", D, 0));
            sd_type_get(t->type)->to_float(
                h->bias + ((size_t)i * (size_t)h->blocks + (size_t)j) * (size_t)D, t->data, D);
        }
        snprintf(pre, sizeof(pre), "%d.%d.", i, h->blocks);
        SD_TRY(need(h, &t, pre, "weight", V, D));
        h->mats[i * (h->blocks + 1) + h->blocks] = mat_of(t);
    }
    /* every tensor is one of those */
    const int expect = h->heads * (2 * h->blocks + 1);
    if (h->st->n_tensors != expect) {
        for (int k = 0; k < h->st->n_tensors; k++) {
            int i = -1, j = -1, used = 0;
            const char *name = h->st->tensors[k].name;
            if (sscanf(name, "%d.%d.%n", &i, &j, &used) < 2 || i < 0 || i >= h->heads || j < 0 ||
                j > h->blocks ||
                strcmp(name + used, j < h->blocks
                                        ? (strstr(name, "bias") ? "linear.bias" : "linear.weight")
                                        : "weight") != 0) {
                return sd_set_error(SD_ERR_FORMAT,
                                    "%s: tensor '%s' is not part of %d Medusa heads of %d "
                                    "blocks",
                                    h->file, name, h->heads, h->blocks);
            }
        }
    }
    return SD_OK;
}

int sd_head_medusa_heads(const sd_head *h) {
    return h->kind == SD_HEAD_MEDUSA ? h->heads : 0;
}

#ifdef SD_WITH_CUDA
/* Medusa's heads on the CUDA target's GPU: their device copy made at the first call there (or
 * made again for another GPU), one caller at a time. */
static sd_status medusa_logits_cuda(sd_head *h, sd_model *target, int T, const float *x,
                                    float *out) {
    const int gpu = sd_cuda_model_gpu(target->cuda);
    pthread_mutex_lock(&h->lock);
    sd_status st = SD_OK;
    if (h->cuda_medusa != NULL && h->cuda_gpu != gpu) {
        sd_cuda_medusa_free(h->cuda_medusa);
        h->cuda_medusa = NULL;
    }
    if (h->cuda_medusa == NULL) {
        st = sd_cuda_medusa_create(&h->cuda_medusa, gpu, h->heads, h->blocks, h->mats, h->bias);
        h->cuda_gpu = gpu;
    }
    if (st == SD_OK) {
        st = sd_cuda_medusa_logits(h->cuda_medusa, T, x, out);
    }
    pthread_mutex_unlock(&h->lock);
    return st;
}
#endif

sd_status sd_head_medusa_logits(const sd_head *h, sd_model *target, int T, const float *x,
                                float *out) {
#ifdef SD_WITH_CUDA
    if (target->cuda != NULL && head_on_gpu()) {
        return medusa_logits_cuda((sd_head *)h, target, T, x, out);
    }
#endif
    const size_t D = (size_t)h->cfg.hidden_size, V = (size_t)h->vocab;
    float *y = malloc(2 * (size_t)T * D * sizeof(float));
    if (y == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory for Medusa's heads");
    }
    float *u = y + (size_t)T * D;
    for (int i = 0; i < h->heads; i++) {
        memcpy(y, x, (size_t)T * D * sizeof(float));
        for (int j = 0; j < h->blocks; j++) { /* y += silu(W y + b) */
            const float *b = h->bias + ((size_t)i * (size_t)h->blocks + (size_t)j) * D;
            sd_matmul_job job = {u, y, &h->mats[i * (h->blocks + 1) + j], b, 0};
            if (head_matmul(target->pool, T, &job) != SD_OK) {
                free(y);
                return SD_ERR_NOMEM;
            }
            sd_silu_add(y, u, (int64_t)T * (int64_t)D);
        }
        sd_matmul_job o = {out + (size_t)i * (size_t)T * V, y,
                           &h->mats[i * (h->blocks + 1) + h->blocks], NULL, 0};
        if (head_matmul(target->pool, T, &o) != SD_OK) {
            free(y);
            return SD_ERR_NOMEM;
        }
    }
    free(y);
    return SD_OK;
}

/* ---- loading -----------------------------------------------------------------------------------
 */

sd_status sd_head_load(sd_head **out, const char *path) {
    *out = NULL;
    sd_head *h = calloc(1, sizeof(*h));
    const size_t n = strlen(path);
    char *buf = malloc(n + 32);
    if (h == NULL || buf == NULL) {
        free(h);
        free(buf);
        return sd_set_error(SD_ERR_NOMEM, "out of memory loading a head");
    }
#ifdef SD_WITH_CUDA
    pthread_mutex_init(&h->lock, NULL);
#endif
    static const char *const medusa_files[2] = {"medusa_lm_head.safetensors", "medusa_lm_head.pt"};
    for (int i = 0; i < 2; i++) {
        snprintf(h->file, sizeof(h->file), "%s/%s", path, medusa_files[i]);
        if (is_file(h->file)) { /* Medusa: the tensors say it all (config.json is not read) */
            free(buf);
            sd_status st = sd_tensor_set_open_file(&h->st, h->file);
            if (st == SD_OK) {
                st = load_medusa(h);
            }
            if (st == SD_OK) {
                st = convert(h, 0);
            }
            if (st != SD_OK) {
                sd_head_free(h);
                return st;
            }
            *out = h;
            return SD_OK;
        }
    }
    snprintf(buf, n + 32, "%s/config.json", path);
    if (!is_file(buf)) {
        sd_head_free(h);
        free(buf);
        return sd_set_error(SD_ERR_IO,
                            "%s holds no head: neither medusa_lm_head.safetensors nor "
                            "medusa_lm_head.pt (Medusa heads) nor config.json (EAGLE heads, "
                            "beside model.safetensors or pytorch_model.bin)",
                            path);
    }
    sd_json *cfg = NULL;
    sd_status st = sd_json_read_file(&cfg, buf);
    if (st == SD_OK && cfg->type != SD_JSON_OBJECT) {
        st = sd_set_error(SD_ERR_FORMAT, "%s is not a JSON object", buf);
    }
    const sd_json *layer_cfg = cfg;
    if (st == SD_OK) {
        const sd_json *tl = sd_json_get(cfg, "transformer_layer_config");
        layer_cfg = tl != NULL && tl->type == SD_JSON_OBJECT ? tl : cfg;
        const char *weights[2] = {"model.safetensors", "pytorch_model.bin"};
        for (int i = 0; i < 2; i++) {
            snprintf(h->file, sizeof(h->file), "%s/%s", path, weights[i]);
            if (is_file(h->file)) {
                break;
            }
        }
        st = sd_tensor_set_open_file(&h->st, h->file);
    }
    if (st == SD_OK) {
        st = sd_config_from_hf(&h->cfg, layer_cfg, buf, h->st);
    }
    if (st == SD_OK && h->cfg.n_layers != 1) {
        st = sd_set_error(SD_ERR_UNSUPPORTED,
                          "%s: \"num_hidden_layers\" = %d; EAGLE heads of one layer are supported",
                          buf, h->cfg.n_layers);
    }
    if (st == SD_OK && (h->cfg.arch != SD_ARCH_LLAMA || h->cfg.sliding_window > 0)) {
        st = sd_set_error(SD_ERR_UNSUPPORTED, "%s: a head's layer must be a llama layer, not %s",
                          buf, h->cfg.arch_name);
    }
    if (st == SD_OK && h->cfg.rope_scaling == SD_ROPE_YARN) { /* no checkpoint has one */
        st = sd_set_error(SD_ERR_UNSUPPORTED, "%s: YaRN RoPE scaling in a head is not supported",
                          buf);
    }
    if (st == SD_OK) {
        h->vocab = h->cfg.vocab_size;
        st = speculators_settings(h, cfg, buf);
    }
    if (st == SD_OK) {
        st = check_tensors(h, cfg, layer_cfg);
    }
    if (st == SD_OK) {
        for (int i = 0; i < 7; i++) {
            h->layer_mats[i] = mat_of(find(h, h->layer, g_layer_mats[i]));
        }
        h->fc = mat_of(sd_st_find(h->st, "fc.weight"));
        if (h->kind == SD_HEAD_EAGLE3) {
            h->lm_head = mat_of(sd_st_find(h->st, "lm_head.weight"));
        }
        st = convert(h, 0); /* matrices stored in blocks: repacked */
    }
    sd_json_free(cfg);
    free(buf);
    if (st != SD_OK) {
        sd_head_free(h);
        return st;
    }
    h->cfg.head = h->kind;
    *out = h;
    return SD_OK;
}

void sd_head_free(sd_head *h) {
    if (h != NULL) {
#ifdef SD_WITH_CUDA
        sd_cuda_medusa_free(h->cuda_medusa);
        pthread_mutex_destroy(&h->lock);
#endif
        sd_st_close(h->st);
        free(h->ids);
        free(h->mats);
        free(h->bias);
        free(h->q8[0]);
        free(h->q8[1]);
        free(h);
    }
}

/* The head's matrices that quantize: every one whose rows are whole Q8_0 blocks. */
static int head_mats(sd_head *h, sd_mat **out) {
    int n = 0;
    if (h->kind == SD_HEAD_MEDUSA) {
        for (int i = 0; i < h->heads * (h->blocks + 1); i++) {
            out[n++] = &h->mats[i];
        }
    } else {
        for (int i = 0; i < 7; i++) {
            out[n++] = &h->layer_mats[i];
        }
        out[n++] = &h->fc;
        if (h->kind == SD_HEAD_EAGLE3) {
            out[n++] = &h->lm_head;
        }
    }
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (out[i]->cols % 32 == 0) {
            out[kept++] = out[i];
        }
    }
    return kept;
}

/* One row of n floats (n % 32 == 0) as ggml's Q8_0 blocks: an f16 scale d = max|x| / 127 and 32
 * int8 q = round(x / d). */
static void q8_0_row(uint8_t *dst, const float *x, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, dst += 34, x += 32) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        }
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = sd_f32_to_f16(d);
        memcpy(dst, &dh, 2);
        for (int i = 0; i < 32; i++) {
            dst[2 + i] = (uint8_t)(int8_t)lrintf(x[i] * id);
        }
    }
}

static int is_blocks(const sd_mat *m) {
    return m->type == SD_TYPE_Q8_0 || m->type == SD_TYPE_Q4_1 || m->type == SD_TYPE_Q4_0;
}

/* The matrices stored in blocks repacked (quantize 0, at load), or the float ones quantized to
 * Q8_0 and repacked (1), into block h->q8[quantize]. */
static sd_status convert(sd_head *h, int quantize) {
    sd_mat *mats[SD_MAX_TREE_NODES * 3 + 16];
    if (h->kind == SD_HEAD_MEDUSA && h->heads * (h->blocks + 1) > SD_MAX_TREE_NODES * 3) {
        return SD_OK; /* an optimisation, not a requirement */
    }
    int n = head_mats(h, mats), kept = 0;
    for (int i = 0; i < n; i++) {
        if (is_blocks(mats[i]) != quantize) {
            mats[kept++] = mats[i];
        }
    }
    n = kept;
    size_t total = 0;
    for (int i = 0; i < n; i++) { /* stored blocks are only repacked */
        const int type = quantize ? SD_TYPE_Q8_0 : mats[i]->type;
        if (quantize) {
            total += (size_t)mats[i]->rows * sd_row_bytes(SD_TYPE_Q8_0, mats[i]->cols);
        }
        total += sd_repack_bytes(type, mats[i]->rows, mats[i]->cols);
    }
    int64_t widest = 0;
    for (int i = 0; i < n; i++) {
        widest = mats[i]->cols > widest ? mats[i]->cols : widest;
    }
    uint8_t *p = h->q8[quantize] = malloc(total > 0 ? total : 1);
    float *row = malloc((size_t)(widest > 0 ? widest : 1) * sizeof(float));
    if (p == NULL || row == NULL) {
        free(row);
        return sd_set_error(SD_ERR_NOMEM, "out of memory quantizing a head");
    }
    for (int i = 0; i < n; i++) {
        sd_mat *m = mats[i];
        if (quantize) {
            const size_t rb = sd_row_bytes(SD_TYPE_Q8_0, m->cols);
            const sd_type_traits *tr = sd_type_get(m->type);
            for (int64_t r = 0; r < m->rows; r++) {
                tr->to_float(row, (const uint8_t *)m->data + (size_t)r * m->row_bytes, m->cols);
                q8_0_row(p + (size_t)r * rb, row, m->cols);
            }
            m->data = p;
            m->type = SD_TYPE_Q8_0;
            m->row_bytes = rb;
            p += (size_t)m->rows * rb;
        }
        m->packed = NULL;
        const size_t pb = sd_repack_bytes(m->type, m->rows, m->cols);
        if (pb > 0) { /* the 8-row interleaved twin the integer tiles read */
            sd_repack(p, m->type, m->data, m->row_bytes, m->rows, m->cols);
            m->packed = p;
            p += pb;
        }
    }
    free(row);
    return SD_OK;
}

sd_status sd_head_quantize(sd_head *h) {
    if (h->quantized) {
        return SD_OK;
    }
#ifdef SD_WITH_CUDA
    pthread_mutex_lock(&h->lock); /* a device copy of the float matrices goes */
    sd_cuda_medusa_free(h->cuda_medusa);
    h->cuda_medusa = NULL;
    pthread_mutex_unlock(&h->lock);
#endif
    SD_TRY(convert(h, 1));
    h->quantized = 1;
    return SD_OK;
}

int sd_head_kind_of(const sd_head *h) {
    return h->kind;
}

int sd_head_aux_layers(const sd_head *h, const sd_model *target, int32_t *aux) {
    if (h->kind != SD_HEAD_EAGLE3) {
        return 0;
    }
    const int L = target->cfg.n_layers;
    for (int i = 0; i < 3; i++) {
        aux[i] = h->n_aux == 3 ? h->aux[i] : (i == 0 ? 2 : i == 1 ? L / 2 : L - 3);
    }
    return 3;
}

int sd_head_feature_width(const sd_head *h, const sd_model *target) {
    return (h->kind == SD_HEAD_EAGLE3 ? 3 : 1) * target->cfg.hidden_size;
}

int sd_head_vocab(const sd_head *h, const sd_model *target) {
    return h->kind == SD_HEAD_EAGLE3 ? h->draft_vocab : target->cfg.vocab_size;
}

const int32_t *sd_head_target_ids(const sd_head *h) {
    return h->kind == SD_HEAD_EAGLE3 ? h->ids : NULL;
}

double sd_head_cost(const sd_head *h, const sd_model *target) {
    size_t bytes = 0;
    for (int i = 0; i < h->st->n_tensors; i++) {
        bytes += strcmp(h->st->tensors[i].name, "embed_tokens.weight") != 0
                     ? h->st->tensors[i].nbytes
                     : 0;
    }
    if (h->kind == SD_HEAD_EAGLE) {
        bytes += (size_t)target->w.output.rows * target->w.output.row_bytes;
    }
    if (h->kind == SD_HEAD_MEDUSA) { /* all heads at once, for a whole step */
        bytes /= (size_t)(h->heads > 0 ? h->heads : 1);
    }
    return (double)bytes / (double)(target->weight_bytes > 0 ? target->weight_bytes : 1);
}

sd_status sd_head_check(const sd_head *h, const sd_model *target) {
    const sd_config *t = &target->cfg;
    if (h->cfg.hidden_size != t->hidden_size) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "the head's hidden size %d does not match the target's %d (%s)",
                            h->cfg.hidden_size, t->hidden_size, h->file);
    }
    if (h->vocab != t->vocab_size) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "the head's vocabulary of %d does not match the target's %d (%s)",
                            h->vocab, t->vocab_size, h->file);
    }
    if (target->cuda != NULL && (target->w.tok_embd.data == NULL ||
                                 (h->kind == SD_HEAD_EAGLE && target->w.output.data == NULL))) {
        /* the head runs on the CPU beside a CUDA target: it reads the target's token embeddings
         * (and an EAGLE-1 head its output matrix) from the host mapping of the model file */
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "a head beside a CUDA target reads the target's token embeddings from "
                            "its file on the host, and this model has none there (a dummy model "
                            "made on the device)");
    }
    if (t->head) {
        return sd_set_error(SD_ERR_INVALID_ARG, "a head's target cannot be a head");
    }
    if (h->kind == SD_HEAD_MEDUSA) {
        return SD_OK;
    }
    int32_t aux[3];
    for (int i = 0, n = sd_head_aux_layers(h, target, aux); i < n; i++) {
        if (aux[i] < 0 || aux[i] >= t->n_layers) {
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "the EAGLE-3 head reads the target's layer %d, but the target has "
                                "%d layers (%s)",
                                aux[i], t->n_layers, h->file);
        }
    }
    return SD_OK;
}

/* An f32 copy of the vector tensor prefix+name into dst (its length checked at load). */
static const float *vec_of(const sd_head *h, float *dst, const char *prefix, const char *name) {
    const sd_tensor_info *t = find(h, prefix, name);
    if (t == NULL) {
        return NULL;
    }
    sd_type_get(t->type)->to_float(dst, t->data, t->shape[0]);
    return dst;
}

sd_status sd_head_bind(sd_model **out, const sd_head *h, sd_model *target) {
    *out = NULL;
    SD_TRY(sd_head_check(h, target));
    sd_model *m = sd_model_alloc();
    const size_t D = (size_t)h->cfg.hidden_size, Dh = (size_t)h->cfg.head_dim;
    if (m != NULL) {
        m->w.layers = calloc(1, sizeof(sd_layer));
        m->vectors = malloc(6 * D * sizeof(float));
        m->rope_freq = malloc(Dh / 2 * sizeof(double));
    }
    if (m == NULL || m->w.layers == NULL || m->vectors == NULL || m->rope_freq == NULL) {
        sd_model_free(m);
        return sd_set_error(SD_ERR_NOMEM, "out of memory binding a head");
    }
    m->cfg = h->cfg;
    m->cfg.vocab_size = target->cfg.vocab_size;
    m->cfg.context_length = target->cfg.context_length;
    m->cfg.weight_type = SD_TYPE_F32;
    m->device = SD_DEVICE_CPU;
    m->pool = target->pool;
    m->borrowed_pool = 1;
    sd_weights *w = &m->w;
    sd_layer *L = w->layers;
    w->tok_embd = target->w.tok_embd;
    sd_mat *mats[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    for (int i = 0; i < 7; i++) {
        *mats[i] = h->layer_mats[i];
        m->weight_bytes += (size_t)mats[i]->rows * mats[i]->row_bytes;
    }
    w->fc = h->fc;
    m->weight_bytes += (size_t)w->fc.rows * w->fc.row_bytes;
    float *v = m->vectors;
    L->ffn_norm = vec_of(h, v, h->layer, "post_attention_layernorm.weight");
    w->fc_bias = vec_of(h, v + D, "", "fc.bias");
    if (h->kind == SD_HEAD_EAGLE3) {
        L->attn_norm = vec_of(h, v + 2 * D, h->layer, "input_layernorm.weight");
        L->hidden_norm = vec_of(h, v + 3 * D, h->layer, "hidden_norm.weight");
        w->out_norm = vec_of(h, v + 4 * D, "", "norm.weight");
        w->output = h->lm_head;
    } else {
        w->output = target->w.output; /* no norm before it: the head's output is the feature */
    }
    m->weight_bytes += (size_t)w->output.rows * w->output.row_bytes;
    sd_config_rope_freq(m->rope_freq, &m->cfg, NULL);
#ifdef SD_WITH_CUDA
    if (target->cuda != NULL && head_on_gpu()) { /* its layer beside the target, on its GPU */
        const sd_status st =
            sd_cuda_head_create(&m->cuda, m, target->cuda, h->kind == SD_HEAD_EAGLE3);
        if (st != SD_OK) {
            sd_model_free(m);
            return st;
        }
        m->device = SD_DEVICE_CUDA;
    }
#endif
    *out = m;
    return SD_OK;
}

sd_status sd_head_rows(const sd_head *h, sd_model *hm, int T, const int32_t *tokens, const float *f,
                       int from_target, float *x) {
    const size_t D = (size_t)hm->cfg.hidden_size;
    if (T < 1) {
        return SD_OK;
    }
    if (h->kind == SD_HEAD_EAGLE3 && !from_target) { /* the parent's output enters as it is */
        memcpy(x, f, (size_t)T * D * sizeof(float));
        return SD_OK;
    }
    const float *in = f; /* EAGLE-3: (T, 3D) the target's taps */
    float *cat = NULL;
    if (h->kind == SD_HEAD_EAGLE) { /* (T, 2D): cat(embedding of the row's token, feature) */
        cat = malloc((size_t)T * 2 * D * sizeof(float));
        if (cat == NULL) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory for a head's rows");
        }
        const sd_type_traits *et = sd_type_get(hm->w.tok_embd.type);
        for (int t = 0; t < T; t++) {
            et->to_float(cat + (size_t)t * 2 * D,
                         (const unsigned char *)hm->w.tok_embd.data +
                             (size_t)tokens[t] * hm->w.tok_embd.row_bytes,
                         (int64_t)D);
            memcpy(cat + (size_t)t * 2 * D + D, f + (size_t)t * D, D * sizeof(float));
        }
        in = cat;
    }
    sd_matmul_job job = {x, in, &hm->w.fc, hm->w.fc_bias, 0};
    const sd_status st = head_matmul(hm->pool, T, &job);
    free(cat);
    return st;
}

sd_status sd_head_map_logits(const sd_head *h, int V, const float *raw, int n, float *out) {
    if (h->kind != SD_HEAD_EAGLE3) {
        if (out != raw) {
            memmove(out, raw, (size_t)n * (size_t)V * sizeof(float));
        }
        return SD_OK;
    }
    const int Vd = h->draft_vocab;
    /* in place (out == raw, rows of V >= Vd): backwards, each raw row copied first; separate
     * buffers (a drafting step's) need no copy */
    float *row = NULL;
    if (out == raw && (row = malloc((size_t)Vd * sizeof(float))) == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory for a head's logits");
    }
    for (int r = n - 1; r >= 0; r--) {
        const float *src = raw + (size_t)r * (size_t)Vd;
        if (row != NULL) {
            memcpy(row, src, (size_t)Vd * sizeof(float));
            src = row;
        }
        float *o = out + (size_t)r * (size_t)V;
        for (int i = 0; i < V; i++) {
            o[i] = -INFINITY;
        }
        for (int d = 0; d < Vd; d++) {
            o[h->ids[d]] = src[d];
        }
    }
    free(row);
    return SD_OK;
}
