/* twins.c — the CPU twins of the CUDA kernels (twins.h): the forward pass's own CPU operators
 * where it has them, else straightforward loops over the same definitions. */
#include "check/twins.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "util/hd.h"
#include "cpu/ops_cpu.h"
#include "cpu/quant.h"
#include "spec/loop.h"
#include "spec/sampler.h"
#include "spec/verify.h"

void sd_twin_embed(float *out, const void *table, int type, int64_t D, const int32_t *tokens,
                   int T) {
    const sd_type_traits *tr = sd_type_get(type);
    const size_t rb = sd_row_bytes(type, D);
    for (int t = 0; t < T; t++) {
        tr->to_float(out + (size_t)t * (size_t)D,
                     (const unsigned char *)table + (size_t)tokens[t] * rb, D);
    }
}

void sd_twin_rmsnorm(float *out, const float *x, const float *w, int T, int n, float eps) {
    sd_rmsnorm(out, x, w, T, n, eps);
}

void sd_twin_head_input(float *out, const float *e, float *x, const float *w_in, const float *w_hid,
                        int T, int n, float eps, int norm_residual) {
    sd_head_input_rows(out, e, x, w_in, w_hid, T, n, eps, norm_residual);
}

void sd_twin_silu_add(float *x, const float *u, int64_t n) {
    sd_silu_add(x, u, n);
}

void sd_twin_rope(float *x, const int32_t *pos, const double *freq, int T, int n_heads,
                  int head_dim, int neox) {
    float *cs = malloc((size_t)T * (size_t)head_dim * sizeof(float));
    if (cs == NULL) {
        return;
    }
    for (int t = 0; t < T; t++) { /* as forward.c: the angle in double */
        for (int i = 0; i < head_dim / 2; i++) {
            const double a = (double)pos[t] * freq[i];
            cs[(size_t)t * head_dim + 2 * i] = (float)cos(a);
            cs[(size_t)t * head_dim + 2 * i + 1] = (float)sin(a);
        }
    }
    sd_rope(x, cs, T, n_heads, head_dim, neox);
    free(cs);
}

void sd_twin_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    sd_swiglu_ref(out, gate, up, n);
}

void sd_twin_kv_write(float *kc, float *vc, const float *k, const float *v, const int32_t *slots,
                      int T, int n_kv_heads, int head_dim, int capacity) {
    const size_t row = (size_t)head_dim;
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < n_kv_heads; h++) {
            const size_t src = ((size_t)t * (size_t)n_kv_heads + (size_t)h) * row;
            const size_t dst = ((size_t)h * (size_t)capacity + (size_t)slots[t]) * row;
            memcpy(kc + dst, k + src, row * sizeof(float));
            memcpy(vc + dst, v + src, row * sizeof(float));
        }
    }
}

void sd_twin_attention(float *out, const float *q, const float *kc, const float *vc,
                       const uint8_t *mask, int T, int n_attn, int n_heads, int n_kv_heads,
                       int head_dim, int capacity) {
    float *sc = malloc((size_t)n_attn * sizeof(float));
    if (sc == NULL) {
        return;
    }
    const int G = n_heads / n_kv_heads;
    const size_t head = (size_t)capacity * (size_t)head_dim;
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < n_heads; h++) {
            sd_attn_group g;
            float st[2];
            g.n = 1;
            g.st[0] = st;
            g.q[0] = q + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)head_dim;
            g.o[0] = out + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)head_dim;
            g.m[0] = mask + (size_t)t * (size_t)n_attn;
            sd_attend_rows_ref(&g, kc + (size_t)(h / G) * head, vc + (size_t)(h / G) * head, n_attn,
                               head_dim, 1.0f / sqrtf((float)head_dim), sc);
        }
    }
    free(sc);
}

