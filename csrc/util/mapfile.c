/* mapfile.c — mmap a file read-only (POSIX). An empty file maps to size 0 without a mapping. */
#include "util/mapfile.h"

#include <errno.h>
#include <stdint.h>
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

void sd_unmap_file(sd_mapping *m) {
    if (m->data != NULL) {
        munmap((void *)m->data, m->size);
    }
    m->data = NULL;
    m->size = 0;
}
