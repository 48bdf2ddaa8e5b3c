/* mapfile.h — read-only memory mappings of model files; weights are views into them. */
#ifndef SD_MAPFILE_H
#define SD_MAPFILE_H

#include <stddef.h>

#include "specdec.h"

typedef struct {
    const unsigned char *data; /* (size) bytes, read-only */
    size_t size;
} sd_mapping;

/* Map the whole of `path` read-only. A missing file is SD_ERR_IO with the path and strerror. */
sd_status sd_map_file(sd_mapping *out, const char *path);
void sd_unmap_file(sd_mapping *m);
/* Tell the OS this process no longer needs the pages wholly inside [p, p + len) of a mapping
 * (they stay in the page cache and fault back in if read again). */
void sd_map_release(const void *p, size_t len);
/* Memory for weights a forward streams through every token (the repacked copies): aligned to
 * 2 MiB and, where the OS offers it, backed by huge pages, so streaming it takes one TLB entry
 * per 2 MiB instead of one per 4 KiB. NULL when out of memory; free with free(). */
void *sd_alloc_streamed(size_t bytes);
/* Zeroed memory for data a forward streams and that grows as it is written (a KV cache): from
 * 4 MiB on, anonymous pages aligned to 2 MiB and advised huge, zeroed by the OS as they are first
 * touched; smaller, calloc. NULL when out of memory. Free with sd_free_zeroed(p, bytes), the
 * same bytes. */
void *sd_alloc_zeroed(size_t bytes);
void sd_free_zeroed(void *p, size_t bytes);

#endif /* SD_MAPFILE_H */
