/* llamacpp_order.c — the forward pass in llama.cpp's float order (see llamacpp_order.h for
 * what is reproduced and why). Portable C: every fused multiply-add is an explicit fmaf(), and
 * the file is built as ISO C, so the compiler contracts nothing else. */
#include "check/llamacpp_order.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format/blocks.h"
#include "model/model.h"
#include "cpu/quant.h"
#include "cpu/x86/simd.h"
#include "util/status.h"
#include "util/threadpool.h"

#define LC_ROWS_PER_TASK 16

/* ---- scalar pieces of ggml's arithmetic ---------------------------------------------------- */

static float lc_half(float x) {
    return sd_f16_to_f32(sd_f32_to_f16(x));
}

/* ggml's vector exp (ggml_v_expf, the AVX-512 variant), one lane: a rounding trick gives
 * n = round(x / ln 2), a two-step reduction b = x - n ln 2, a degree-5 polynomial, then j * 2^n;
 * |n| > 192 saturates to 0 or infinity. */
static float lc_exp(float x) {
    const float r = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, r);
    const float n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const float u = b * b;
    const float j = fmaf(
        fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
        u, fmaf(0x1.ffffecp-1f, b, 1.0f));
    if (n != n) {
        return n;
    }
    if (fabsf(n) > 192.0f) {
        return n <= 0.0f ? 0.0f : INFINITY;
    }
    return scalbnf(j, (int)n);
}

/* Eight lanes added as AVX's horizontal sum: halves, then pairs (0+2) and (1+3). */
static float lc_hsum8(const float *a) {
    const float r0 = a[0] + a[4], r1 = a[1] + a[5], r2 = a[2] + a[6], r3 = a[3] + a[7];
    return (r0 + r2) + (r1 + r3);
}

/* Sixteen lanes added as GCC's _mm512_reduce_add_ps: i + (i+8), then i + (i+4), then lc_hsum8's
 * last two steps. */
static float lc_reduce16(const float *a) {
    float t[8];
    for (int i = 0; i < 8; i++) {
        t[i] = a[i + 8] + a[i];
    }
    const float u0 = t[4] + t[0], u1 = t[5] + t[1], u2 = t[6] + t[2], u3 = t[7] + t[3];
    return (u0 + u2) + (u1 + u3);
}

/* A batch's f16 product (tinyBLAS): one accumulator of 16 lanes, n % 16 == 0. Elements at
 * stride `sx` in x, contiguous in y. */
static float lc_dot16(const float *x, size_t sx, const float *y, int n) {
    float acc[16] = {0};
    for (int i = 0; i < n; i += 16) {
        for (int l = 0; l < 16; l++) {
            acc[l] = fmaf(x[(size_t)(i + l) * sx], y[i + l], acc[l]);
        }
    }
    return lc_reduce16(acc);
}

/* One token's f16 product (ggml_vec_dot_f16): four 16-lane accumulators taking 64 elements a
 * step, n % 64 == 0; the sum passes through double on its way out, as ggml's does. */
static float lc_dot64(const float *x, size_t sx, const float *y, int n) {
    float acc[4][16] = {{0}};
    for (int i = 0; i < n; i += 64) {
        for (int j = 0; j < 4; j++) {
            for (int l = 0; l < 16; l++) {
                const int e = i + 16 * j + l;
                acc[j][l] = fmaf(x[(size_t)e * sx], y[e], acc[j][l]);
            }
        }
    }
    for (int l = 0; l < 16; l++) {
        acc[0][l] += acc[2][l];
        acc[1][l] += acc[3][l];
    }
    for (int l = 0; l < 16; l++) {
        acc[0][l] += acc[1][l];
    }
    return (float)(double)lc_reduce16(acc[0]);
}

/* RMSNorm then the weight, one row. */
static void lc_rmsnorm(float *y, const float *x, const float *w, int D, float eps) {
    double sum = 0.0;
    for (int i = 0; i < D; i++) {
        sum += (double)(x[i] * x[i]);
    }
    const float mean = (float)(sum / D);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < D; i++) {
        y[i] = x[i] * scale * w[i];
    }
}

