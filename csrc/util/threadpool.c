/* threadpool.c — a small fork-join pool for the forward pass.
 *
 * A decode step issues hundreds of short parallel ops, so workers spin briefly on the job word
 * before sleeping on a condition variable. Pieces are claimed with a compare-and-swap on one
 * 64-bit word holding (generation << 32 | next piece): a worker can only claim pieces of the
 * job it saw published, and the caller waits for the pieces to be *done*, not for every worker
 * to check in, so a worker the OS has descheduled (a busy or shared machine) costs at most the
 * pieces it already claimed. */
#include "util/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "util/status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SD_CPU_RELAX() _mm_pause()
#else
#define SD_CPU_RELAX() ((void)0)
#endif

#define SD_SPIN_IDLE 20000 /* pauses a worker spins on an idle pool before sleeping */
#define SD_SPIN_WAIT 2000  /* pauses the caller spins on unfinished pieces before yielding */

typedef struct {
    sd_threadpool *pool;
    int index;
    pthread_t thread;
} sd_worker;

struct sd_threadpool {
    int n_threads;
    sd_worker *workers; /* (n_threads - 1) */
    pthread_mutex_t mutex;
    pthread_cond_t wake;
    int sleeping; /* workers waiting on `wake` (under mutex) */
    int quit;     /* atomic */
    /* the job; written before `work` publishes a new generation */
    sd_task_fn fn;
    void *ctx;
    int n_tasks;
    uint64_t work; /* atomic: generation << 32 | next piece to claim */
    int done;      /* atomic: pieces finished in this generation */
};

/* Claim and run pieces of generation `gen` until none is left or the job changed. */
static void run_pieces(sd_threadpool *p, uint64_t gen, int thread) {
    for (;;) {
        uint64_t w = __atomic_load_n(&p->work, __ATOMIC_ACQUIRE);
        if ((w >> 32) != gen) {
            return;
        }
        /* valid as long as the generation is: the caller rewrites the job only after every
         * piece of this one is done, and the piece we are about to claim is not */
        sd_task_fn fn = p->fn;
        void *ctx = p->ctx;
        int n = p->n_tasks;
        const uint32_t t = (uint32_t)(w & 0xffffffffu); /* UINT32_MAX: a closed generation */
        if (n <= 0 || t >= (uint32_t)n) {
            return;
        }
        if (__atomic_compare_exchange_n(&p->work, &w, w + 1, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            fn(ctx, (int)t, thread);
            __atomic_fetch_add(&p->done, 1, __ATOMIC_RELEASE);
        }
    }
}

static void *worker_main(void *arg) {
    sd_worker *me = (sd_worker *)arg;
    sd_threadpool *p = me->pool;
    uint64_t seen = __atomic_load_n(&p->work, __ATOMIC_ACQUIRE) >> 32;
    for (;;) {
        uint64_t gen = __atomic_load_n(&p->work, __ATOMIC_ACQUIRE) >> 32;
        for (int spins = 0; gen == seen && spins < SD_SPIN_IDLE; spins++) {
            SD_CPU_RELAX();
            gen = __atomic_load_n(&p->work, __ATOMIC_ACQUIRE) >> 32;
        }
        if (gen == seen) {
            pthread_mutex_lock(&p->mutex);
            p->sleeping++;
            while ((gen = __atomic_load_n(&p->work, __ATOMIC_ACQUIRE) >> 32) == seen &&
                   !__atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) {
                pthread_cond_wait(&p->wake, &p->mutex);
            }
            p->sleeping--;
            pthread_mutex_unlock(&p->mutex);
        }
        if (__atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) {
            return NULL;
        }
        seen = gen;
        run_pieces(p, gen, me->index);
    }
}

int sd_available_cpus(void) {
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) {
            return n;
        }
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

sd_status sd_threadpool_check(int n_threads) {
    if (n_threads < 1 || n_threads > 1024) {
        return sd_set_error(SD_ERR_INVALID_ARG, "threads must be in [1, 1024], got %d", n_threads);
    }
    return SD_OK;
}

sd_status sd_threadpool_create(sd_threadpool **out, int n_threads) {
    *out = NULL;
    SD_TRY(sd_threadpool_check(n_threads));
    sd_threadpool *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory creating a thread pool");
    }
    p->n_threads = 1;
    pthread_mutex_init(&p->mutex, NULL);
    pthread_cond_init(&p->wake, NULL);
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof(sd_worker));
        if (p->workers == NULL) {
            sd_threadpool_free(p);
            return sd_set_error(SD_ERR_NOMEM, "out of memory creating a thread pool");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        sd_worker *w = &p->workers[i - 1];
        w->pool = p;
        w->index = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            sd_threadpool_free(p);
            return sd_set_error(SD_ERR_IO, "could not start worker thread %d of %d", i, n_threads);
        }
        p->n_threads = i + 1;
    }
    *out = p;
    return SD_OK;
}

