/* bench.c — timing entry points for the benchmark scripts: forwards over T tokens after a
 * context, with the logits left where the decoding loops leave them (on the device for a CUDA
 * model), and the GPU's copy bandwidth. Not used by decoding. */
#include <stdlib.h>
#include <time.h>

#include "forward.h"
#include "model.h"
#include "status.h"
#ifdef SD_WITH_CUDA
#include "../cuda/sd_cuda.h"
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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
        const double t0 = now_s();
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
        *seconds = (now_s() - t0) / n;
    }
    sd_kv_cache_free(kv);
    free(tok);
    free(logits);
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
