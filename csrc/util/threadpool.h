/* threadpool.h — the CPU worker pool behind every parallel op of the forward pass.
 * The calling thread takes part as worker 0; tasks are claimed from a shared counter, so an op
 * splits its work into n_tasks pieces and never needs to know how many threads run them. */
#ifndef SD_THREADPOOL_H
#define SD_THREADPOOL_H

#include "specdec.h"

typedef struct sd_threadpool sd_threadpool;

/* fn(ctx, task, thread): run piece `task` (0 <= task < n_tasks) on worker `thread`
 * (0 <= thread < n_threads, stable within one run, usable to index per-thread scratch). */
typedef void (*sd_task_fn)(void *ctx, int task, int thread);

/* SD_ERR_INVALID_ARG unless 1 <= n_threads <= 1024: the one check of a thread count. */
sd_status sd_threadpool_check(int n_threads);
/* A pool of n_threads workers, the caller counted: n_threads - 1 threads are started. */
sd_status sd_threadpool_create(sd_threadpool **out, int n_threads);
void sd_threadpool_free(sd_threadpool *pool);
int sd_threadpool_size(const sd_threadpool *pool);
/* Run fn over n_tasks pieces and return when all are done. Not reentrant. */
void sd_threadpool_run(sd_threadpool *pool, sd_task_fn fn, void *ctx, int n_tasks);
/* Runs n_runs jobs of changing piece counts on a fresh pool of n_threads and checks that every
 * piece of every run ran exactly once, within its run: SD_ERR_INTERNAL names the first
 * violation. A test of the claiming protocol (exposed to Python as _core.threadpool_selftest). */
sd_status sd_threadpool_selftest(int n_threads, int n_runs);
/* Number of CPUs this process may run on (affinity mask), at least 1. */
int sd_available_cpus(void);

#endif /* SD_THREADPOOL_H */