/* ---- activations in 8 bits ----------------------------------------------------------------- */

typedef struct {
    int8_t *q; /* (T, K) quants */
    float *d;  /* (T, K/32) block scales, as halves */
    float *s;  /* (T, K/32) half(d * sum of quants): the Q4_1 offset term's factor */
    int K;
} lc_act;

/* Rows of x (T, K) to 8-bit blocks of 32, as ggml's quantize_row_q8_1 (q8_0: the same without s).
 */
static void lc_quantize(lc_act *a, const float *x, int T, int K) {
    const int nb = K / 32;
    a->K = K;
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)t * K + 32 * b;
            int8_t *q = a->q + (size_t)t * K + 32 * b;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) {
                const float v = fabsf(xb[i]);
                amax = v > amax ? v : amax;
            }
            const float d = amax / 127.0f;
            const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            int sum = 0;
            for (int i = 0; i < 32; i++) {
                const int v = (int)rintf(xb[i] * id);
                q[i] = (int8_t)v;
                sum += v;
            }
            a->d[(size_t)t * nb + b] = lc_half(d);
            a->s[(size_t)t * nb + b] = lc_half(d * (float)sum);
        }
    }
}

/* ---- matrix products ----------------------------------------------------------------------- */

typedef struct {
    const sd_mat *w; /* (rows, K) of Q4_1 or Q8_0 */
    const lc_act *a; /* T rows */
    int T;
    float *out; /* (T, rows) */
    float *acc; /* (n_threads, T * 9): eight lanes and the offset sum per token */
} lc_mm;

/* The body of a task, inlined into a portable and an AVX2+FMA build of it: the same operations
 * in the same order (fmaf is exact either way, and nothing is contracted), only faster. */
static inline __attribute__((always_inline)) void lc_mm_rows(void *ctx, int task, int thread) {
    const lc_mm *c = (const lc_mm *)ctx;
    const sd_mat *w = c->w;
    const int K = c->a->K, nb = K / 32, T = c->T;
    const int q41 = w->type == SD_TYPE_Q4_1;
    const size_t blk_bytes = w->row_bytes / (size_t)nb;
    float *lanes = c->acc + (size_t)thread * T * 9;
    float *offs = lanes + (size_t)T * 8;
    const int64_t r0 = (int64_t)task * LC_ROWS_PER_TASK;
    const int64_t r1 = r0 + LC_ROWS_PER_TASK < w->rows ? r0 + LC_ROWS_PER_TASK : w->rows;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        memset(lanes, 0, (size_t)T * 9 * sizeof(float));
        for (int b = 0; b < nb; b++) {
            sd_sub32 sb; /* Q4_1: nibbles 0..15, d, m; Q8_0: int8, d, m = 0 */
            if (q41) {
                sd_blk_decode_q4_1(&sb, row + blk_bytes * (size_t)b, 0);
            } else {
                sd_blk_decode_q8_0(&sb, row + blk_bytes * (size_t)b, 0);
            }
            const int8_t *wq = sb.q;
            const float dw = sb.d_lo, mw = sb.m;
            for (int t = 0; t < T; t++) {
                const int8_t *xq = c->a->q + (size_t)t * K + 32 * b;
                const float sc = dw * c->a->d[(size_t)t * nb + b];
                float *l = lanes + 8 * (size_t)t;
                for (int j = 0; j < 8; j++) {
                    const int s = wq[4 * j] * xq[4 * j] + wq[4 * j + 1] * xq[4 * j + 1] +
                                  wq[4 * j + 2] * xq[4 * j + 2] + wq[4 * j + 3] * xq[4 * j + 3];
                    l[j] = fmaf(sc, (float)s, l[j]);
                }
                if (q41) {
                    offs[t] = fmaf(mw, c->a->s[(size_t)t * nb + b], offs[t]);
                }
            }
        }
        for (int t = 0; t < T; t++) {
            c->out[(size_t)t * w->rows + r] = lc_hsum8(lanes + 8 * (size_t)t) + offs[t];
        }
    }
}

static void lc_mm_task(void *ctx, int task, int thread) {
    lc_mm_rows(ctx, task, thread);
}

