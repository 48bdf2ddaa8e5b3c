/* forward.c — one forward pass of a llama/qwen2/qwen3/gemma2/gemma3 decoder over a batch of T
 * tokens at given positions, writing K/V into given cache slots and attending through an explicit
 * mask, so one call serves prefill, single-token decode and the scoring of a whole draft tree. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/forward.h"
#include "model/model.h"
#include "cpu/ops_cpu.h"
#include "cpu/quant.h"
#include "util/status.h"
#ifdef SD_WITH_CUDA
#include "../cuda/sd_cuda.h"
#endif

sd_status sd_check_token(const sd_model *m, int32_t tok, int index) {
    if (tok < 0 || tok >= m->cfg.vocab_size) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "token id %d at index %d is out of range [0, %d) (vocab size)", tok,
                            index, m->cfg.vocab_size);
    }
    return SD_OK;
}

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
    const int run = b->n_layers > 0 ? b->n_layers : c->n_layers;
    if (b->n_aux < 0 || b->n_aux > SD_MAX_AUX_LAYERS || (b->n_aux > 0 && b->aux == NULL) ||
        (b->n_aux > 0 && b->aux_layers == NULL)) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "n_aux %d is out of range [0, %d] (or its arrays are missing)",
                            b->n_aux, SD_MAX_AUX_LAYERS);
    }
    for (int i = 0; i < b->n_aux; i++) {
        if (b->aux_layers[i] < 0 || b->aux_layers[i] > run) {
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "aux layer %d is out of range [0, %d] (the layers this forward "
                                "runs; %d: the output of the last)",
                                b->aux_layers[i], run, run);
        }
    }
    if ((b->embd != NULL) != (c->head != 0)) {
        return sd_set_error(SD_ERR_INVALID_ARG, c->head ? "a drafter head's forward needs its "
                                                          "input rows (embd)"
                                                        : "input rows (embd) are for drafter "
                                                          "heads only");
    }
    int len = kv->length;
    for (int t = 0; t < T; t++) {
        SD_TRY(sd_check_token(m, dev_tokens ? 0 : b->tokens[t], t));
        int32_t p = b->pos != NULL ? b->pos[t] : kv->length + t;
        if (p < 0 || p >= c->context_length) {
            char note[160];
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "position %d at index %d is beyond the context length %d "
                                "(positions must be in [0, %d))%s",
                                p, t, c->context_length, c->context_length,
                                sd_config_context_note(c, note, sizeof(note)));
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

/* The effective mask (T, n_attn): the caller's, or causal by stored position over live slots. */
static void build_mask(uint8_t *mask, const sd_kv_cache *kv, const sd_batch *b, const int32_t *pos,
                       int old_len, int n_attn) {
    const int T = b->n_tokens;
    if (b->mask != NULL) {
        memcpy(mask, b->mask, (size_t)T * (size_t)n_attn);
        return;
    }
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

/* A sliding window W on top of a mask: only slots whose position lies in (pos[t] - W, pos[t]]
 * stay visible, whatever built the mask (prefill, decode, a verify chain or tree): the cache
 * keeps every slot and the window is a mask. slot_pos (n_attn) is scratch. Changes no state. */
static sd_status window_mask(uint8_t *mask, const sd_kv_cache *kv, const sd_batch *b,
                             const int32_t *pos, int old_len, int n_attn, int window,
                             int32_t *slot_pos) {
    const int T = b->n_tokens;
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

/* cs (T, Dh): cos/sin of pos[t] * freq[i] for the R/2 frequencies of R rotary dimensions, in
 * double so large positions keep their precision, each times af (LongRoPE's or YaRN's attention
 * factor, 1 elsewhere: then exactly cos and sin). */
static void rope_angles(float *cs, const int32_t *pos, int T, int Dh, int R, float af,
                        const double *freq) {
    for (int t = 0; t < T; t++) {
        float *r = cs + (size_t)t * (size_t)Dh;
        for (int i = 0; i < R / 2; i++) {
            double a = (double)pos[t] * freq[i];
            r[2 * i] = (float)cos(a) * af;
            r[2 * i + 1] = (float)sin(a) * af;
        }
    }
}

/* x (T, D) += rmsnorm(y) * w: a block's output through its post-norm (Gemma's sandwich). */
static void add_post_normed(float *x, float *y, const float *w, int T, int D, float eps) {
    sd_rmsnorm(y, y, w, T, D, eps);
    for (size_t i = 0; i < (size_t)T * (size_t)D; i++) {
        x[i] += y[i];
    }
}

/* x (T, D) += r * y: a block's output scaled before the residual add (granite). */
static void add_scaled(float *x, const float *y, float r, int T, int D) {
    for (size_t i = 0; i < (size_t)T * (size_t)D; i++) {
        x[i] += r * y[i];
    }
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
    build_mask(mask, kv, b, pos, old_len, n_attn);
    sd_status st = SD_OK; /* a CUDA model has no local layers: one mask serves every layer */
    if (m->cfg.sliding_window > 0) {
        st = window_mask(mask, kv, b, pos, old_len, n_attn, m->cfg.sliding_window, slot_pos);
    }
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
    cb.hidden = b->hidden;
    cb.aux_layers = b->aux_layers;
    cb.n_aux = b->n_aux;
    cb.aux = b->aux;
    cb.embd = b->embd;
    st = sd_cuda_forward(m->cuda, kv->cuda, &cb, logits);
    free(pos);
    return st;
}
#endif

sd_status sd_forward(sd_model *m, sd_kv_cache *kv, const sd_batch *b, float *logits) {
    return sd_forward_ex(m, kv, b, logits, NULL);
}

/* The cache fits the model (its shapes, its backend). */
static sd_status check_cache(const sd_model *m, const sd_kv_cache *kv) {
    const sd_config *c = &m->cfg;
    int other = kv->n_layers != c->n_layers || kv->n_kv_heads != c->n_kv_heads ||
                kv->head_dim != c->head_dim || (kv->cuda != NULL) != (m->cuda != NULL);
#ifdef SD_WITH_CUDA
    other = other || (kv->cuda != NULL && sd_cuda_cache_model(kv->cuda) != m->cuda);
#endif
    return other ? sd_set_error(SD_ERR_INVALID_ARG, "the cache was made for a different model")
                 : SD_OK;
}

/* One request's part of a combined CPU forward: where its rows, positions and mask lie in the
 * shared buffers. */
typedef struct {
    int t0;         /* its first row of the combined batch */
    int n_attn;     /* its mask's columns */
    int new_len;    /* its cache's length after the forward */
    size_t mask_at; /* where its mask rows begin in the scratch masks */
} segment;

/* Each request's residual stream entering layer l (x: the combined batch's (T, D)), into its
 * aux rows when it asked for that layer. */
static void capture_aux(const sd_fwd *jobs, int n, const segment *sg, int l, const float *x,
                        int D) {
    for (int j = 0; j < n; j++) {
        const sd_batch *b = &jobs[j].b;
        for (int i = 0; i < b->n_aux; i++) {
            if (b->aux_layers[i] == l) {
                memcpy(b->aux + (size_t)i * (size_t)b->n_tokens * (size_t)D,
                       x + (size_t)sg[j].t0 * (size_t)D,
                       (size_t)b->n_tokens * (size_t)D * sizeof(float));
            }
        }
    }
}

/* rows (T, D) = the embeddings of tokens[0 .. T) (Gemma's scaled by sqrt(D) by the caller). */
static void embed_rows(const sd_model *m, float *rows, const int32_t *tokens, int T) {
    const sd_type_traits *et = sd_type_get(m->w.tok_embd.type);
    const size_t D = (size_t)m->cfg.hidden_size;
    for (int t = 0; t < T; t++) {
        et->to_float(rows + (size_t)t * D,
                     (const unsigned char *)m->w.tok_embd.data +
                         (size_t)tokens[t] * m->w.tok_embd.row_bytes,
                     (int64_t)D);
    }
}

/* 1 + the first of the T rows of x (T, D) whose sum of squares is not finite, or 0: a row
 * holding a NaN or an infinity, or values so large that the final RMS norm's sum overflows and
 * the norm gives zeros (finite logits that mean nothing as well). A NaN or an overflow upstream
 * reaches every later row through the attention, so the rows that get logits are the ones to
 * check, before their norm. */
static int first_nonfinite_row(const float *x, int T, int D) {
    for (int t = 0; t < T; t++) {
        const float *r = x + (size_t)t * (size_t)D;
        float ss = 0.0f;
        for (int i = 0; i < D; i++) {
            ss += r[i] * r[i];
        }
        if (!(ss <= FLT_MAX)) { /* true for a NaN and for +inf */
            return t + 1;
        }
    }
    return 0;
}

/* out (T, D) = the final norm of x, or x itself for a head without one (EAGLE-1/2). */
static void final_norm(const sd_model *m, float *out, const float *x, int T) {
    const int D = m->cfg.hidden_size;
    if (m->w.out_norm != NULL) {
        sd_rmsnorm(out, x, m->w.out_norm, T, D, m->cfg.rms_eps);
    } else if (T > 0) {
        memcpy(out, x, (size_t)T * (size_t)D * sizeof(float));
    }
}

/* A drafter head's attention input in s->xb from its rows s->x: EAGLE-1/2's layer has no input
 * norm (xb = x, (T, D)); EAGLE-3's reads (T, 2D) rows cat(rmsnorm(embedding of the row's token)
 * * input_layernorm, rmsnorm(x) * hidden_norm), and with norm_before_residual the residual
 * becomes the normed x as well. Row by row, so a row's bits do not depend on its batch. */
static void head_input(sd_model *m, const sd_fwd *jobs, int n, const segment *sg,
                       const sd_layer *L) {
    sd_scratch *s = &m->s;
    const int D = m->cfg.hidden_size;
    const float eps = m->cfg.rms_eps;
    for (int j = 0; j < n; j++) {
        const int Tj = jobs[j].b.n_tokens, t0 = sg[j].t0;
        if (L->hidden_norm == NULL) {
            memcpy(s->xb + (size_t)t0 * (size_t)D, s->x + (size_t)t0 * (size_t)D,
                   (size_t)Tj * (size_t)D * sizeof(float));
            continue;
        }
        embed_rows(m, s->xo + (size_t)t0 * (size_t)D, jobs[j].b.tokens, Tj);
        sd_head_input_rows(s->xb + (size_t)t0 * 2 * (size_t)D, s->xo + (size_t)t0 * (size_t)D,
                           s->x + (size_t)t0 * (size_t)D, L->attn_norm, L->hidden_norm, Tj, D, eps,
                           m->cfg.head_norm_residual);
    }
}

/* The forward of a CPU model over the requests' batches at once: every matrix multiplies the
 * rows of all of them (the weights are read once), and each request's tokens attend to their own
 * cache through their own mask. A row's arithmetic does not depend on the others (the kernels
 * are batch-invariant), so each request gets the bits of its own forward. */
static sd_status forward_cpu(sd_model *m, sd_fwd *jobs, int n, segment *sg, int T,
                             int max_attn) {
    const sd_config *c = &m->cfg;
    SD_TRY(sd_scratch_reserve(m, T, max_attn));
    sd_scratch *s = &m->s;
    const int D = c->hidden_size, Dh = c->head_dim, H = c->n_heads, Hkv = c->n_kv_heads;
    const int KVD = Hkv * Dh, F = c->ffn_size;

    /* positions and slots of every batch (defaults: append at the end of its cache) */
    int32_t *pos = calloc((size_t)T * 2 + (size_t)max_attn, sizeof(int32_t));
    if (pos == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory in forward");
    }
    int32_t *slots = pos + T;
    /* every layer's mask (Mistral: all windowed), or the global and the local ones (Gemma 3) */
    sd_status mst = SD_OK;
    for (int j = 0; j < n && mst == SD_OK; j++) {
        const sd_kv_cache *kv = jobs[j].kv;
        const sd_batch *b = &jobs[j].b;
        int32_t *jp = pos + sg[j].t0, *js = slots + sg[j].t0;
        for (int t = 0; t < b->n_tokens; t++) {
            jp[t] = b->pos != NULL ? b->pos[t] : kv->length + t;
            js[t] = b->slots != NULL ? b->slots[t] : kv->length + t;
        }
        uint8_t *mk = s->mask + sg[j].mask_at;
        build_mask(mk, kv, b, jp, kv->length, sg[j].n_attn);
        if (c->sliding_window > 0) {
            uint8_t *wm = c->swa_pattern > 0 ? s->mask_local + sg[j].mask_at : mk;
            if (wm != mk) {
                memcpy(wm, mk, (size_t)b->n_tokens * (size_t)sg[j].n_attn);
            }
            mst =
                window_mask(wm, kv, b, jp, kv->length, sg[j].n_attn, c->sliding_window, slots + T);
        }
    }
    if (mst != SD_OK) {
        free(pos);
        return mst;
    }
    for (int j = 0; j < n; j++) { /* all checked: the caches take the batches */
        sd_kv_cache *kv = jobs[j].kv;
        for (int t = sg[j].t0; t < sg[j].t0 + jobs[j].b.n_tokens; t++) {
            kv->pos[slots[t]] = pos[t];
        }
        kv->length = sg[j].new_len;
    }

    const int R = sd_config_rope_dim(c);
    const float af = c->rope_attn_factor > 0.0f ? c->rope_attn_factor : 1.0f;
    rope_angles(s->rope_cs, pos, T, Dh, R, af, m->rope_freq);
    if (m->rope_freq_local != NULL) {
        rope_angles(s->rope_cs_local, pos, T, Dh, R, af, m->rope_freq_local);
    }
    const int gemma = sd_config_is_gemma(c);
    /* sd_attention scales q.k by 1/sqrt(Dh): another scale goes into q */
    const float q_scale = c->attn_scale > 0.0f ? c->attn_scale * sqrtf((float)Dh) : 1.0f;

    /* embeddings (a head's input rows: given) */
    for (int j = 0; j < n; j++) {
        if (jobs[j].b.embd != NULL) {
            memcpy(s->x + (size_t)sg[j].t0 * (size_t)D, jobs[j].b.embd,
                   (size_t)jobs[j].b.n_tokens * (size_t)D * sizeof(float));
        } else {
            embed_rows(m, s->x + (size_t)sg[j].t0 * (size_t)D, jobs[j].b.tokens,
                       jobs[j].b.n_tokens);
        }
    }
    if (gemma || c->embed_scale > 0.0f) { /* Gemma: by sqrt(D); Granite: its multiplier */
        const float e = gemma ? (float)sqrt((double)D) : c->embed_scale;
        for (size_t i = 0; i < (size_t)T * (size_t)D; i++) {
            s->x[i] *= e;
        }
    }
    /* a block's output apart from x: gemma's (post-normed) and granite's (scaled) */
    const int apart = gemma || c->residual_scale > 0.0f;

    const int n_layers = jobs[0].b.n_layers > 0 ? jobs[0].b.n_layers : c->n_layers;
    for (int l = 0; l < n_layers; l++) {
        const sd_layer *L = &m->w.layers[l];
        const int local = c->swa_pattern > 0 && sd_config_layer_slides(c, l);
        capture_aux(jobs, n, sg, l, s->x, D);
        const float *cs = local ? s->rope_cs_local : s->rope_cs;

        /* attention block: x += Wo · attn(rope(Wq·n), rope(Wk·n), Wv·n), n = rmsnorm(x) */
        sd_matmul_job qkv[3] = {
            {s->q, s->xb, &L->wq, L->bq, 0},
            {s->k, s->xb, &L->wk, L->bk, 0},
            {s->v, s->xb, &L->wv, L->bv, 0},
        };
        const int q_qkv = sd_matmul_wants_q8(qkv, 3); /* normalized and quantized at once */
        if (c->head) { /* a drafter head's input: no norm (EAGLE), or two (EAGLE-3) */
            head_input(m, jobs, n, sg, L);
            sd_matmul(m->pool, T, qkv, 3, s->xq, 0);
        } else {
            sd_rmsnorm_rows(m->pool, s->xb, s->x, L->attn_norm, T, D, c->rms_eps,
                            q_qkv ? s->xq : NULL);
            sd_matmul(m->pool, T, qkv, 3, s->xq, q_qkv);
        }
        if (L->q_norm != NULL) { /* qwen3, gemma3: RMSNorm over each head's Dh before RoPE */
            sd_rmsnorm(s->q, s->q, L->q_norm, T * H, Dh, c->rms_eps);
            sd_rmsnorm(s->k, s->k, L->k_norm, T * Hkv, Dh, c->rms_eps);
        }
        if (c->no_rope_interval == 0 || (l + 1) % c->no_rope_interval != 0) { /* SmolLM3's NoPE */
            sd_rope_part(s->q, cs, T, H, Dh, R, c->rope_neox);
            sd_rope_part(s->k, cs, T, Hkv, Dh, R, c->rope_neox);
        }
        for (size_t i = 0; q_scale != 1.0f && i < (size_t)T * (size_t)H * (size_t)Dh; i++) {
            s->q[i] *= q_scale;
        }
        for (int j = 0; j < n; j++) { /* each request: its keys and values, its attention */
            sd_kv_cache *kv = jobs[j].kv;
            const int Tj = jobs[j].b.n_tokens, t0 = sg[j].t0;
            for (int t = t0; t < t0 + Tj; t++) {
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
            const void *kc = sd_kv_at(kv, kv->k, sd_kv_row(kv, l, 0, 0));
            const void *vc = sd_kv_at(kv, kv->v, sd_kv_row(kv, l, 0, 0));
            const size_t qa = (size_t)t0 * (size_t)H * (size_t)Dh;
            /* gemma2: scores = cap * tanh(scores / cap) before the mask and softmax */
            sd_attention_capped(m->pool, s->xb + qa, s->q + qa, kc, vc, kv->f16,
                                sd_kv_row(kv, 0, 1, 0),
                                (local ? s->mask_local : s->mask) + sg[j].mask_at, Tj, sg[j].n_attn,
                                H, Hkv, Dh, c->attn_softcap, s->scores);
        }
        /* gemma: x += rmsnorm(Wo · attn) * post-norm; granite: x += r (Wo · attn) */
        sd_matmul_job o = {apart ? s->xo : s->x, s->xb, &L->wo, NULL, !apart};
        sd_matmul(m->pool, T, &o, 1, s->xq, 0);
        if (gemma) {
            add_post_normed(s->x, s->xo, L->attn_post_norm, T, D, c->rms_eps);
        } else if (apart) {
            add_scaled(s->x, s->xo, c->residual_scale, T, D);
        }

        /* MLP block: x += Wdown · (silu(Wgate·n) * (Wup·n)), n = rmsnorm(x); gemma: gelu for
         * silu, and the output through its post-norm */
        sd_matmul_job gu[2] = {
            {s->hb, s->xb, &L->w_gate, NULL, 0},
            {s->hb2, s->xb, &L->w_up, NULL, 0},
        };
        const int q_gu = sd_matmul_wants_q8(gu, 2);
        sd_rmsnorm_rows(m->pool, s->xb, s->x, L->ffn_norm, T, D, c->rms_eps, q_gu ? s->xq : NULL);
        sd_matmul(m->pool, T, gu, 2, s->xq, q_gu);
        sd_matmul_job down = {apart ? s->xo : s->x, s->hb, &L->w_down, NULL, !apart};
        const int q_down = sd_matmul_wants_q8(&down, 1);
        (gemma ? sd_geglu_rows : sd_swiglu_rows)(m->pool, s->hb, s->hb, s->hb2, T, F,
                                                 q_down ? s->xq : NULL);
        sd_matmul(m->pool, T, &down, 1, s->xq, q_down);
        if (gemma) {
            add_post_normed(s->x, s->xo, L->ffn_post_norm, T, D, c->rms_eps);
        } else if (apart) {
            add_scaled(s->x, s->xo, c->residual_scale, T, D);
        }
    }
    capture_aux(jobs, n, sg, n_layers, s->x, D);
    free(pos);

    /* the head over every request's last n_logits rows at once: into the caller's buffer when
     * there is one request, else through one buffer handed out by rows */
    int n_rows = 0;
    for (int j = 0; j < n; j++) {
        const int nl = jobs[j].b.n_logits, first = sg[j].t0 + jobs[j].b.n_tokens - nl;
        float *normed = s->xb + (size_t)n_rows * (size_t)D;
        jobs[j].nonfinite = first_nonfinite_row(s->x + (size_t)first * (size_t)D, nl, D);
        final_norm(m, normed, s->x + (size_t)first * (size_t)D, nl);
        if (jobs[j].b.hidden != NULL) { /* every row's, the same norm row by row */
            const int T0 = jobs[j].b.n_tokens - nl;
            final_norm(m, jobs[j].b.hidden, s->x + (size_t)sg[j].t0 * (size_t)D, T0);
            memcpy(jobs[j].b.hidden + (size_t)T0 * (size_t)D, normed,
                   (size_t)nl * (size_t)D * sizeof(float));
        }
        n_rows += nl;
    }
    if (n_rows == 0) {
        return SD_OK;
    }
    const size_t V = (size_t)m->w.output.rows; /* a head's draft vocabulary may be smaller */
    float *rows = n == 1 ? jobs[0].logits : malloc((size_t)n_rows * V * sizeof(float));
    if (rows == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory for %d rows of logits", n_rows);
    }
    sd_matmul_job out = {rows, s->xb, &m->w.output, NULL, 0};
    sd_matmul(m->pool, n_rows, &out, 1, s->xq, 0);
    const float cap = c->final_softcap;
    for (size_t i = 0; cap > 0.0f && i < (size_t)n_rows * V; i++) {
        rows[i] = cap * tanhf(rows[i] / cap);
    }
    const float unscale = c->logit_scale > 0.0f ? 1.0f / c->logit_scale : 1.0f; /* granite */
    for (size_t i = 0; unscale != 1.0f && i < (size_t)n_rows * V; i++) {
        rows[i] *= unscale;
    }
    if (n > 1) {
        for (int j = 0, at = 0; j < n; at += jobs[j].b.n_logits, j++) {
            if (jobs[j].b.n_logits > 0) {
                memcpy(jobs[j].logits, rows + (size_t)at * V,
                       (size_t)jobs[j].b.n_logits * V * sizeof(float));
            }
        }
        free(rows);
    }
    return SD_OK;
}

/* Everything about batch j of a combined forward, before any state changes; *new_len: its
 * cache's length after it. */
static sd_status check_job(const sd_model *m, const sd_fwd *jobs, int j, int *new_len) {
    const sd_fwd *f = &jobs[j];
    if (f->kv == NULL) {
        return sd_set_error(SD_ERR_INVALID_ARG, "sd_forward needs a batch and a cache");
    }
    SD_TRY(check_cache(m, f->kv));
    if (f->b.n_logits > 0 && f->logits == NULL && m->cuda == NULL) {
        return sd_set_error(SD_ERR_INVALID_ARG, "n_logits > 0 needs a logits buffer");
    }
    if (f->b.n_layers != jobs[0].b.n_layers) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "the batches of a combined forward run different layer counts");
    }
    for (int i = 0; i < j; i++) {
        if (jobs[i].kv == f->kv) {
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "batches %d and %d of a combined forward write one cache", i, j);
        }
    }
    return validate(m, f->kv, &f->b, 0, new_len);
}

