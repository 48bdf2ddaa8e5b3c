/* decode.h — what the plain and the speculative loops share: the parameter checks of a call,
 * emitting tokens (stop tokens, stop strings, the length limit, on_token), and the clock. */
#ifndef SD_DECODE_H
#define SD_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "model/forward.h"
#include "model/model.h"
#include "spec/verify.h"
#include "specdec.h"
#include "util/clock.h"
#ifdef SD_WITH_CUDA
#include "../cuda/sd_cuda.h"
#endif

/* The output of a call as it is emitted. */
typedef struct {
    const sd_model *m;
    const sd_generate_params *p;
    int32_t *out;
    int n;
    sd_finish_reason reason;
    int done;
    char *text; /* output bytes so far, to watch for stop strings */
    size_t len, cap, longest;
    /* with p->logprobs (sd_emitter_want_logprobs): each token's log-probability, the
     * top_logprobs best ids and theirs (lp_cap rows, grown as tokens come), a row's work (V) */
    int logprobs, lp_cap;
    float *lp;
    int32_t *top_id;
    float *top_lp;
    float *work;
    /* with a logit bias or penalties (sd_emitter_want_penalties): each id's count in the output
     * (V), whether it is in `ids` (V), and the ids of the prompt and output, n_ids of them (V) */
    int32_t *count;
    uint8_t *listed;
    int32_t *ids;
    int n_ids;
} sd_emitter;

/* Feeding a prompt a step at a time. On the CPU a long prompt goes in steps of about
 * SD_PREFILL_STEP_S seconds each (sized from the speed of the steps before), so that a caller
 * stepping a sequence (sd_sequence_step) gets control back often: to stream, to notice an
 * interrupt, to let other requests take turns. A token's keys, values and logits do not depend
 * on how its batch was cut (the kernels are batch-invariant), so the bits are those of one
 * batch. A CUDA model takes the whole prompt in one batch, as its long-batch kernels differ. */
#define SD_PREFILL_STEP_S 0.05
typedef struct {
    int fed;   /* tokens in the cache */
    int chunk; /* tokens of the next step */
} sd_prefill;

/* Feeds the next step's tokens of toks[0 .. n) to kv (from pf->fed on); when that reaches n and
 * logits is not NULL, the last token's logits go there. Nothing to feed: nothing happens. */
sd_status sd_prefill_step(sd_prefill *pf, sd_model *m, sd_kv_cache *kv, const int32_t *toks, int n,
                          float *logits);
/* The same in two halves around a forward that a scheduler may share with other requests: the
 * next step's batch into f (f->b.n_tokens = 0 when nothing is left), then, after its forward
 * (f->seconds for f->n_all tokens), the tokens counted in and the next step sized. */
void sd_prefill_next(const sd_prefill *pf, const sd_model *m, sd_kv_cache *kv, const int32_t *toks,
                     int n, float *logits, sd_fwd *f);
void sd_prefill_fed(sd_prefill *pf, const sd_fwd *f);

/* The checks every generate call makes before it computes anything (the prompt, max_new_tokens,
 * the sampling parameters, the context length, stop strings without pieces); fills s from p. */
sd_status sd_decode_check(const sd_model *m, const int32_t *prompt, int n_prompt,
                          const sd_generate_params *p, sd_sampling *s);

void sd_emitter_init(sd_emitter *e, const sd_model *m, const sd_generate_params *p, int32_t *out);
/* The log-probability arrays, when p->logprobs asks for them (after sd_emitter_init). */
sd_status sd_emitter_want_logprobs(sd_emitter *e);
void sd_emitter_free(sd_emitter *e);
/* The penalties' state, when p asks for a logit bias or penalties (after sd_emitter_init):
 * the prompt's ids listed. */
sd_status sd_emitter_want_penalties(sd_emitter *e, const int32_t *prompt, int n_prompt);
/* Applies p's logit bias, penalties and min_tokens to `row` (V logits) of the position after
 * the output so far and then path[0 .. n_path) (drafted tokens, in any order); nothing without
 * them. */
void sd_emitter_penalize(sd_emitter *e, float *row, const int32_t *path, int n_path);
/* Append `tok`, taken from the target's logits `row` (V raw logits; read only with logprobs, may
 * be NULL otherwise); sets e->done when generation must end after it. */
sd_status sd_emit(sd_emitter *e, int32_t tok, const float *row);

/* Plain decoding of one sequence (plain.c): the prompt is fed a step at a time, then each step
 * feeds the last token back and emits the next. */
typedef struct {
    sd_model *m;
    const int32_t *prompt; /* (n_prompt) not owned */
    int n_prompt;
    sd_sampling s;
    uint64_t seed;
    sd_prefill pf;
    sd_kv_cache *kv;
    float *logits; /* (2 V): the last logits, then the processed distribution */
    int pending;   /* the step's second half has work: it picks a token (2) or counts a part of
                    * the prompt in (1) */
    int32_t *work; /* (V) */
    sd_emitter e;
} sd_plain;

/* Checks nothing (sd_decode_check has) and computes nothing: allocates P's buffers and cache,
 * or takes `kv` (owned from now on; NULL: a new one), whose first `reused` slots hold the
 * prompt's first tokens. On failure P still needs sd_plain_end. */
sd_status sd_plain_begin(sd_plain *P, sd_model *m, const int32_t *prompt, int n_prompt,
                         const sd_generate_params *p, const sd_sampling *s, int32_t *out,
                         sd_kv_cache *kv, int reused);
/* One step: a part of the prompt, or (once it is all in) one token emitted; in two halves around
 * the step's forward, f (f->b.n_tokens = 0: the first half did the whole step, as on a CUDA
 * model), which the second half is given with the forward's status. */
sd_status sd_plain_step_before(sd_plain *P, sd_fwd *f);
sd_status sd_plain_step_after(sd_plain *P, const sd_fwd *f, sd_status forward);
void sd_plain_end(sd_plain *P);

#ifdef SD_WITH_CUDA
static inline sd_cuda_sampling sd_cuda_sampling_of(const sd_sampling *s) {
    sd_cuda_sampling c;
    c.temperature = s->temperature;
    c.top_k = s->top_k;
    c.top_p = s->top_p;
    c.min_p = s->min_p;
    return c;
}
#endif

#endif /* SD_DECODE_H */