void sd_twin_matmul(float *y, int64_t ldy, const void *w, int type, int64_t rows, int64_t cols,
                    const float *x, int T, const float *bias, int accumulate) {
    const sd_type_traits *tr = sd_type_get(type);
    const size_t rb = sd_row_bytes(type, cols);
    float *row = malloc((size_t)cols * sizeof(float));
    if (row == NULL) {
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        tr->to_float(row, (const unsigned char *)w + (size_t)r * rb, cols);
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * (size_t)cols;
            double s = 0.0;
            for (int64_t i = 0; i < cols; i++) {
                s += (double)row[i] * (double)xt[i];
            }
            float v = (float)s + (bias != NULL ? bias[r] : 0.0f);
            float *dst = &y[(size_t)t * (size_t)ldy + (size_t)r];
            *dst = accumulate ? *dst + v : v;
        }
    }
    free(row);
}

void sd_twin_process(float *probs, const float *logits, int rows, int V, float temperature,
                     int top_k, float top_p, float min_p) {
    int32_t *work = malloc((size_t)V * sizeof(int32_t));
    if (work == NULL) {
        return;
    }
    sd_sampling s = {temperature, top_k, top_p, min_p};
    for (int r = 0; r < rows; r++) {
        sd_process_logits(probs + (size_t)r * V, logits + (size_t)r * V, V, &s, work);
    }
    free(work);
}

void sd_twin_argmax(int32_t *out, const float *x, int rows, int V) {
    for (int r = 0; r < rows; r++) {
        out[r] = sd_argmax(x + (size_t)r * V, V);
    }
}

void sd_twin_sample(int32_t *out, const float *probs, int rows, int V, uint64_t seed,
                    uint64_t stream, uint64_t index0) {
    for (int r = 0; r < rows; r++) {
        out[r] = sd_sample_probs(probs + (size_t)r * V, V,
                                 sd_rng_uniform(seed, stream, index0 + (uint64_t)r));
    }
}

void sd_twin_verify(int32_t *result, const float *p, const float *q, const int32_t *draft, int K,
                    int V, uint64_t seed, uint64_t pos0) {
    double ua[SD_MAX_DRAFT], un[SD_MAX_DRAFT + 1];
    float *work = malloc((size_t)V * sizeof(float));
    if (work == NULL || K > SD_MAX_DRAFT) {
        free(work);
        return;
    }
    for (int i = 0; i <= K; i++) {
        if (i < K) {
            ua[i] = sd_rng_uniform(seed, SD_STREAM_ACCEPT, pos0 + (uint64_t)i);
        }
        un[i] = sd_rng_uniform(seed, SD_STREAM_EMIT, pos0 + (uint64_t)i);
    }
    int32_t next = 0;
    result[0] = sd_verify_chain(&next, p, q, draft, K, V, ua, un, work);
    result[1] = next;
    free(work);
}

void sd_twin_row_top(int32_t *out, const float *x, int rows, int V, int top) {
    for (int r = 0; r < rows; r++) {
        sd_top_ids(out + (size_t)r * (size_t)top, top, x + (size_t)r * (size_t)V, V);
    }
}

void sd_twin_verify_tree(int32_t *result, const float *p, const float *q, const int32_t *tokens,
                         const int32_t *parent, int n, int V, uint64_t seed, uint64_t out_pos) {
    double ua[SD_MAX_TREE], un[SD_MAX_TREE + 1];
    float *work = malloc(2 * (size_t)V * sizeof(float));
    if (work == NULL || n > SD_MAX_TREE) {
        free(work);
        return;
    }
    for (int i = 0; i < n; i++) {
        ua[i] = sd_rng_uniform(seed, SD_STREAM_TREE, out_pos * SD_MAX_TREE + (uint64_t)i);
    }
    for (int a = 0; a <= n; a++) { /* at most n accepted: the path is no deeper */
        un[a] = sd_rng_uniform(seed, SD_STREAM_EMIT, out_pos + (uint64_t)a);
    }
    int32_t next = 0;
    result[0] = sd_verify_tree(result + 2, &next, tokens, parent, n, p, q, V, ua, un, work);
    result[1] = next;
    free(work);
}

void sd_twin_synthetic_accept(int32_t *n_acc, int K, double alpha, uint64_t seed, uint64_t pos0) {
    *n_acc = sd_verify_synthetic(K, alpha, seed, pos0);
}

void sd_twin_dummy_fill(void *dst, int type, int64_t rows, int64_t cols, uint64_t seed,
                        uint64_t tensor, float scale) {
    sd_dummy_fill(dst, type, rows, cols, seed, tensor, scale);
}
