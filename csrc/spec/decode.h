/* decode.h — what the plain and the speculative loops share: the parameter checks of a call,
 * emitting tokens (stop tokens, stop strings, the length limit, on_token), and the clock. */
#ifndef SD_DECODE_H
#define SD_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "spec/verify.h"
#include "specdec.h"
#ifdef SD_WITH_CUDA
#include "../cuda/sd_cuda.h"
#endif

/* Seconds on a monotonic clock. */
double sd_now_s(void);

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
} sd_emitter;

/* The checks every generate call makes before it computes anything (the prompt, max_new_tokens,
 * the sampling parameters, the context length, stop strings without pieces); fills s from p. */
sd_status sd_decode_check(const sd_model *m, const int32_t *prompt, int n_prompt,
                          const sd_generate_params *p, sd_sampling *s);

void sd_emitter_init(sd_emitter *e, const sd_model *m, const sd_generate_params *p, int32_t *out);
/* Append `tok`; sets e->done when generation must end after it. */
sd_status sd_emit(sd_emitter *e, int32_t tok);

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
