/* clock.h — seconds on a monotonic clock, for every layer that times something (the scheduler's
 * waits, the decoding loops' statistics, the benchmarks). */
#ifndef SD_CLOCK_H
#define SD_CLOCK_H

#include <time.h>

static inline double sd_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif /* SD_CLOCK_H */
