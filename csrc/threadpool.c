/* threadpool.c — a small fork-join pool: workers spin briefly on a generation counter (a decode
 * step issues hundreds of short ops, so waking through a condition variable each time would
 * cost more than the ops) and then sleep on a condition variable when idle. */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SD_CPU_RELAX() _mm_pause()
#else
#define SD_CPU_RELAX() ((void)0)
#endif

#define SD_SPIN_ITERS 20000

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
    /* job, published by bumping `generation` */
    sd_task_fn fn;
    void *ctx;
    int n_tasks;
    int next_task;       /* atomic: next piece to claim */
    int finished;        /* atomic: workers done with the current job (the caller excluded) */
    unsigned generation; /* atomic */
    int quit;
};

static void run_tasks(sd_threadpool *p, int thread) {
    for (;;) {
        int t = __atomic_fetch_add(&p->next_task, 1, __ATOMIC_RELAXED);
        if (t >= p->n_tasks) {
            break;
        }
        p->fn(p->ctx, t, thread);
    }
}

static void *worker_main(void *arg) {
    sd_worker *w = (sd_worker *)arg;
    sd_threadpool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned gen = __atomic_load_n(&p->generation, __ATOMIC_ACQUIRE);
        int spins = 0;
        while (gen == seen && spins < SD_SPIN_ITERS) {
            SD_CPU_RELAX();
            spins++;
            gen = __atomic_load_n(&p->generation, __ATOMIC_ACQUIRE);
        }
        if (gen == seen) {
            pthread_mutex_lock(&p->mutex);
            while ((gen = __atomic_load_n(&p->generation, __ATOMIC_ACQUIRE)) == seen && !p->quit) {
                pthread_cond_wait(&p->wake, &p->mutex);
            }
            pthread_mutex_unlock(&p->mutex);
        }
        if (__atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) {
            break;
        }
        seen = gen;
        run_tasks(p, w->index);
        /* The caller waits for every worker, so no worker can still be claiming pieces of
         * this job when the next one is published. */
        __atomic_fetch_add(&p->finished, 1, __ATOMIC_RELEASE);
    }
    return NULL;
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

sd_status sd_threadpool_create(sd_threadpool **out, int n_threads) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024) {
        return sd_set_error(SD_ERR_INVALID_ARG, "threads must be in [1, 1024], got %d", n_threads);
    }
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
    __atomic_fetch_add(&p->generation, 1, __ATOMIC_RELEASE);
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
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    __atomic_store_n(&p->next_task, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&p->finished, 0, __ATOMIC_RELAXED);
    /* Publish the job; the lock pairs with sleepers' check-then-wait. */
    pthread_mutex_lock(&p->mutex);
    __atomic_fetch_add(&p->generation, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mutex);
    run_tasks(p, 0);
    while (__atomic_load_n(&p->finished, __ATOMIC_ACQUIRE) < p->n_threads - 1) {
        SD_CPU_RELAX();
    }
}