#if SD_HAVE_X86_SIMD
__attribute__((target("avx2,fma"))) static void lc_mm_task_fma(void *ctx, int task, int thread) {
    lc_mm_rows(ctx, task, thread);
}
#endif

/* ---- one call's state ---------------------------------------------------------------------- */

typedef struct {
    sd_model *m;
    int n;       /* tokens of the call */
    int nt;      /* worker threads */
    float *x;    /* (n, D) residual stream */
    float *h;    /* (n, max(D, F)) normed rows, then the SwiGLU product */
    float *q;    /* (n, H*Dh) */
    float *k;    /* (n, Hkv*Dh) */
    float *v;    /* (n, Hkv*Dh) */
    float *att;  /* (n, H*Dh) attention output */
    float *gate; /* (n, F) */
    float *up;   /* (n, F) */
    float *tmp;  /* (n, max(D, F)) matrix outputs */
    float *kc;   /* (L, Hkv, n_pad, Dh) keys as halves, zeros past n */
    float *vc;   /* (L, Hkv, n_pad, Dh) values as halves, zeros past n */
    float *rope; /* (n, Dh) cos, sin pairs */
    float *work; /* (nt, 2 * n_pad + Dh) per-thread attention rows */
    float *acc;  /* (nt, n * 9) matrix-product lanes */
    lc_act act;  /* n rows of max(D, F) */
    int n_pad;   /* n rounded up to 64: the slots the attention products run over */
    int fma;     /* the CPU runs the AVX2+FMA build of the matrix products */
} lc_state;

static void lc_matmul(lc_state *st, const sd_mat *w, const float *x, int T, float *out) {
    lc_quantize(&st->act, x, T, (int)w->cols);
    lc_mm c = {w, &st->act, T, out, st->acc};
    const int n_tasks = (int)((w->rows + LC_ROWS_PER_TASK - 1) / LC_ROWS_PER_TASK);
    sd_task_fn fn = lc_mm_task;
#if SD_HAVE_X86_SIMD
    if (st->fma) {
        fn = lc_mm_task_fma;
    }
#endif
    sd_threadpool_run(st->m->pool, fn, &c, n_tasks);
}

typedef struct {
    lc_state *st;
    int layer;
    int t0; /* first token (= slot) of the rows */
    int T;
    int one_token; /* ggml_vec_dot_f16's order instead of tinyBLAS's */
} lc_attn;

/* Head `task` of every row: scores against slots 0..t, softmax, weighted values. */
static void lc_attn_task(void *ctx, int task, int thread) {
    const lc_attn *c = (const lc_attn *)ctx;
    const lc_state *st = c->st;
    const sd_config *cfg = &st->m->cfg;
    const int Dh = cfg->head_dim, H = cfg->n_heads, Hkv = cfg->n_kv_heads;
    const int h = task, g = h / (H / Hkv);
    const float *kc = st->kc + ((size_t)c->layer * Hkv + g) * st->n_pad * Dh;
    const float *vc = st->vc + ((size_t)c->layer * Hkv + g) * st->n_pad * Dh;
    float *e = st->work + (size_t)thread * (2 * (size_t)st->n_pad + Dh);
    float *wt = e + st->n_pad;
    float *qh = wt + st->n_pad;
    const float scale = 1.0f / sqrtf((float)Dh);
    for (int r = 0; r < c->T; r++) {
        const int t = c->t0 + r; /* this row sees slots 0..t */
        const float *q = st->q + (size_t)t * H * Dh + (size_t)h * Dh;
        for (int i = 0; i < Dh; i++) {
            qh[i] = lc_half(q[i]);
        }
        /* Slots past t hold zeros in llama.cpp's cleared cache and get weight 0; they add only
         * exact zeros to the sums, so the loops stop at the first chunk boundary after t. */
        const int step = c->one_token ? 64 : 16;
        const int n_slots = (t + 1 + step - 1) / step * step;
        float mx = -INFINITY;
        for (int s = 0; s <= t; s++) {
            const float *kr = kc + (size_t)s * Dh;
            const float dot = c->one_token ? lc_dot64(kr, 1, qh, Dh) : lc_dot16(kr, 1, qh, Dh);
            e[s] = dot * scale;
            mx = e[s] > mx ? e[s] : mx;
        }
        for (int s = 0; s <= t; s++) {
            e[s] = lc_exp(e[s] - mx);
        }
        for (int s = t + 1; s < n_slots; s++) {
            e[s] = 0.0f;
        }
        double sum = 0.0;
        for (int s = 0; s < n_slots; s += 16) {
            sum += (double)lc_reduce16(e + s);
        }
        const float inv = (float)(1.0 / sum);
        for (int s = 0; s < n_slots; s++) {
            wt[s] = lc_half(e[s] * inv);
        }
        float *o = st->att + (size_t)t * H * Dh + (size_t)h * Dh;
        for (int d = 0; d < Dh; d++) {
            const float *col = vc + d; /* value column d; slots past n are zeros, weight 0 */
            o[d] = c->one_token ? lc_dot64(col, (size_t)Dh, wt, n_slots)
                                : lc_dot16(col, (size_t)Dh, wt, n_slots);
        }
    }
}