void sd_threadpool_free(sd_threadpool *p) {
    if (p == NULL) {
        return;
    }
    pthread_mutex_lock(&p->mutex);
    __atomic_store_n(&p->quit, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mutex);
    for (int i = 1; i < p->n_threads; i++) {
        pthread_join(p->workers[i - 1].thread, NULL);
    }
    pthread_mutex_destroy(&p->mutex);
    pthread_cond_destroy(&p->wake);
    free(p->workers);
    free(p);
}

int sd_threadpool_size(const sd_threadpool *p) {
    return p->n_threads;
}

void sd_threadpool_run(sd_threadpool *p, sd_task_fn fn, void *ctx, int n_tasks) {
    if (n_tasks <= 0) {
        return;
    }
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) {
            fn(ctx, t, 0);
        }
        return;
    }
    /* Close the previous generation before rewriting the job: a worker that loaded its word
     * (all pieces claimed) and then read this job's n_tasks would otherwise win its
     * compare-and-swap on the old word and run a piece of the new job outside its generation,
     * with a stale fn/ctx pair, counting it in `done`. The closing word has its own generation
     * (no piece can be claimed: next = UINT32_MAX), so workers that see it still wake for the
     * job published below. */
    const uint64_t closed = ((__atomic_load_n(&p->work, __ATOMIC_RELAXED) >> 32) + 1) & 0xffffffffu;
    __atomic_store_n(&p->work, (closed << 32) | 0xffffffffu, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    const uint64_t gen = (closed + 1) & 0xffffffffu;
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    __atomic_store_n(&p->done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&p->work, gen << 32, __ATOMIC_RELEASE);
    /* wake sleepers; the mutex pairs with their check-then-wait */
    pthread_mutex_lock(&p->mutex);
    if (p->sleeping > 0) {
        pthread_cond_broadcast(&p->wake);
    }
    pthread_mutex_unlock(&p->mutex);
    run_pieces(p, gen, 0);
    for (int spins = 0; __atomic_load_n(&p->done, __ATOMIC_ACQUIRE) < n_tasks; spins++) {
        if (spins < SD_SPIN_WAIT) {
            SD_CPU_RELAX();
        } else {
            sched_yield(); /* a descheduled worker holds a piece: let it run */
        }
    }
}

/* ---- self-check ------------------------------------------------------------------------------ */

typedef struct {
    int id;        /* run index, checked by every piece */
    int n;         /* pieces of this run */
    int *counts;   /* (n) times each piece ran */
    int *late;     /* pieces that ran after their run returned, or with a foreign context */
    int *finished; /* set once sd_threadpool_run has returned for this run */
} selftest_job;

static void selftest_piece(void *ctx, int task, int thread) {
    (void)thread;
    selftest_job *j = ctx;
    if (task < 0 || task >= j->n || __atomic_load_n(j->finished, __ATOMIC_ACQUIRE)) {
        __atomic_fetch_add(j->late, 1, __ATOMIC_RELAXED);
        return;
    }
    __atomic_fetch_add(&j->counts[task], 1, __ATOMIC_RELAXED);
}

sd_status sd_threadpool_selftest(int n_threads, int n_runs) {
    if (n_threads < 1 || n_threads > 64 || n_runs < 1) {
        return sd_set_error(SD_ERR_INVALID_ARG, "threads in [1, 64] and runs >= 1, got %d and %d",
                            n_threads, n_runs);
    }
    enum { MAX_PIECES = 9 };
    /* every run keeps its own context, so a stale piece lands in valid memory and is counted */
    selftest_job *jobs = calloc((size_t)n_runs, sizeof(*jobs));
    int *counts = calloc((size_t)n_runs * MAX_PIECES, sizeof(int));
    int *finished = calloc((size_t)n_runs, sizeof(int));
    int late = 0;
    sd_threadpool *pool = NULL;
    sd_status st = SD_OK;
    if (jobs == NULL || counts == NULL || finished == NULL) {
        st = sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    if (st == SD_OK) {
        st = sd_threadpool_create(&pool, n_threads);
    }
    for (int r = 0; st == SD_OK && r < n_runs; r++) {
        selftest_job *j = &jobs[r];
        j->id = r;
        j->n = 1 + (r * 7) % MAX_PIECES; /* piece counts that change from run to run */
        j->counts = counts + (size_t)r * MAX_PIECES;
        j->late = &late;
        j->finished = &finished[r];
        sd_threadpool_run(pool, selftest_piece, j, j->n);
        __atomic_store_n(j->finished, 1, __ATOMIC_RELEASE);
        for (int t = 0; t < j->n; t++) {
            if (__atomic_load_n(&j->counts[t], __ATOMIC_ACQUIRE) != 1) {
                st = sd_set_error(SD_ERR_INTERNAL,
                                  "thread pool: run %d piece %d of %d ran %d times before the run "
                                  "returned",
                                  r, t, j->n, j->counts[t]);
                break;
            }
        }
    }
    sd_threadpool_free(pool); /* joins the workers: every piece has finished */
    if (st == SD_OK && late > 0) {
        st = sd_set_error(SD_ERR_INTERNAL,
                          "thread pool: %d pieces ran outside their run (after it returned or "
                          "past its piece count)",
                          late);
    }
    free(jobs);
    free(counts);
    free(finished);
    return st;
}
