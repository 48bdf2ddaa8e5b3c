/* bench.c — timing entry points for the benchmark scripts: forwards over T tokens after a
 * context, with the logits left where the decoding loops leave them (on the device for a CUDA
 * model), the CPU attention alone, and the GPU's copy bandwidth. Not used by decoding. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/forward.h"
#include "model/model.h"
#include "cpu/ops_cpu.h"
#include "cpu/dispatch.h"
#include "cpu/quant.h"
#include "util/clock.h"
#include "util/status.h"
#include "util/threadpool.h"
#ifdef SD_WITH_CUDA
#include "../cuda/sd_cuda.h"
#endif

sd_status sd_bench_forward(double *seconds, sd_model *m, int T, int context, int iters) {
    *seconds = 0.0;
    const sd_config *c = &m->cfg;
    if (T < 1 || context < 0 || iters < 1 || (int64_t)context + T > c->context_length) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "bench_forward: need T >= 1, context >= 0, iters >= 1 and context + T "
                            "<= %d, got T %d, context %d, iters %d",
                            c->context_length, T, context, iters);
    }
    int32_t *tok = malloc((size_t)(context + T) * sizeof(int32_t));
    float *logits =
        m->cuda == NULL ? malloc((size_t)T * (size_t)c->vocab_size * sizeof(float)) : NULL;
    if (tok == NULL || (m->cuda == NULL && logits == NULL)) {
        free(tok);
        free(logits);
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < context + T; i++) { /* ordinary ids, spread over the vocabulary */
        tok[i] = (int32_t)((1000003u * (unsigned)(i + 1)) % (unsigned)c->vocab_size);
    }
    sd_kv_cache *kv = NULL;
    sd_status st = sd_kv_cache_create(&kv, m, context + T);
    sd_batch b = {0};
    if (st == SD_OK && context > 0) {
        b.n_tokens = context;
        b.tokens = tok;
        st = sd_forward_ex(m, kv, &b, logits, NULL);
    }
    b.n_tokens = T;
    b.tokens = tok + context;
    b.n_logits = T;
    for (int w = 0; st == SD_OK && w < 2; w++) { /* one warm-up call, then the timed ones */
        const int n = w == 0 ? 1 : iters;
        const double t0 = sd_now_s();
        for (int i = 0; st == SD_OK && i < n; i++) {
            st = sd_kv_cache_set_length(kv, context);
            if (st == SD_OK) {
                st = sd_forward_ex(m, kv, &b, logits, NULL);
            }
        }
#ifdef SD_WITH_CUDA
        if (st == SD_OK && m->cuda != NULL) {
            st = sd_cuda_model_sync(m->cuda);
        }
#endif
        *seconds = (sd_now_s() - t0) / n;
    }
    sd_kv_cache_free(kv);
    free(tok);
    free(logits);
    return st;
}

/* The next value in [-1, 1) of a fixed pseudo-random sequence (a linear congruential one). */
static float lcg_unit(uint32_t *x) {
    *x = *x * 1664525u + 1013904223u;
    return (float)(*x >> 8) / 8388608.0f - 1.0f;
}

sd_status sd_bench_attention(double *seconds, int T, int n_attn, int n_heads, int n_kv_heads,
                             int head_dim, int n_layers, int n_threads, int iters) {
    *seconds = 0.0;
    if (T < 1 || n_attn < T || n_kv_heads < 1 || n_heads < 1 || n_heads % n_kv_heads != 0 ||
        head_dim < 1 || head_dim > SD_MAX_HEAD_DIM || n_layers < 1 || n_threads < 1 || iters < 1) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "bench_attention: need 1 <= T <= n_attn, n_heads >= 1, n_kv_heads "
                            "dividing n_heads, "
                            "1 <= head_dim <= %d, n_layers, n_threads and iters >= 1",
                            SD_MAX_HEAD_DIM);
    }
    /* each head's keys (in tiles) and values (in rows) take whole tiles, as in a cache */
    const size_t per_head = (size_t)sd_kv_slots(n_attn) * (size_t)head_dim;
    const size_t per_layer = (size_t)n_kv_heads * per_head;
    const size_t nq = (size_t)T * (size_t)n_heads * (size_t)head_dim;
    uint16_t *k = malloc(2 * per_layer * (size_t)n_layers * sizeof(uint16_t));
    float *q = malloc(2 * nq * sizeof(float));
    uint8_t *mask = calloc((size_t)T * (size_t)n_attn, 1);
    float *scratch = malloc(sd_attention_scratch(n_attn, head_dim, n_threads) * sizeof(float));
    sd_threadpool *pool = NULL;
    sd_status st = k == NULL || q == NULL || mask == NULL || scratch == NULL
                       ? sd_set_error(SD_ERR_NOMEM, "out of memory")
                       : sd_threadpool_create(&pool, n_threads);
    if (st == SD_OK) {
        sd_kernels_init();
        /* keys and values as halves of lcg_unit's sequence, then the queries */
        uint32_t x = 12345u;
        const size_t n_kv = 2 * per_layer * (size_t)n_layers;
        float f[256];
        for (size_t i = 0; i < n_kv; i += 256) {
            const size_t n = n_kv - i < 256 ? n_kv - i : 256;
            for (size_t j = 0; j < n; j++) {
                f[j] = lcg_unit(&x);
            }
            sd_f32_to_f16_row(k + i, f, (int64_t)n);
        }
        for (size_t i = 0; i < nq; i++) {
            q[i] = lcg_unit(&x);
        }
        /* a verify batch after n_attn - T slots: token t sees the context and tokens 0 .. t */
        for (int t = 0; t < T; t++) {
            memset(mask + (size_t)t * (size_t)n_attn, 1, (size_t)(n_attn - T + t + 1));
        }
        const uint16_t *v = k + per_layer * (size_t)n_layers;
        for (int w = 0; w < 2; w++) { /* one warm-up pass, then the timed ones */
            const int n = w == 0 ? 1 : iters;
            const double t0 = sd_now_s();
            for (int i = 0; i < n; i++) {
                for (int l = 0; l < n_layers; l++) {
                    sd_attention(pool, q + nq, q, k + (size_t)l * per_layer,
                                 v + (size_t)l * per_layer, 1, per_head, mask, T, n_attn, n_heads,
                                 n_kv_heads, head_dim, scratch);
                }
            }
            *seconds = (sd_now_s() - t0) / n;
        }
    }
    sd_threadpool_free(pool);
    free(scratch);
    free(mask);
    free(q);
    free(k);
    return st;
}

sd_status sd_bench_copy(double *seconds, int gpu, size_t bytes, int iters) {
#ifdef SD_WITH_CUDA
    return sd_cuda_copy_bench(gpu, bytes, iters, seconds);
#else
    (void)gpu;
    (void)bytes;
    (void)iters;
    *seconds = 0.0;
    return sd_set_error(SD_ERR_UNSUPPORTED, "this build has no CUDA backend");
#endif
}
