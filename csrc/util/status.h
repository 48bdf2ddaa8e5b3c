/* status.h — internal error plumbing: record a message with the failing status, never exit.
 * Every fallible function returns sd_status; the message of the most recent failure on the
 * calling thread is available through sd_last_error(). */
#ifndef SD_STATUS_H
#define SD_STATUS_H

#include "specdec.h"

/* The longest message kept (with its terminating zero). */
#define SD_ERRMSG_CAP 1024

/* Record a printf-style message for status `st` on this thread and return `st`. */
sd_status sd_set_error(sd_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Prepend "prefix: " to the message already recorded on this thread (adds context on the way
 * up, e.g. the file name) and return `st` unchanged. */
sd_status sd_error_prefix(sd_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Evaluate a call returning sd_status; return its status from the enclosing function on failure. */
#define SD_TRY(expr)                                                                               \
    do {                                                                                           \
        sd_status sd_try_st_ = (expr);                                                             \
        if (sd_try_st_ != SD_OK) {                                                                 \
            return sd_try_st_;                                                                     \
        }                                                                                          \
    } while (0)

/* Evaluate a call; on failure store its status in `st` and jump to `label` (cleanup path). */
#define SD_TRY_GOTO(st, expr, label)                                                               \
    do {                                                                                           \
        (st) = (expr);                                                                             \
        if ((st) != SD_OK) {                                                                       \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#endif /* SD_STATUS_H */
