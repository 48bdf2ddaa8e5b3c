/* forward.c — one forward pass of a llama/qwen2/qwen3 decoder over a batch of T tokens at given
 * positions, writing K/V into given cache slots and attending through an explicit mask, so one
 * call serves prefill, single-token decode and the scoring of a whole draft tree. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/model.h"
#include "cpu/ops_cpu.h"
#include "cpu/quant.h"
#include "util/status.h"
#ifdef SD_WITH_CUDA
#include "../cuda/sd_cuda.h"
#endif

/* Check everything about the batch before any state changes (token ids only when they are
 * on the host). */
static sd_status validate(const sd_model *m, const sd_kv_cache *kv, const sd_batch *b,
                          int dev_tokens, int *new_len) {
    const sd_config *c = &m->cfg;
    const int T = b->n_tokens;
    if (T < 1 || (b->tokens == NULL && !dev_tokens)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "a forward needs at least one token");
    }
    if (b->n_logits < 0 || b->n_logits > T) {
        return sd_set_error(SD_ERR_INVALID_ARG, "n_logits %d is out of range [0, %d]", b->n_logits,
                            T);
    }
    if (b->n_layers < 0 || b->n_layers > c->n_layers) {
        return sd_set_error(SD_ERR_INVALID_ARG, "n_layers %d is out of range [0, %d] (0 = all)",
                            b->n_layers, c->n_layers);
    }
    int len = kv->length;
    for (int t = 0; t < T; t++) {
        int32_t tok = dev_tokens ? 0 : b->tokens[t];
        if (tok < 0 || tok >= c->vocab_size) {
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "token id %d at index %d is out of range [0, %d) (vocab size)", tok,
                                t, c->vocab_size);
        }
        int32_t p = b->pos != NULL ? b->pos[t] : kv->length + t;
        if (p < 0 || p >= c->context_length) {
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "position %d at index %d is beyond the context length %d "
                                "(positions must be in [0, %d))",
                                p, t, c->context_length, c->context_length);
        }
        int32_t s = b->slots != NULL ? b->slots[t] : kv->length + t;
        if (s < 0 || s >= kv->capacity) {
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "cache slot %d at index %d is out of range [0, %d) (cache "
                                "capacity%s)",
                                s, t, kv->capacity,
                                kv->capacity == c->context_length ? " = context length" : "");
        }
        len = s + 1 > len ? s + 1 : len;
    }
    if (b->slots != NULL) {
        for (int t = 1; t < T; t++) {
            for (int u = 0; u < t; u++) {
                if (b->slots[t] == b->slots[u]) {
                    return sd_set_error(SD_ERR_INVALID_ARG,
                                        "cache slot %d is written twice (indices %d and %d)",
                                        b->slots[t], u, t);
                }
            }
        }
    }
    if (b->mask != NULL) {
        if (b->n_mask_cols < 1 || b->n_mask_cols > len) {
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "mask has %d columns; it must cover between 1 and %d cache "
                                "slots (the cache length after this batch)",
                                b->n_mask_cols, len);
        }
        for (int t = 0; t < T; t++) {
            const uint8_t *row = b->mask + (size_t)t * (size_t)b->n_mask_cols;
            int any = 0;
            for (int s = 0; s < b->n_mask_cols && !any; s++) {
                any = row[s] != 0;
            }
            if (!any) {
                return sd_set_error(SD_ERR_INVALID_ARG, "mask row %d attends to no slot", t);
            }
        }
    }
    *new_len = len;
    return SD_OK;
}

/* The effective mask (T, n_attn): the caller's, or causal by stored position over live slots.
 * With a sliding window W only slots whose position lies in (pos[t] - W, pos[t]] stay visible,
 * whatever built the mask (prefill, decode, a verify chain or tree): the cache keeps every slot
 * and the window is a mask. slot_pos (n_attn) is scratch. Changes no state. */