sd_status sd_forward_multi(sd_model *m, sd_fwd *jobs, int n) {
    if (n < 1 || jobs == NULL) {
        return sd_set_error(SD_ERR_INVALID_ARG, "a combined forward needs at least one batch");
    }
    segment one, *sg = n == 1 ? &one : calloc((size_t)n, sizeof(segment));
    if (sg == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory in forward");
    }
    for (int j = 0; j < n; j++) {
        jobs[j].nonfinite = 0; /* the CPU forward checks its rows; a CUDA model's are not */
    }
    sd_status st = SD_OK;
    int T = 0, max_attn = 0;
    size_t mask_at = 0;
    for (int j = 0; j < n && st == SD_OK; j++) {
        st = check_job(m, jobs, j, &sg[j].new_len);
        if (st == SD_OK) {
            const sd_batch *b = &jobs[j].b;
            sg[j].t0 = T;
            sg[j].n_attn = b->mask != NULL ? b->n_mask_cols : sg[j].new_len;
            sg[j].mask_at = mask_at;
            T += b->n_tokens;
            mask_at += (size_t)b->n_tokens * (size_t)sg[j].n_attn;
            max_attn = sg[j].n_attn > max_attn ? sg[j].n_attn : max_attn;
        }
    }
#ifdef SD_WITH_CUDA
    if (st == SD_OK && m->cuda != NULL) { /* one batch after the other on the device */
        for (int j = 0; j < n && st == SD_OK; j++) {
            st = sd_forward_ex(m, jobs[j].kv, &jobs[j].b, jobs[j].logits, NULL);
        }
        if (sg != &one) {
            free(sg);
        }
        return st;
    }
#endif
    if (st == SD_OK) {
        st = forward_cpu(m, jobs, n, sg, T, max_attn);
    }
    if (sg != &one) {
        free(sg);
    }
    return st;
}

sd_status sd_forward_ex(sd_model *m, sd_kv_cache *kv, const sd_batch *b, float *logits,
                        const int32_t *tokens_dev) {
    if (b == NULL || kv == NULL) {
        return sd_set_error(SD_ERR_INVALID_ARG, "sd_forward needs a batch and a cache");
    }
    if (m->cuda == NULL) {
        if (tokens_dev != NULL) {
            return sd_set_error(SD_ERR_INTERNAL, "device token ids given to a CPU model");
        }
        sd_fwd job = {kv, *b, logits, 0.0, 0, 0};
        SD_TRY(sd_forward_multi(m, &job, 1)); /* which checks the rest */
        return sd_fwd_finite(&job);
    }
#ifdef SD_WITH_CUDA
    int new_len = 0;
    SD_TRY(check_cache(m, kv));
    SD_TRY(validate(m, kv, b, tokens_dev != NULL, &new_len));
    const int n_attn = b->mask != NULL ? b->n_mask_cols : new_len;
    return forward_cuda(m, kv, b, logits, tokens_dev, new_len, n_attn);
#else
    return sd_set_error(SD_ERR_INTERNAL, "a CUDA model in a build without CUDA");
#endif
}
