/* zip.h — ZIP archives of stored entries, as views into a file mapping (PyTorch checkpoints are
 * such archives). The end of central directory record is found in the file's last 64 KiB, with
 * the ZIP64 end record its locator points at when there is one (PyTorch always writes it);
 * central-directory entries may carry ZIP64 sizes and offsets in their extra field. Every entry
 * must be stored (not compressed), not encrypted, with a local header naming it, its data inside
 * the file before the central directory, apart from every other entry's, under a name no other
 * entry has; anything else is SD_ERR_FORMAT (SD_ERR_UNSUPPORTED for compression, encryption
 * and multi-disk archives) with a message naming the entry. */
#ifndef SD_ZIP_H
#define SD_ZIP_H

#include <stddef.h>
#include <stdint.h>

#include "specdec.h"
#include "util/mapfile.h"

typedef struct {
    const char *name; /* (name_len) bytes of the mapping, not NUL-terminated */
    size_t name_len;
    uint64_t header_ofs; /* its local header, from the start of the mapping */
    uint64_t data_ofs;   /* its (size) bytes, from the start of the mapping */
    uint64_t size;
} sd_zip_entry;

typedef struct {
    sd_zip_entry *entries; /* (n), in central-directory order */
    size_t n;
    const sd_zip_entry **by_name; /* (n), sorted by name */
} sd_zip;

/* Read and check the archive in `m`, which must outlive z. */
sd_status sd_zip_open(sd_zip *z, const sd_mapping *m);
void sd_zip_close(sd_zip *z);
/* The entry named by the (len) bytes at `name`, or NULL. */
const sd_zip_entry *sd_zip_find(const sd_zip *z, const char *name, size_t len);
/* A name from a file, fit for a message: non-printable bytes as '?', cut at 80 bytes. */
const char *sd_zip_show(char *buf, size_t cap, const char *s, size_t n);

/* Little-endian reads (the caller has checked the bounds). */
static inline uint32_t sd_le16(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}
static inline uint32_t sd_le32(const unsigned char *p) {
    return sd_le16(p) | sd_le16(p + 2) << 16;
}
static inline uint64_t sd_le64(const unsigned char *p) {
    return sd_le32(p) | (uint64_t)sd_le32(p + 4) << 32;
}

#endif /* SD_ZIP_H */
