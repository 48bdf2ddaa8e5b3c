/* dummy.c — a model of any llama/qwen2 shape with random weights, built in memory rather than
 * read from a file: the tensors a GGUF file of that shape would hold, with GGUF's names, so
 * model.c's builder finds and checks them as it does a file's. Values come from dummy.h (the
 * CUDA backend fills the same tensors on the device with the same function). */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/dummy.h"
#include "cpu/quant.h"
#include "util/status.h"

void sd_dummy_fill(void *dst, int type, int64_t rows, int64_t cols, uint64_t seed, uint64_t tensor,
                   float scale) {
    const int64_t n = rows * cols;
    if (type == SD_TYPE_F32 || type == SD_TYPE_F16 || type == SD_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            const float v = sd_dummy_value(seed, tensor, (uint64_t)i, scale);
            if (type == SD_TYPE_F32) {
                ((float *)dst)[i] = v;
            } else if (type == SD_TYPE_F16) {
                ((uint16_t *)dst)[i] = sd_hd_f32_to_f16(v);
            } else {
                ((uint16_t *)dst)[i] = sd_hd_f32_to_bf16(v);
            }
        }
        return;
    }
    const sd_type_traits *tr = sd_type_get(type);
    const int64_t nb = n / tr->block_size;
    for (int64_t b = 0; b < nb; b++) {
        sd_dummy_block((uint8_t *)dst + (size_t)b * (size_t)tr->type_size, type, tr->type_size,
                       seed, tensor, (uint64_t)b, scale);
    }
}

float sd_dummy_scale(int64_t cols) {
    return 1.0f / sqrtf((float)cols);
}

static int is_matrix_type(int type) {
    switch (type) {
    case SD_TYPE_F32:
    case SD_TYPE_F16:
    case SD_TYPE_BF16:
    case SD_TYPE_Q4_0:
    case SD_TYPE_Q4_1:
    case SD_TYPE_Q5_0:
    case SD_TYPE_Q5_1:
    case SD_TYPE_Q8_0:
    case SD_TYPE_Q4_K:
    case SD_TYPE_Q5_K:
    case SD_TYPE_Q6_K: return 1;
    default: return 0;
    }
}

/* One tensor of the layout: name, type, (rows, cols) or (n) when vector. */
static sd_status add(sd_dummy *d, int *cap, const char *name, int type, int64_t rows, int64_t cols,
                     int vector) {
    if (d->n == *cap) {
        *cap = *cap * 2 + 16;
        sd_tensor_info *t = realloc(d->t, (size_t)*cap * sizeof(*t));
        if (t == NULL) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory describing a dummy model");
        }
        d->t = t;
    }
    sd_tensor_info *t = &d->t[d->n];
    memset(t, 0, sizeof(*t));
    t->name = malloc(strlen(name) + 1);
    if (t->name == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory describing a dummy model");
    }
    d->n++;
    strcpy(t->name, name);
    t->type = type;
    snprintf(t->type_name, sizeof(t->type_name), "%s", sd_type_name(type));
    t->n_dims = vector ? 1 : 2;
    t->shape[0] = rows;
    t->shape[1] = vector ? 0 : cols;
    const size_t rb = sd_row_bytes(type, vector ? rows : cols);
    if (rb == 0) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "a dummy %s tensor '%s' needs rows of a multiple of %d elements, "
                            "got %lld",
                            sd_type_name(type), name, sd_type_get(type)->block_size,
                            (long long)(vector ? rows : cols));
    }
    t->nbytes = vector ? rb : rb * (size_t)rows;
    return SD_OK;
}

