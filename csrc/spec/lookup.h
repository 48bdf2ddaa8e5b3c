/* lookup.h — the n-gram matcher of prompt lookup: a pure function of the text so far. */
#ifndef SD_LOOKUP_H
#define SD_LOOKUP_H

#include <stdint.h>

/* How far back sd_lookup_draft follows a match when it chooses between the occurrences of an
 * n-gram: the occurrence whose preceding tokens agree longest with the text's last ones wins,
 * counted up to this many tokens. */
#define SD_LOOKUP_EXTENT_MAX 64

/* The draft of up to k tokens that prompt lookup proposes after h[0 .. len): for n from
 * max_ngram down to min_ngram, the occurrences h[i .. i + n) of the last n tokens (i + n < len)
 * are compared by their extent, the length of the common suffix of h[0 .. i + n) and
 * h[0 .. len) (at least n, counted up to SD_LOOKUP_EXTENT_MAX); the longest wins, the latest
 * among equals; the first n with an occurrence decides. The draft is what followed it,
 * d_j = h[i + n + j], where i + n + j >= len continuing from the draft itself (d_j = d_{j-p},
 * p = len - i - n): a text that repeats a period of p tokens is drafted k tokens ahead, not
 * only p. Returns the tokens written to draft (0 without a match: then *n_match = *extent =
 * 0), sets *n_match to the matched n and *extent to the winner's extent. */
int sd_lookup_draft(int32_t *draft, int *n_match, int *extent, const int32_t *h, int len,
                    int max_ngram, int min_ngram, int k);

struct sd_lookup_history;

/* sd_lookup_draft, or, where that matches by one token or not at all and the history hs (NULL:
 * none; spec/drafters/lookup_history.h) has a match of two or more, the history's draft of up to
 * k tokens (then *from_history = 1 and *n_match, *extent are the text's own). Returns the
 * draft's length. */
int sd_lookup_draft_or_history(int32_t *draft, int *n_match, int *extent, int *from_history,
                               const int32_t *h, int len, int max_ngram, int min_ngram, int k,
                               struct sd_lookup_history *hs);

/* Up to b drafts of up to k tokens each, for sibling branches of a tree: draft 0 is
 * sd_lookup_draft's; each next one follows the best remaining occurrence (the larger n, then the
 * longer extent, then the later) whose continuation starts with a token no earlier draft starts
 * with, so the branches differ from their first token on. draft is (b, k); lens[j] receives
 * draft j's length (k each); returns the number of drafts (0 without a match), and sets
 * *n_match and *extent as sd_lookup_draft does for draft 0. */
int sd_lookup_branches(int32_t *draft, int *lens, int *n_match, int *extent, const int32_t *h,
                       int len, int max_ngram, int min_ngram, int k, int b);

/* The acceptance of lookup drafts is counted apart by kind of match (a bucket): a long match
 * predicts the continuation far better than a one-token one, and one that extends
 * SD_LOOKUP_LONG or SD_LOOKUP_LONG_MAX tokens back (the text repeats itself: a list, a loop)
 * better still. Buckets 0 .. max_ngram + 2. */
#define SD_LOOKUP_LONG 16
#define SD_LOOKUP_LONG_MAX 32
int sd_lookup_bucket(int n_match, int extent, int max_ngram);

/* The chance that a draft token of `bucket` is accepted, from its counts there: accepted tokens
 * and rejected drafts, the trials of a geometric acceptance (the tokens after a rejected one are
 * never tested). Beta(1, 1)-smoothed, so 0.5 before any; a repeating text's buckets start from
 * the prior of a long run of accepted tokens. The prior's weight is returned in *prior. */
double sd_lookup_rate(double accepted, double rejected, int bucket, int max_ngram, double *prior);

/* Prompt lookup beside another drafter (EAGLE's head, Token Recycling's table): n-grams of up
 * to SD_LOOKUP_SIDE_NGRAM tokens, and the acceptance of its drafts counted by kind of match
 * over a request, drafts from a history of earlier requests apart (bucket
 * SD_LOOKUP_SIDE_HISTORY). Zeroed: no counts yet. */
#define SD_LOOKUP_SIDE_NGRAM 4
#define SD_LOOKUP_SIDE_HISTORY (SD_LOOKUP_SIDE_NGRAM + 3)
typedef struct {
    double acc[SD_LOOKUP_SIDE_HISTORY + 1], rej[SD_LOOKUP_SIDE_HISTORY + 1];
} sd_lookup_side;

/* sd_lookup_draft's draft of up to k tokens after h[0 .. len) (n-grams of 1 to
 * SD_LOOKUP_SIDE_NGRAM), or, where that matches by one token or not at all and hs (NULL: none)
 * has a match, the history's draft (spec/drafters/lookup_history.h); returns its length (0
 * without a match) and sets *bucket to its kind of match and *rate to the chance a draft token
 * of that kind is accepted (sd_lookup_rate; a history draft's without a prior). */
int sd_lookup_side_draft(const sd_lookup_side *s, struct sd_lookup_history *hs, int32_t *draft,
                         const int32_t *h, int len, int k, int *bucket, double *rate);
/* A verified draft of `bucket`: `drafted` tokens, the first `accepted` kept (a run of accepted
 * tokens, then one rejected unless all were). */
void sd_lookup_side_count(sd_lookup_side *s, int bucket, int accepted, int drafted);

#endif /* SD_LOOKUP_H */