/* RoPE on adjacent pairs of each head of rows x (T, nh * Dh) at positions t0.. */
static void lc_rope(const lc_state *st, float *x, int t0, int T, int nh) {
    const int Dh = st->m->cfg.head_dim;
    for (int r = 0; r < T; r++) {
        const float *cs = st->rope + (size_t)(t0 + r) * Dh;
        for (int hh = 0; hh < nh; hh++) {
            float *p = x + ((size_t)r * nh + hh) * Dh;
            for (int i = 0; i < Dh; i += 2) {
                const float x0 = p[i], x1 = p[i + 1], cth = cs[i], sth = cs[i + 1];
                p[i] = fmaf(x0, cth, -(x1 * sth));
                p[i + 1] = fmaf(x0, sth, x1 * cth);
            }
        }
    }
}

/* Rows t0..t0+T-1 (T > 1: one batch; T == 1 with one_token: llama.cpp's one-token kernels). */
static void lc_rows(lc_state *st, int t0, int T, int one_token, float *logits) {
    const sd_model *m = st->m;
    const sd_config *cfg = &m->cfg;
    const int D = cfg->hidden_size, F = cfg->ffn_size, Dh = cfg->head_dim;
    const int H = cfg->n_heads, Hkv = cfg->n_kv_heads;
    float *x = st->x + (size_t)t0 * D;
    for (int l = 0; l < cfg->n_layers; l++) {
        const sd_layer *ly = &m->w.layers[l];
        for (int r = 0; r < T; r++) {
            lc_rmsnorm(st->h + (size_t)r * D, x + (size_t)r * D, ly->attn_norm, D, cfg->rms_eps);
        }
        float *q = st->q + (size_t)t0 * H * Dh;
        lc_matmul(st, &ly->wq, st->h, T, q);
        lc_matmul(st, &ly->wk, st->h, T, st->k);
        lc_matmul(st, &ly->wv, st->h, T, st->v);
        lc_rope(st, q, t0, T, H);
        lc_rope(st, st->k, t0, T, Hkv);
        for (int r = 0; r < T; r++) {
            for (int g = 0; g < Hkv; g++) {
                float *kd = st->kc + (((size_t)l * Hkv + g) * st->n_pad + t0 + r) * Dh;
                float *vd = st->vc + (((size_t)l * Hkv + g) * st->n_pad + t0 + r) * Dh;
                for (int i = 0; i < Dh; i++) {
                    kd[i] = lc_half(st->k[((size_t)r * Hkv + g) * Dh + i]);
                    vd[i] = lc_half(st->v[((size_t)r * Hkv + g) * Dh + i]);
                }
            }
        }
        lc_attn ac = {st, l, t0, T, one_token};
        sd_threadpool_run(m->pool, lc_attn_task, &ac, H);
        lc_matmul(st, &ly->wo, st->att + (size_t)t0 * H * Dh, T, st->tmp);
        for (size_t i = 0; i < (size_t)T * D; i++) {
            x[i] = st->tmp[i] + x[i];
        }
        for (int r = 0; r < T; r++) {
            lc_rmsnorm(st->h + (size_t)r * D, x + (size_t)r * D, ly->ffn_norm, D, cfg->rms_eps);
        }
        lc_matmul(st, &ly->w_gate, st->h, T, st->gate);
        lc_matmul(st, &ly->w_up, st->h, T, st->up);
        for (size_t i = 0; i < (size_t)T * F; i++) {
            const float gt = st->gate[i];
            st->h[i] = gt / (1.0f + lc_exp(0.0f - gt)) * st->up[i];
        }
        lc_matmul(st, &ly->w_down, st->h, T, st->tmp);
        for (size_t i = 0; i < (size_t)T * D; i++) {
            x[i] = st->tmp[i] + x[i];
        }
    }
    for (int r = 0; r < T; r++) {
        lc_rmsnorm(st->h + (size_t)r * D, x + (size_t)r * D, m->w.out_norm, D, cfg->rms_eps);
    }
    lc_matmul(st, &m->w.output, st->h, T, logits + (size_t)t0 * cfg->vocab_size);
}

