/* sched.c — the model's step scheduler (sched.h): a leader thread gathers the steps that are
 * ready and runs them around one combined forward. */
#include "model/sched.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"

struct sd_sched {
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* a step was handed over, or a round ended (CLOCK_MONOTONIC) */
    sd_sched_job *head, *tail; /* the steps waiting for the next round */
    int n_queued;
    int active;      /* requests begun and not ended */
    int running;     /* a leader runs a round */
    int last_n;      /* the steps of the last round */
    int fresh;       /* requests begun since the last round began */
    double window_s; /* how long the next leader may wait for the others */
    long long forwards, steps;
};

sd_status sd_sched_create(sd_sched **out) {
    *out = NULL;
    sd_sched *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory for the step scheduler");
    }
    pthread_condattr_t ca;
    int ok = pthread_condattr_init(&ca) == 0;
    ok = ok && pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0;
    ok = ok && pthread_cond_init(&s->cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!ok || pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return sd_set_error(SD_ERR_INTERNAL, "could not create the step scheduler's lock");
    }
    s->window_s = SD_SCHED_WAIT_MAX_S;
    s->last_n = 0;
    *out = s;
    return SD_OK;
}

void sd_sched_free(sd_sched *s) {
    if (s != NULL) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
    }
}

void sd_sched_join(sd_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->active++;
    s->fresh++;
    pthread_mutex_unlock(&s->mu);
}

void sd_sched_leave(sd_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->active--;
    pthread_cond_broadcast(&s->cv); /* a leader may be waiting for this request's step */
    pthread_mutex_unlock(&s->mu);
}

void sd_sched_counts(sd_sched *s, long long *forwards, long long *steps) {
    pthread_mutex_lock(&s->mu);
    *forwards = s->forwards;
    *steps = s->steps;
    pthread_mutex_unlock(&s->mu);
}

static void record(sd_sched_job *j, sd_status st) {
    if (st != SD_OK && j->st == SD_OK) { /* the first failure is the step's */
        j->st = st;
        snprintf(j->msg, sizeof(j->msg), "%s", sd_last_error());
    }
}

sd_status sd_fwd_finite(const sd_fwd *f) {
    if (f->nonfinite == 0) {
        return SD_OK;
    }
    const int r = f->nonfinite - 1, t = f->b.n_tokens - f->b.n_logits + r;
    return sd_set_error(SD_ERR_NUMERIC,
                        "the model's hidden state is not finite (a NaN, an infinity, or a sum "
                        "of squares beyond the float range) at row %d of the batch (token id "
                        "%d), so its logits mean nothing: the model's arithmetic overflows (a "
                        "corrupt or wrongly converted file?)",
                        t, f->b.tokens != NULL ? (int)f->b.tokens[t] : -1);
}

/* One forward for the steps jobs[0 .. n) (fw: room for n batches), each step's forward status
 * into its job; a batch the combined forward refuses is run alone, so that one request's bad
 * batch fails that request only (a refused batch changes no cache). Returns its seconds. */
static double forward_group(sd_model *m, sd_forward_fn forward, sd_sched_job **jobs, int n,
                            sd_fwd *fw) {
    int total = 0;
    for (int i = 0; i < n; i++) {
        fw[i] = jobs[i]->f;
        total += fw[i].b.n_tokens;
    }
    const double t0 = sd_now_s();
    const sd_status st = forward(m, fw, n);
    for (int i = 0; i < n; i++) {
        jobs[i]->forward = st;
        if (st == SD_ERR_INVALID_ARG && n > 1) {
            jobs[i]->forward = forward(m, &fw[i], 1);
        }
        if (jobs[i]->forward == SD_OK) { /* a request whose rows are not finite fails alone */
            jobs[i]->forward = sd_fwd_finite(&fw[i]);
        }
        record(jobs[i], jobs[i]->forward);
    }
    const double dt = sd_now_s() - t0;
    for (int i = 0; i < n; i++) {
        jobs[i]->f.seconds = dt;
        jobs[i]->f.n_all = total;
    }
    return dt;
}

/* A round over the steps jobs[0 .. n) (want, fw: room for n): every step's work before its
 * forward, the forwards in groups of at most SD_SCHED_MAX_TOKENS tokens, every step's work
 * after. Returns the seconds of forward; counts the forwards. */
