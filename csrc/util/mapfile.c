/* mapfile.c — mmap a file read-only (POSIX). An empty file maps to size 0 without a mapping.
 * Also the memory a forward streams through (repacked weights, KV caches), on huge pages where
 * the OS gives them. */
#include "util/mapfile.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/status.h"

sd_status sd_map_file(sd_mapping *out, const char *path) {
    out->data = NULL;
    out->size = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        return sd_set_error(SD_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return sd_set_error(SD_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return sd_set_error(SD_ERR_IO, "'%s' is a directory, expected a file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return SD_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        return sd_set_error(SD_ERR_IO, "cannot map '%s': %s", path, strerror(e));
    }
    out->data = (const unsigned char *)p;
    out->size = (size_t)st.st_size;
    return SD_OK;
}

void sd_map_release(const void *p, size_t len) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) / page * page;
    uintptr_t b = ((uintptr_t)p + len) / page * page;
    if (b > a) {
        madvise((void *)a, b - a, MADV_DONTNEED);
    }
}

#define SD_HUGE_PAGE ((size_t)2 << 20)
#define SD_HUGE_FROM ((size_t)4 << 20) /* smaller zeroed blocks: calloc, no whole huge page */

static size_t huge_pages_of(size_t bytes) {
    return (bytes + SD_HUGE_PAGE - 1) / SD_HUGE_PAGE * SD_HUGE_PAGE;
}

void *sd_alloc_streamed(size_t bytes) {
    const size_t size = huge_pages_of(bytes);
    void *p = NULL;
    if (size == 0 || posix_memalign(&p, SD_HUGE_PAGE, size) != 0) {
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    madvise(p, size, MADV_HUGEPAGE); /* advice: without huge pages it works as well */
#endif
    return p;
}

void *sd_alloc_zeroed(size_t bytes) {
    if (bytes < SD_HUGE_FROM) {
        return calloc(1, bytes > 0 ? bytes : 1);
    }
    const size_t size = huge_pages_of(bytes);
    /* map one huge page more than needed and unmap the ends around the aligned part (the tail
     * is never empty: the aligned start lies less than a huge page past the mapping's) */
    unsigned char *raw =
        mmap(NULL, size + SD_HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        return NULL;
    }
    unsigned char *p = (unsigned char *)huge_pages_of((uintptr_t)raw);
    if (p > raw) {
        munmap(raw, (size_t)(p - raw));
    }
    munmap(p + size, (size_t)(raw + SD_HUGE_PAGE - p));
#ifdef MADV_HUGEPAGE
    madvise(p, size, MADV_HUGEPAGE);
#endif
    return p;
}

void sd_free_zeroed(void *p, size_t bytes) {
    if (p == NULL) {
        return;
    }
    if (bytes < SD_HUGE_FROM) {
        free(p);
        return;
    }
    munmap(p, huge_pages_of(bytes));
}

void sd_unmap_file(sd_mapping *m) {
    if (m->data != NULL) {
        munmap((void *)m->data, m->size);
    }
    m->data = NULL;
    m->size = 0;
}
