/* plain.c — plain decoding of one sequence, a step at a time: prefill the prompt, then pick a
 * token from the last logits, feed it back, repeat. The reference every speculative run is
 * tested against. */
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

sd_status sd_plain_begin(sd_plain *P, sd_model *m, const int32_t *prompt, int n_prompt,
                         const sd_generate_params *p, const sd_sampling *s, int32_t *out,
                         sd_kv_cache *kv, int reused) {
    const int V = m->cfg.vocab_size;
    memset(P, 0, sizeof(*P));
    P->kv = kv;
    P->pf.fed = reused;
    P->m = m;
    P->prompt = prompt;
    P->n_prompt = n_prompt;
    P->s = *s;
    P->seed = p->seed;
    sd_emitter_init(&P->e, m, p, out);
    SD_TRY(sd_emitter_want_logprobs(&P->e));
    SD_TRY(sd_emitter_want_penalties(&P->e, prompt, n_prompt));
    if (m->cuda == NULL) {
        P->logits = malloc((size_t)V * 2 * sizeof(float));
        P->work = malloc((size_t)V * sizeof(int32_t));
        if (P->logits == NULL || P->work == NULL) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory");
        }
    }
    /* the last emitted token is never fed back, so one slot fewer suffices */
    return kv != NULL ? SD_OK : sd_kv_cache_create(&P->kv, m, n_prompt + p->max_new_tokens - 1);
}

void sd_plain_end(sd_plain *P) {
    sd_kv_cache_free(P->kv);
    free(P->logits);
    free(P->work);
    sd_emitter_free(&P->e);
}

#ifdef SD_WITH_CUDA
/* A step of a CUDA model: the prompt's last token goes through its own one-token forward, as in
 * the speculative loop (a long prefill may take cuBLAS, which is not batch-invariant: this way
 * both loops see the same prefill and the same one-token steps); each token is picked on the
 * device and copied back, the one synchronisation per token. */
static sd_status plain_step_cuda(sd_plain *P) {
    sd_batch b = {0};
    b.n_tokens = 1;
    b.n_logits = 1;
    if (P->pf.fed < P->n_prompt) {
        SD_TRY(sd_prefill_step(&P->pf, P->m, P->kv, P->prompt, P->n_prompt - 1, NULL));
        b.tokens = &P->prompt[P->n_prompt - 1];
        P->pf.fed = P->n_prompt;
    } else {
        b.tokens = &P->e.out[P->e.n - 1];
    }
    SD_TRY(sd_forward_ex(P->m, P->kv, &b, NULL, NULL));
    const sd_cuda_sampling cs = sd_cuda_sampling_of(&P->s);
    int32_t tok = 0;
    SD_TRY(sd_cuda_pick(P->m->cuda, 0, &cs, P->seed, (uint64_t)P->e.n, &tok));
    return sd_emit(&P->e, tok, NULL); /* no logprobs on a CUDA model (sd_decode_check) */
}
#endif

sd_status sd_plain_step_before(sd_plain *P, sd_fwd *f) {
    memset(f, 0, sizeof(*f));
    P->pending = 0;
#ifdef SD_WITH_CUDA
    if (P->m->cuda != NULL) {
        return plain_step_cuda(P);
    }
#endif
    if (P->pf.fed < P->n_prompt) { /* a part of the prompt; its last logits with the last part */
        sd_prefill_next(&P->pf, P->m, P->kv, P->prompt, P->n_prompt, P->logits, f);
        P->pending = f->b.n_logits ? 2 : 1;
        return SD_OK;
    }
    f->kv = P->kv;
    f->b.n_tokens = 1;
    f->b.tokens = &P->e.out[P->e.n - 1];
    f->b.n_logits = 1;
    f->logits = P->logits;
    P->pending = 2;
    return SD_OK;
}

sd_status sd_plain_step_after(sd_plain *P, const sd_fwd *f, sd_status forward) {
    const int pending = P->pending;
    P->pending = 0;
    SD_TRY(forward);
    if (pending == 0) {
        return SD_OK;
    }
    if (P->pf.fed < P->n_prompt) {
        sd_prefill_fed(&P->pf, f);
    }
    if (pending == 1) {
        return SD_OK; /* more of the prompt next step */
    }
    const int V = P->m->cfg.vocab_size;
    sd_emitter_penalize(&P->e, P->logits, NULL, 0);
    int32_t tok;
    if (P->s.temperature == 0.0f) {
        tok = sd_argmax(P->logits, V);
    } else {
        float *probs = P->logits + V;
        sd_process_logits(probs, P->logits, V, &P->s, P->work);
        tok = sd_sample_probs(probs, V, sd_rng_uniform(P->seed, SD_STREAM_PLAIN, (uint64_t)P->e.n));
    }
    return sd_emit(&P->e, tok, P->logits);
}