/* ---- entry point --------------------------------------------------------------------------- */

static sd_status lc_check(const sd_model *m) {
    const sd_config *c = &m->cfg;
    if (m->device != SD_DEVICE_CPU) {
        return sd_set_error(SD_ERR_UNSUPPORTED, "llama.cpp's float order runs on CPU models only");
    }
    if (c->arch != SD_ARCH_LLAMA || c->rope_neox || c->has_qkv_bias) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "llama.cpp's float order is reproduced for the llama architecture "
                            "(adjacent-pair RoPE, no biases) only, not for %s",
                            c->arch_name);
    }
    if (c->rope_scaling != SD_ROPE_DEFAULT || c->sliding_window > 0) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "llama.cpp's float order is reproduced without RoPE scaling and "
                            "sliding windows only");
    }
    if (c->head_dim % 64 != 0 || c->hidden_size != c->n_heads * c->head_dim ||
        c->ffn_size % 32 != 0) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "llama.cpp's float order is reproduced for head_dim a multiple of 64 "
                            "only (got %d)",
                            c->head_dim);
    }
    if (m->w.tok_embd.type != SD_TYPE_Q8_0 || m->w.output.type != SD_TYPE_Q8_0) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "llama.cpp's float order is reproduced for a Q8_0 token embedding and "
                            "output head only (this model has %s and %s)",
                            sd_type_name(m->w.tok_embd.type), sd_type_name(m->w.output.type));
    }
    for (int l = 0; l < c->n_layers; l++) {
        const sd_layer *ly = &m->w.layers[l];
        const sd_mat *mats[7] = {&ly->wq,     &ly->wk,   &ly->wv,    &ly->wo,
                                 &ly->w_gate, &ly->w_up, &ly->w_down};
        for (int i = 0; i < 7; i++) {
            if (mats[i]->type != SD_TYPE_Q4_1) {
                return sd_set_error(SD_ERR_UNSUPPORTED,
                                    "llama.cpp's float order is reproduced for Q4_1 attention "
                                    "and MLP matrices only (layer %d has %s)",
                                    l, sd_type_name(mats[i]->type));
            }
        }
    }
    return SD_OK;
}

static void lc_free(lc_state *st) {
    float *bufs[] = {st->x,   st->h,  st->q,  st->k,    st->v,    st->att, st->gate,  st->up,
                     st->tmp, st->kc, st->vc, st->rope, st->work, st->acc, st->act.d, st->act.s};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        free(bufs[i]);
    }
    free(st->act.q);
}

