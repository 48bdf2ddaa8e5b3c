/* plain.c — sd_generate, the plain decoding loop: prefill the prompt, then pick a token from the
 * last logits, feed it back, repeat. The reference every speculative run is tested against. */
#include <stdlib.h>
#include <string.h>

#include "cpu/ops_cpu.h"
#include "model/forward.h"
#include "model/model.h"
#include "spec/decode.h"
#include "spec/sampler.h"
#include "spec/verify.h"
#include "util/hd.h"
#include "util/status.h"

#ifdef SD_WITH_CUDA
/* The plain loop of a CUDA model: the prompt's last token goes through its own one-token
 * forward, as in the speculative loops (a long prefill may take cuBLAS, which is not
 * batch-invariant: this way both loops see the same prefill and the same one-token steps);
 * each token is picked on the device and copied back, the one synchronisation per token. */
static sd_status generate_cuda(sd_emitter *e, sd_model *m, const int32_t *prompt, int n_prompt,
                               const sd_generate_params *p, const sd_sampling *s) {
    sd_kv_cache *kv = NULL;
    SD_TRY(sd_kv_cache_create(&kv, m, n_prompt + p->max_new_tokens - 1));
    const sd_cuda_sampling cs = sd_cuda_sampling_of(s);
    sd_batch b = {0};
    sd_status st = SD_OK;
    if (n_prompt > 1) {
        b.n_tokens = n_prompt - 1;
        b.tokens = prompt;
        st = sd_forward_ex(m, kv, &b, NULL, NULL);
    }
    b.n_tokens = 1;
    b.tokens = &prompt[n_prompt - 1];
    b.n_logits = 1;
    if (st == SD_OK) {
        st = sd_forward_ex(m, kv, &b, NULL, NULL);
    }
    while (st == SD_OK) {
        int32_t tok = 0;
        st = sd_cuda_pick(m->cuda, 0, &cs, p->seed, (uint64_t)e->n, &tok);
        if (st == SD_OK) {
            st = sd_emit(e, tok);
        }
        if (st != SD_OK || e->done) {
            break;
        }
        b.tokens = &e->out[e->n - 1];
        st = sd_forward_ex(m, kv, &b, NULL, NULL);
    }
    sd_kv_cache_free(kv);
    return st;
}
#endif

sd_status sd_generate(int32_t *out, int *n_out, sd_finish_reason *reason, sd_model *m,
                      const int32_t *prompt, int n_prompt, const sd_generate_params *p) {
    *n_out = 0;
    if (reason != NULL) {
        *reason = SD_FINISH_LENGTH;
    }
    sd_sampling s;
    SD_TRY(sd_decode_check(m, prompt, n_prompt, p, &s));
    if (p->max_new_tokens == 0) {
        return SD_OK;
    }
    const int V = m->cfg.vocab_size;
    sd_emitter e;
    sd_emitter_init(&e, m, p, out);
#ifdef SD_WITH_CUDA
    if (m->cuda != NULL) {
        const sd_status cst = generate_cuda(&e, m, prompt, n_prompt, p, &s);
        *n_out = e.n;
        if (reason != NULL) {
            *reason = e.reason;
        }
        free(e.text);
        return cst;
    }
#endif
    sd_kv_cache *kv = NULL;
    float *logits = malloc((size_t)V * 2 * sizeof(float));
    int32_t *work = malloc((size_t)V * sizeof(int32_t));
    sd_status st =
        logits == NULL || work == NULL ? sd_set_error(SD_ERR_NOMEM, "out of memory") : SD_OK;
    if (st == SD_OK) {
        /* the last emitted token is never fed back, so one slot fewer suffices */
        st = sd_kv_cache_create(&kv, m, n_prompt + p->max_new_tokens - 1);
    }
    sd_batch b = {0};
    b.n_tokens = n_prompt;
    b.tokens = prompt;
    b.n_logits = 1;
    if (st == SD_OK) {
        st = sd_forward(m, kv, &b, logits);
    }
    while (st == SD_OK) {
        int32_t tok;
        if (s.temperature == 0.0f) {
            tok = sd_argmax(logits, V);
        } else {
            float *probs = logits + V;
            sd_process_logits(probs, logits, V, &s, work);
            tok =
                sd_sample_probs(probs, V, sd_rng_uniform(p->seed, SD_STREAM_PLAIN, (uint64_t)e.n));
        }
        st = sd_emit(&e, tok);
        if (st != SD_OK || e.done) {
            break;
        }
        b.n_tokens = 1;
        b.tokens = &out[e.n - 1];
        st = sd_forward(m, kv, &b, logits);
    }
    *n_out = e.n;
    if (reason != NULL) {
        *reason = e.reason;
    }
    sd_kv_cache_free(kv);
    free(logits);
    free(work);
    free(e.text);
    return st;
}