sd_status sd_dummy_create(sd_dummy **out, const sd_config *c, int weight_type, uint64_t seed,
                          int host_data) {
    *out = NULL;
    if (!is_matrix_type(weight_type)) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "dummy weights of type %s are not supported (supported: F32, F16, "
                            "BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)",
                            sd_type_name(weight_type));
    }
    sd_dummy *d = calloc(1, sizeof(*d));
    if (d == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    d->seed = seed;
    const int64_t D = c->hidden_size, V = c->vocab_size, F = c->ffn_size;
    const int64_t QD = (int64_t)c->n_heads * c->head_dim;
    const int64_t KVD = (int64_t)c->n_kv_heads * c->head_dim;
    int cap = 0;
    char name[96];
    sd_status st = add(d, &cap, "token_embd.weight", weight_type, V, D, 0);
    if (st == SD_OK) {
        st = add(d, &cap, "output_norm.weight", SD_TYPE_F32, D, 0, 1);
    }
    if (st == SD_OK && !c->tied_embeddings) {
        st = add(d, &cap, "output.weight", weight_type, V, D, 0);
    }
    for (int l = 0; st == SD_OK && l < c->n_layers; l++) {
        struct {
            const char *fmt;
            int64_t rows, cols;
            int vector;
        } lt[] = {
            {"blk.%d.attn_norm.weight", D, 0, 1},    {"blk.%d.attn_q.weight", QD, D, 0},
            {"blk.%d.attn_k.weight", KVD, D, 0},     {"blk.%d.attn_v.weight", KVD, D, 0},
            {"blk.%d.attn_output.weight", D, QD, 0}, {"blk.%d.ffn_norm.weight", D, 0, 1},
            {"blk.%d.ffn_gate.weight", F, D, 0},     {"blk.%d.ffn_up.weight", F, D, 0},
            {"blk.%d.ffn_down.weight", D, F, 0},     {"blk.%d.attn_q.bias", QD, 0, 1},
            {"blk.%d.attn_k.bias", KVD, 0, 1},       {"blk.%d.attn_v.bias", KVD, 0, 1},
        };
        const int n_lt = c->has_qkv_bias ? 12 : 9;
        for (int i = 0; st == SD_OK && i < n_lt; i++) {
            snprintf(name, sizeof(name), lt[i].fmt, l);
            st = add(d, &cap, name, lt[i].vector ? SD_TYPE_F32 : weight_type, lt[i].rows,
                     lt[i].cols, lt[i].vector);
        }
    }
    /* one block for the tensors kept on the host: all of them, or (host_data == 0: the
     * matrices live on a device only) just the norms and biases */
    size_t total = 0;
    for (int i = 0; st == SD_OK && i < d->n; i++) {
        if (host_data || d->t[i].n_dims == 1) {
            total += (d->t[i].nbytes + 63) / 64 * 64;
        }
    }
    if (st == SD_OK) {
        d->block = malloc(total > 0 ? total : 1);
        if (d->block == NULL) {
            st = sd_set_error(SD_ERR_NOMEM,
                              "out of memory for the %zu MiB of a dummy model's weights",
                              total >> 20);
        }
    }
    size_t off = 0;
    for (int i = 0; st == SD_OK && i < d->n; i++) {
        sd_tensor_info *t = &d->t[i];
        if (!host_data && t->n_dims == 2) {
            continue; /* data stays NULL: the device fills it */
        }
        t->data = d->block + off;
        off += (t->nbytes + 63) / 64 * 64;
        if (t->n_dims == 1) { /* norms are ones, biases small */
            float *v = (float *)t->data;
            const int bias = strstr(t->name, ".bias") != NULL;
            for (int64_t j = 0; j < t->shape[0]; j++) {
                v[j] = bias ? sd_dummy_value(seed, (uint64_t)i, (uint64_t)j, 0.02f) : 1.0f;
            }
        } else {
            sd_dummy_fill((void *)t->data, t->type, t->shape[0], t->shape[1], seed, (uint64_t)i,
                          sd_dummy_scale(t->shape[1]));
        }
    }
    if (st != SD_OK) {
        sd_dummy_free(d);
        return st;
    }
    *out = d;
    return SD_OK;
}

void sd_dummy_free(sd_dummy *d) {
    if (d == NULL) {
        return;
    }
    for (int i = 0; i < d->n; i++) {
        free(d->t[i].name);
    }
    free(d->t);
    free(d->block);
    free(d);
}

const sd_tensor_info *sd_dummy_find(const sd_dummy *d, const char *name) {
    for (int i = 0; i < d->n; i++) {
        if (strcmp(d->t[i].name, name) == 0) {
            return &d->t[i];
        }
    }
    return NULL;
}