static double round_of(sd_model *m, sd_forward_fn forward, sd_sched_job **jobs, int n,
                       sd_sched_job **want, sd_fwd *fw, long long *forwards) {
    int nw = 0;
    for (int i = 0; i < n; i++) {
        sd_sched_job *j = jobs[i];
        memset(&j->f, 0, sizeof(j->f));
        j->forward = SD_OK;
        record(j, j->before(j->ctx, &j->f));
        if (j->st == SD_OK && j->f.b.n_tokens > 0) {
            want[nw++] = j;
        }
    }
    double spent = 0.0;
    for (int i = 0; i < nw;) {
        int e = i + 1, tokens = want[i]->f.b.n_tokens;
        while (e < nw && tokens + want[e]->f.b.n_tokens <= SD_SCHED_MAX_TOKENS) {
            tokens += want[e++]->f.b.n_tokens;
        }
        spent += forward_group(m, forward, want + i, e - i, fw);
        (*forwards)++;
        i = e;
    }
    for (int i = 0; i < n; i++) { /* after: each step whose before went well */
        sd_sched_job *j = jobs[i];
        if (j->st == SD_OK || j->forward != SD_OK) {
            record(j, j->after(j->ctx, &j->f, j->forward));
        }
    }
    return spent;
}

/* A leader's round over the steps in `list` (n of them); without memory for its arrays, one
 * step at a time. */
static double run_round(sd_model *m, sd_forward_fn forward, sd_sched_job *list, int n,
                        long long *forwards) {
    sd_sched_job **jobs = malloc((size_t)n * 2 * sizeof(*jobs));
    sd_fwd *fw = malloc((size_t)n * sizeof(*fw));
    double spent = 0.0;
    if (jobs != NULL && fw != NULL) {
        int i = 0;
        for (sd_sched_job *j = list; j != NULL; j = j->next) {
            jobs[i++] = j;
        }
        spent = round_of(m, forward, jobs, n, jobs + n, fw, forwards);
    } else {
        for (sd_sched_job *j = list; j != NULL; j = j->next) {
            sd_sched_job *one[2] = {j, NULL};
            sd_fwd f1;
            spent += round_of(m, forward, one, 1, one + 1, &f1, forwards);
        }
    }
    free(jobs);
    free(fw);
    return spent;
}

sd_status sd_sched_run(sd_sched *s, sd_model *m, sd_forward_fn forward, sd_sched_job *job) {
    job->next = NULL;
    job->done = 0;
    job->st = SD_OK;
    job->msg[0] = '\0';
    pthread_mutex_lock(&s->mu);
    if (s->tail != NULL) {
        s->tail->next = job;
    } else {
        s->head = job;
    }
    s->tail = job;
    s->n_queued++;
    pthread_cond_broadcast(&s->cv); /* a gathering leader counts it */
    while (!job->done) {
        if (s->running) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        /* lead: wait a moment for the steps of the other running requests: as many as the last
         * round had, and those begun since (a request whose caller steps it rarely is not
         * waited for every time) */
        s->running = 1;
        const double deadline = sd_now_s() + s->window_s;
        const int regular = s->last_n + s->fresh;
        const int expect = s->active < regular ? s->active : regular;
        while (s->n_queued < expect) {
            const double left = deadline - sd_now_s();
            if (left <= 0.0) {
                break;
            }
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            const long long ns = (long long)ts.tv_nsec + (long long)(left * 1e9);
            ts.tv_sec += (time_t)(ns / 1000000000LL);
            ts.tv_nsec = (long)(ns % 1000000000LL);
            (void)pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
        const int all_came = s->n_queued >= expect;
        sd_sched_job *list = s->head;
        const int n = s->n_queued;
        s->head = s->tail = NULL;
        s->n_queued = 0;
        s->fresh = 0;
        long long forwards = 0;
        pthread_mutex_unlock(&s->mu);
        const double spent = run_round(m, forward, list, n, &forwards);
        pthread_mutex_lock(&s->mu);
        /* the next wait: a quarter of this round's forward time (within SD_SCHED_WAIT_MIN_S ..
         * SD_SCHED_WAIT_MAX_S) while every request comes in time, halved after each time one
         * did not (a request whose caller steps it rarely, or not at all) */
        const double quarter = 0.25 * spent;
        s->window_s = !all_came                       ? 0.5 * s->window_s
                      : quarter > SD_SCHED_WAIT_MAX_S ? SD_SCHED_WAIT_MAX_S
                      : quarter < SD_SCHED_WAIT_MIN_S ? SD_SCHED_WAIT_MIN_S
                                                      : quarter;
        s->forwards += forwards;
        s->steps += n;
        s->last_n = n;
        for (sd_sched_job *j = list; j != NULL;) {
            sd_sched_job *next = j->next; /* j may be gone once done */
            j->done = 1;
            j = next;
        }
        s->running = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (job->st != SD_OK) {
        return sd_set_error(job->st, "%s", job->msg);
    }
    return SD_OK;
}
