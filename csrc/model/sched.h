/* sched.h — the model's step scheduler: the steps of all the requests running on one model go
 * through it, and it puts the forwards of the steps that are ready at the same time into one
 * forward (sd_forward_multi), so the weights are read once per step for all of them
 * (continuous batching: requests join and leave between steps).
 *
 * A thread with a step to run hands it over (sd_sched_run) and waits. When no step is running,
 * the thread that finds it so leads: it waits a moment for the steps of the other running
 * requests, as many as its last round had and those begun since (about a quarter of the last
 * forward's time, within SD_SCHED_WAIT_MIN_S .. SD_SCHED_WAIT_MAX_S, and less after a request
 * failed to come), then runs, one request after the other, the part of every step before its
 * forward (its drafting), one forward for all of them, and the part after it (accept, commit,
 * emit). Every step's work is thus done by one thread at a time, as when each request runs alone,
 * and a request's bits are its own (the forward's rows are batch-invariant). The scheduler knows
 * nothing of requests: a step is two callbacks. */
#ifndef SD_SCHED_H
#define SD_SCHED_H

#include "specdec.h"
#include "util/status.h"

/* The longest a leader waits for the other requests' steps, and the least it is allowed to while
 * they all come in time (long enough for a Python thread to come back for its next step). */
#define SD_SCHED_WAIT_MAX_S 0.004
#define SD_SCHED_WAIT_MIN_S 0.0003
/* The most tokens in one combined forward (the steps beyond it go into the next one). */
#define SD_SCHED_MAX_TOKENS 1024

typedef struct sd_sched sd_sched;

/* One request's batch in a forward: its cache, its batch, and where its n_logits rows of logits
 * go (forward.h's sd_forward_multi runs several at once). */
typedef struct {
    sd_kv_cache *kv;
    sd_batch b;
    float *logits;
    /* set by the scheduler after the forward: its seconds and all its tokens */
    double seconds;
    int n_all;
    /* set by the CPU forward: 1 + the first of the n_logits rows whose hidden state before the
     * final norm is not finite (a NaN or an infinity, or a sum of squares that overflows, which
     * the norm turns into zeros), 0 when all are (sd_fwd_finite); a CUDA model's rows are not
     * checked */
    int nonfinite;
} sd_fwd;

/* SD_OK, or SD_ERR_NUMERIC naming the row and its token when the forward of f found a hidden
 * state that is not finite: the loader refuses NaN and infinite weights, but finite ones can
 * still overflow (a corrupt or wrongly scaled file). Its logits mean nothing then (argmax and
 * sampling would still pick a token), so no caller goes on with them. */
sd_status sd_fwd_finite(const sd_fwd *f);

/* How the scheduler runs a combined forward: sd_forward_multi (given by the caller, as the
 * forward lies above the scheduler). */
typedef sd_status (*sd_forward_fn)(sd_model *m, sd_fwd *jobs, int n);

/* One step of one request. */
typedef struct sd_sched_job {
    /* the caller's: the work before the forward, which fills f (f->b.n_tokens = 0: the step needs
     * no forward, or did its own); the work after it, given the forward's status (SD_OK when
     * there was none; called only when before succeeded). Run by whichever thread leads; errors
     * are recorded with the job. */
    sd_status (*before)(void *ctx, sd_fwd *f);
    sd_status (*after)(void *ctx, const sd_fwd *f, sd_status forward);
    void *ctx;
    /* the scheduler's */
    struct sd_sched_job *next;
    sd_fwd f;
    sd_status forward; /* the forward's status */
    sd_status st;      /* the step's: the first failure of before, the forward or after */
    int done;
    char msg[SD_ERRMSG_CAP];
} sd_sched_job;

sd_status sd_sched_create(sd_sched **out);
void sd_sched_free(sd_sched *s);

/* A request begins or ends: the leader waits for the steps of the requests that have begun and
 * not ended. */
void sd_sched_join(sd_sched *s);
void sd_sched_leave(sd_sched *s);

/* Runs job's step (in this thread or another) and returns once it is done, with its status and,
 * on failure, its message recorded on this thread. */
sd_status sd_sched_run(sd_sched *s, sd_model *m, sd_forward_fn forward, sd_sched_job *job);

/* Statistics: forwards run and the steps that went into them. */
void sd_sched_counts(sd_sched *s, long long *forwards, long long *steps);

#endif /* SD_SCHED_H */