static sd_status build_mask(uint8_t *mask, const sd_kv_cache *kv, const sd_batch *b,
                            const int32_t *pos, int old_len, int n_attn, int window,
                            int32_t *slot_pos) {
    const int T = b->n_tokens;
    if (b->mask != NULL) {
        memcpy(mask, b->mask, (size_t)T * (size_t)n_attn);
    } else {
        for (int t = 0; t < T; t++) {
            uint8_t *row = mask + (size_t)t * (size_t)n_attn;
            for (int s = 0; s < n_attn; s++) {
                row[s] = s < old_len && kv->pos[s] <= pos[t];
            }
            /* slots written by this batch (they may lie past old_len or overwrite earlier ones) */
            for (int u = 0; u < T; u++) {
                int32_t s = b->slots != NULL ? b->slots[u] : old_len + u;
                row[s] = pos[u] <= pos[t];
            }
        }
    }
    if (window <= 0) {
        return SD_OK;
    }
    memcpy(slot_pos, kv->pos, (size_t)n_attn * sizeof(int32_t));
    for (int u = 0; u < T; u++) {
        int32_t s = b->slots != NULL ? b->slots[u] : old_len + u;
        if (s < n_attn) {
            slot_pos[s] = pos[u];
        }
    }
    for (int t = 0; t < T; t++) {
        uint8_t *row = mask + (size_t)t * (size_t)n_attn;
        int any = 0;
        for (int s = 0; s < n_attn; s++) {
            row[s] = row[s] && (int64_t)pos[t] - slot_pos[s] < window;
            any |= row[s];
        }
        if (!any) {
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "mask row %d attends to no slot within the sliding window of %d", t,
                                window);
        }
    }
    return SD_OK;
}

#ifdef SD_WITH_CUDA
/* The forward of a CUDA model: positions, slots and the mask are prepared here as for the CPU
 * (the cache's positions stay on the host), the layers run on the device. */
static sd_status forward_cuda(sd_model *m, sd_kv_cache *kv, const sd_batch *b, float *logits,
                              const int32_t *tokens_dev, int new_len, int n_attn) {
    const int T = b->n_tokens;
    const int old_len = kv->length;
    int32_t *pos =
        calloc(1, ((size_t)T * 2 + (size_t)n_attn) * sizeof(int32_t) + (size_t)T * (size_t)n_attn);
    if (pos == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory in forward");
    }
    int32_t *slots = pos + T;
    int32_t *slot_pos = slots + T;
    uint8_t *mask = (uint8_t *)(slot_pos + n_attn);
    for (int t = 0; t < T; t++) {
        pos[t] = b->pos != NULL ? b->pos[t] : old_len + t;
        slots[t] = b->slots != NULL ? b->slots[t] : old_len + t;
    }
    sd_status st = build_mask(mask, kv, b, pos, old_len, n_attn, m->cfg.sliding_window, slot_pos);
    if (st != SD_OK) {
        free(pos);
        return st;
    }
    for (int t = 0; t < T; t++) {
        kv->pos[slots[t]] = pos[t];
    }
    kv->length = new_len;
    sd_cuda_batch cb;
    cb.n_tokens = T;
    cb.tokens = tokens_dev != NULL ? NULL : b->tokens;
    cb.tokens_dev = tokens_dev;
    cb.pos = pos;
    cb.slots = slots;
    cb.mask = mask;
    cb.n_attn = n_attn;
    cb.n_logits = b->n_logits;
    cb.n_layers = b->n_layers > 0 ? b->n_layers : m->cfg.n_layers;
    st = sd_cuda_forward(m->cuda, kv->cuda, &cb, logits);
    free(pos);
    return st;
}
#endif

sd_status sd_forward(sd_model *m, sd_kv_cache *kv, const sd_batch *b, float *logits) {
    return sd_forward_ex(m, kv, b, logits, NULL);
}

