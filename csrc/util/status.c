/* status.c — per-thread error messages behind sd_status.
 * A failing call records "what went wrong" here; the Python boundary (or any C caller) reads it
 * with sd_last_error() right after the failing call returns. */
#include "util/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* One message per thread: the forward pass and the Python boundary may run on different
 * threads of a serving process. */
static __thread char g_errmsg[SD_ERRMSG_CAP];

sd_status sd_set_error(sd_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_errmsg, sizeof(g_errmsg), fmt, ap);
    va_end(ap);
    return st;
}

sd_status sd_error_prefix(sd_status st, const char *fmt, ...) {
    char prefix[512];
    char old[SD_ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    memcpy(old, g_errmsg, sizeof(old));
    snprintf(g_errmsg, sizeof(g_errmsg), "%.500s: %.520s", prefix, old);
    return st;
}

const char *sd_last_error(void) {
    return g_errmsg;
}

void sd_clear_error(void) {
    g_errmsg[0] = '\0';
}

const char *sd_status_name(sd_status st) {
    switch (st) {
    case SD_OK: return "SD_OK";
    case SD_ERR_INVALID_ARG: return "SD_ERR_INVALID_ARG";
    case SD_ERR_FORMAT: return "SD_ERR_FORMAT";
    case SD_ERR_UNSUPPORTED: return "SD_ERR_UNSUPPORTED";
    case SD_ERR_IO: return "SD_ERR_IO";
    case SD_ERR_NOMEM: return "SD_ERR_NOMEM";
    case SD_ERR_INTERNAL: return "SD_ERR_INTERNAL";
    case SD_ERR_CUDA: return "SD_ERR_CUDA";
    case SD_ERR_NUMERIC: return "SD_ERR_NUMERIC";
    }
    return "SD_ERR_UNKNOWN";
}
