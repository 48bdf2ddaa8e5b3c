/* lookup_history.h — earlier requests' outputs for prompt lookup (a drafter's, set by
 * sd_drafter_set_history; read by prompt_lookup.c and by the lookup beside other drafters,
 * sd_lookup_side_draft in spec/lookup.h; the loop adds each request's output as it ends).
 *
 * A drafter's memory of what its earlier requests generated, for the steps where the text itself
 * has no match of two or more tokens: answers to one kind of question share their phrasing
 * (on SmolLM2's Spec-Bench dev half, prompt lookup's tau 1.51 -> 1.58, math_reasoning's 1.51 ->
 * 1.71; benchmarks/RESULTS.md). The last `cap` tokens, requests one after another with an end
 * mark between them, and a hash table from each n-gram of SD_LOOKUP_HISTORY_MIN to
 * SD_LOOKUP_HISTORY_MAX tokens to the position after its latest occurrence, checked against the
 * tokens kept when read (an entry whose tokens were overwritten is no match). The table is a
 * cache: where a run of probed slots holds only other n-grams still in the history, the one
 * seen longest ago gives way, and its n-gram drafts nothing. Requests of one drafter share it under
 * its lock, so one request's output can shape another's drafts, never its tokens (every draft is
 * verified). */
#ifndef SD_LOOKUP_HISTORY_H
#define SD_LOOKUP_HISTORY_H

#include <stdint.h>

#include "specdec.h"

#define SD_LOOKUP_HISTORY_MIN 2
#define SD_LOOKUP_HISTORY_MAX 4
#define SD_LOOKUP_HISTORY_MAX_TOKENS (1 << 24)
typedef struct sd_lookup_history sd_lookup_history;

/* A history of at least `tokens` (1 .. SD_LOOKUP_HISTORY_MAX_TOKENS, else SD_ERR_INVALID_ARG)
 * tokens: *out, or NULL with SD_ERR_NOMEM. */
sd_status sd_lookup_history_create(sd_lookup_history **out, int tokens);
void sd_lookup_history_free(sd_lookup_history *hs);
/* Adds one request's output t[0 .. n) (its last `cap` tokens where longer). */
void sd_lookup_history_add(sd_lookup_history *hs, const int32_t *t, int n);
/* The draft of up to k tokens after h[0 .. len) from the history: for n from
 * SD_LOOKUP_HISTORY_MAX down to SD_LOOKUP_HISTORY_MIN, the tokens that followed the latest
 * occurrence of the text's last n, up to the end of the request they came from. Returns how
 * many were written (0: no match), *n_match the n. */
int sd_lookup_history_draft(sd_lookup_history *hs, int32_t *draft, int *n_match, const int32_t *h,
                            int len, int k);

#endif /* SD_LOOKUP_HISTORY_H */