sd_status sd_forward_llamacpp_order(sd_model *m, const int32_t *tokens, int n, int n_batch,
                                    float *logits) {
    SD_TRY(lc_check(m));
    const sd_config *c = &m->cfg;
    if (n < 1 || n > c->context_length) {
        return sd_set_error(SD_ERR_INVALID_ARG, "%d tokens: need 1 to %d (the context length)", n,
                            c->context_length);
    }
    if (n_batch < 1 || n_batch > n) {
        return sd_set_error(SD_ERR_INVALID_ARG, "n_batch %d: need 1 to %d (the tokens)", n_batch,
                            n);
    }
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size) {
            return sd_set_error(SD_ERR_INVALID_ARG, "token id %d at %d is outside [0, %d)",
                                (int)tokens[i], i, c->vocab_size);
        }
    }
    const int D = c->hidden_size, F = c->ffn_size, Dh = c->head_dim;
    const int HD = c->n_heads * Dh, KD = c->n_kv_heads * Dh;
    const int wide = D > F ? D : F;
    const size_t nn = (size_t)n;
    lc_state st = {0};
    st.m = m;
    st.n = n;
    st.nt = sd_threadpool_size(m->pool);
    st.n_pad = (n + 63) / 64 * 64;
#if SD_HAVE_X86_SIMD
    st.fma = sd_cpu_has_avx2_fma_f16c();
#endif
    st.x = malloc(nn * D * sizeof(float));
    st.h = malloc(nn * wide * sizeof(float));
    st.q = malloc(nn * HD * sizeof(float));
    st.k = malloc(nn * KD * sizeof(float));
    st.v = malloc(nn * KD * sizeof(float));
    st.att = malloc(nn * HD * sizeof(float));
    st.gate = malloc(nn * F * sizeof(float));
    st.up = malloc(nn * F * sizeof(float));
    st.tmp = malloc(nn * wide * sizeof(float));
    st.kc = calloc((size_t)c->n_layers * st.n_pad * KD, sizeof(float));
    st.vc = calloc((size_t)c->n_layers * st.n_pad * KD, sizeof(float));
    st.rope = malloc(nn * Dh * sizeof(float));
    st.work = malloc((size_t)st.nt * (2 * (size_t)st.n_pad + Dh) * sizeof(float));
    st.acc = malloc((size_t)st.nt * nn * 9 * sizeof(float));
    st.act.q = malloc(nn * wide);
    st.act.d = malloc(nn * (wide / 32) * sizeof(float));
    st.act.s = malloc(nn * (wide / 32) * sizeof(float));
    if (!st.x || !st.h || !st.q || !st.k || !st.v || !st.att || !st.gate || !st.up || !st.tmp ||
        !st.kc || !st.vc || !st.rope || !st.work || !st.acc || !st.act.q || !st.act.d ||
        !st.act.s) {
        lc_free(&st);
        return sd_set_error(SD_ERR_NOMEM,
                            "out of memory for a %d-token forward in llama.cpp's "
                            "float order",
                            n);
    }
    /* embedding rows: d * q per block of the Q8_0 matrix */
    for (int t = 0; t < n; t++) {
        const uint8_t *row =
            (const uint8_t *)m->w.tok_embd.data + (size_t)tokens[t] * m->w.tok_embd.row_bytes;
        const size_t blk_bytes = m->w.tok_embd.row_bytes / (size_t)(D / 32);
        for (int b = 0; b < D / 32; b++) {
            sd_sub32 sb;
            sd_blk_decode_q8_0(&sb, row + blk_bytes * (size_t)b, 0);
            for (int i = 0; i < 32; i++) {
                st.x[(size_t)t * D + 32 * b + i] = (float)sb.q[i] * sb.d_lo;
            }
        }
    }
    /* RoPE angles: pos * r^i by repeated products, as ggml_rope_cache_init */
    const float theta_scale = powf(c->rope_theta, -2.0f / (float)Dh);
    for (int t = 0; t < n; t++) {
        float theta = (float)t;
        for (int i = 0; i < Dh; i += 2) {
            st.rope[(size_t)t * Dh + i] = cosf(theta);
            st.rope[(size_t)t * Dh + i + 1] = sinf(theta);
            theta *= theta_scale;
        }
    }
    const int first = n_batch > 1 ? n_batch : 0;
    if (first > 0) {
        lc_rows(&st, 0, first, 0, logits);
    }
    for (int t = first; t < n; t++) {
        lc_rows(&st, t, 1, 1, logits);
    }
    lc_free(&st);
    return SD_OK;
}