sd_status sd_forward_ex(sd_model *m, sd_kv_cache *kv, const sd_batch *b, float *logits,
                        const int32_t *tokens_dev) {
    const sd_config *c = &m->cfg;
    int new_len = 0;
    if (b == NULL || kv == NULL) {
        return sd_set_error(SD_ERR_INVALID_ARG, "sd_forward needs a batch and a cache");
    }
    int other = kv->n_layers != c->n_layers || kv->n_kv_heads != c->n_kv_heads ||
                kv->head_dim != c->head_dim || (kv->cuda != NULL) != (m->cuda != NULL);
#ifdef SD_WITH_CUDA
    other = other || (kv->cuda != NULL && sd_cuda_cache_model(kv->cuda) != m->cuda);
#endif
    if (other) {
        return sd_set_error(SD_ERR_INVALID_ARG, "the cache was made for a different model");
    }
    const int on_device = m->cuda != NULL;
    if (b->n_logits > 0 && logits == NULL && !on_device) {
        return sd_set_error(SD_ERR_INVALID_ARG, "n_logits > 0 needs a logits buffer");
    }
    if (tokens_dev != NULL && !on_device) {
        return sd_set_error(SD_ERR_INTERNAL, "device token ids given to a CPU model");
    }
    SD_TRY(validate(m, kv, b, tokens_dev != NULL, &new_len));
    const int T = b->n_tokens;
    const int n_attn = b->mask != NULL ? b->n_mask_cols : new_len;
#ifdef SD_WITH_CUDA
    if (on_device) {
        return forward_cuda(m, kv, b, logits, tokens_dev, new_len, n_attn);
    }
#endif
    SD_TRY(sd_scratch_reserve(m, T, n_attn));
    sd_scratch *s = &m->s;
    const int D = c->hidden_size, Dh = c->head_dim, H = c->n_heads, Hkv = c->n_kv_heads;
    const int KVD = Hkv * Dh, F = c->ffn_size;
    const int old_len = kv->length;

    /* positions and slots of this batch (defaults: append at the end) */
    int32_t *pos = calloc((size_t)T * 2 + (size_t)n_attn, sizeof(int32_t));
    if (pos == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory in forward");
    }
    int32_t *slots = pos + T;
    for (int t = 0; t < T; t++) {
        pos[t] = b->pos != NULL ? b->pos[t] : old_len + t;
        slots[t] = b->slots != NULL ? b->slots[t] : old_len + t;
    }
    const sd_status mst =
        build_mask(s->mask, kv, b, pos, old_len, n_attn, c->sliding_window, slots + T);
    if (mst != SD_OK) {
        free(pos);
        return mst;
    }
    for (int t = 0; t < T; t++) {
        kv->pos[slots[t]] = pos[t];
    }
    kv->length = new_len;

    /* RoPE angles per token, in double so that large positions keep their precision */
    for (int t = 0; t < T; t++) {
        float *cs = s->rope_cs + (size_t)t * (size_t)Dh;
        for (int i = 0; i < Dh / 2; i++) {
            double a = (double)pos[t] * m->rope_freq[i];
            cs[2 * i] = (float)cos(a);
            cs[2 * i + 1] = (float)sin(a);
        }
    }

    /* embeddings */
    const sd_type_traits *et = sd_type_get(m->w.tok_embd.type);
    for (int t = 0; t < T; t++) {
        et->to_float(s->x + (size_t)t * (size_t)D,
                     (const unsigned char *)m->w.tok_embd.data +
                         (size_t)b->tokens[t] * m->w.tok_embd.row_bytes,
                     D);
    }

    const int n_layers = b->n_layers > 0 ? b->n_layers : c->n_layers;
    for (int l = 0; l < n_layers; l++) {
        const sd_layer *L = &m->w.layers[l];
        const void *kc = sd_kv_at(kv, kv->k, sd_kv_row(kv, l, 0, 0));
        const void *vc = sd_kv_at(kv, kv->v, sd_kv_row(kv, l, 0, 0));

        /* attention block: x += Wo · attn(rope(Wq·n), rope(Wk·n), Wv·n), n = rmsnorm(x) */
        sd_matmul_job qkv[3] = {
            {s->q, s->xb, &L->wq, L->bq, 0},
            {s->k, s->xb, &L->wk, L->bk, 0},
            {s->v, s->xb, &L->wv, L->bv, 0},
        };
        const int q_qkv = sd_matmul_wants_q8(qkv, 3); /* normalized and quantized at once */
        sd_rmsnorm_rows(m->pool, s->xb, s->x, L->attn_norm, T, D, c->rms_eps, q_qkv ? s->xq : NULL);
        sd_matmul(m->pool, T, qkv, 3, s->xq, q_qkv);
        if (L->q_norm != NULL) { /* qwen3: RMSNorm over each head's Dh before RoPE */
            sd_rmsnorm(s->q, s->q, L->q_norm, T * H, Dh, c->rms_eps);
            sd_rmsnorm(s->k, s->k, L->k_norm, T * Hkv, Dh, c->rms_eps);
        }
        sd_rope(s->q, s->rope_cs, T, H, Dh, c->rope_neox);
        sd_rope(s->k, s->rope_cs, T, Hkv, Dh, c->rope_neox);
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < Hkv; h++) {
                const size_t src = (size_t)t * (size_t)KVD + (size_t)h * (size_t)Dh;
                const size_t dst = sd_kv_row(kv, l, h, slots[t]);
                sd_key_put(sd_kv_at(kv, kv->k, sd_kv_row(kv, l, h, 0)), kv->f16, slots[t], Dh,
                           s->k + src);
                if (kv->f16) {
                    sd_f32_to_f16_row((uint16_t *)kv->v + dst, s->v + src, Dh);
                } else {
                    memcpy((float *)kv->v + dst, s->v + src, (size_t)Dh * sizeof(float));
                }
            }
        }
        sd_attention(m->pool, s->xb, s->q, kc, vc, kv->f16, sd_kv_row(kv, 0, 1, 0), s->mask, T,
                     n_attn, H, Hkv, Dh, s->scores);
        sd_matmul_job o = {s->x, s->xb, &L->wo, NULL, 1};
        sd_matmul(m->pool, T, &o, 1, s->xq, 0);

        /* MLP block: x += Wdown · (silu(Wgate·n) * (Wup·n)), n = rmsnorm(x) */
        sd_matmul_job gu[2] = {
            {s->hb, s->xb, &L->w_gate, NULL, 0},
            {s->hb2, s->xb, &L->w_up, NULL, 0},
        };
        const int q_gu = sd_matmul_wants_q8(gu, 2);
        sd_rmsnorm_rows(m->pool, s->xb, s->x, L->ffn_norm, T, D, c->rms_eps, q_gu ? s->xq : NULL);
        sd_matmul(m->pool, T, gu, 2, s->xq, q_gu);
        sd_matmul_job down = {s->x, s->hb, &L->w_down, NULL, 1};
        const int q_down = sd_matmul_wants_q8(&down, 1);
        sd_swiglu_rows(m->pool, s->hb, s->hb, s->hb2, T, F, q_down ? s->xq : NULL);
        sd_matmul(m->pool, T, &down, 1, s->xq, q_down);
    }

    if (b->n_logits > 0) {
        const int first = T - b->n_logits;
        sd_rmsnorm(s->xb, s->x + (size_t)first * (size_t)D, m->w.out_norm, b->n_logits, D,
                   c->rms_eps);
        sd_matmul_job out = {logits, s->xb, &m->w.output, NULL, 0};
        sd_matmul(m->pool, b->n_logits, &out, 1, s->xq, 0);
    }
    free(pos);
    return SD_OK;
}
