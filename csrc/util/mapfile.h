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

#endif /* SD_MAPFILE_H */
