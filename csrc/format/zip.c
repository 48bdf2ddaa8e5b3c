/* zip.c — ZIP archives of stored entries as views into a mapping: the end records (ZIP64
 * too), the central directory, and a check of every entry's local header and extent. */
#include "format/zip.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/status.h"

const char *sd_zip_show(char *buf, size_t cap, const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap && i < 80; i++) {
        const unsigned char c = (unsigned char)s[i];
        buf[k++] = c >= 32 && c < 127 ? (char)c : '?';
    }
    if (n > 80 && k + 4 < cap) {
        memcpy(buf + k, "...", 3);
        k += 3;
    }
    buf[k] = '\0';
    return buf;
}

static int cmp_name(const void *a, const void *b) {
    const sd_zip_entry *x = *(const sd_zip_entry *const *)a, *y = *(const sd_zip_entry *const *)b;
    const size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    const int c = memcmp(x->name, y->name, n);
    return c != 0 ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

static int cmp_ofs(const void *a, const void *b) {
    const sd_zip_entry *x = *(const sd_zip_entry *const *)a, *y = *(const sd_zip_entry *const *)b;
    return (x->header_ofs > y->header_ofs) - (x->header_ofs < y->header_ofs);
}

const sd_zip_entry *sd_zip_find(const sd_zip *z, const char *name, size_t len) {
    const sd_zip_entry key = {.name = name, .name_len = len};
    const sd_zip_entry *kp = &key;
    const sd_zip_entry **hit = bsearch(&kp, z->by_name, z->n, sizeof(*z->by_name), cmp_name);
    return hit != NULL ? *hit : NULL;
}

/* The end of central directory record (22 bytes and a comment of up to 65535), and the ZIP64
 * record a locator just before it points at: the count, size and offset of the directory. */
static sd_status zip_find_directory(const sd_mapping *m, uint64_t *n, uint64_t *cd_ofs,
                                    uint64_t *cd_size, uint64_t *cd_limit) {
    const unsigned char *d = m->data;
    const size_t size = m->size;
    size_t eocd = SIZE_MAX;
    for (size_t back = 0; size >= 22 && back <= 65535 && back <= size - 22; back++) {
        const size_t pos = size - 22 - back;
        if (sd_le32(d + pos) == 0x06054b50 && pos + 22 + sd_le16(d + pos + 20) <= size) {
            eocd = pos;
            break;
        }
    }
    if (eocd == SIZE_MAX) {
        return sd_set_error(SD_ERR_FORMAT, "no ZIP end of central directory record: the "
                                           "archive is truncated or not a ZIP file");
    }
    if (sd_le16(d + eocd + 4) != 0 || sd_le16(d + eocd + 6) != 0) {
        return sd_set_error(SD_ERR_UNSUPPORTED, "multi-disk ZIP archives are not supported");
    }
    *n = sd_le16(d + eocd + 10);
    *cd_size = sd_le32(d + eocd + 12);
    *cd_ofs = sd_le32(d + eocd + 16);
    *cd_limit = eocd;
    if (eocd >= 20 && sd_le32(d + eocd - 20) == 0x07064b50) {
        const size_t loc = eocd - 20;
        const uint64_t e64 = sd_le64(d + loc + 8);
        if (loc < 56 || e64 > loc - 56 || sd_le32(d + e64) != 0x06064b50) {
            return sd_set_error(SD_ERR_FORMAT, "the ZIP64 end of central directory locator "
                                               "points at no ZIP64 record (archive truncated?)");
        }
        if (sd_le32(d + e64 + 16) != 0 || sd_le32(d + e64 + 20) != 0) {
            return sd_set_error(SD_ERR_UNSUPPORTED, "multi-disk ZIP archives are not supported");
        }
        *n = sd_le64(d + e64 + 32);
        *cd_size = sd_le64(d + e64 + 40);
        *cd_ofs = sd_le64(d + e64 + 48);
        *cd_limit = e64;
    } else if (*n == 0xFFFF || *cd_size == 0xFFFFFFFFu || *cd_ofs == 0xFFFFFFFFu) {
        return sd_set_error(SD_ERR_FORMAT, "a ZIP64 archive without its ZIP64 end record "
                                           "(truncated?)");
    }
    if (*cd_ofs > *cd_limit || *cd_size > *cd_limit - *cd_ofs) {
        return sd_set_error(SD_ERR_FORMAT,
                            "the ZIP central directory [%llu, +%llu) lies outside the %zu-byte "
                            "file (truncated?)",
                            (unsigned long long)*cd_ofs, (unsigned long long)*cd_size, size);
    }
    if (*n > *cd_size / 46) {
        return sd_set_error(SD_ERR_FORMAT,
                            "a ZIP central directory of %llu bytes cannot hold %llu entries",
                            (unsigned long long)*cd_size, (unsigned long long)*n);
    }
    return SD_OK;
}

/* The ZIP64 extended information field (id 1) of a central header: 8-byte values for each of
 * size, compressed size and local header offset whose 4-byte field is 0xFFFFFFFF, in order. */
static int zip64_extra(const unsigned char *x, size_t xl, uint64_t *size, uint64_t *csize,
                       uint64_t *ofs) {
    for (size_t q = 0; q + 4 <= xl;) {
        const uint32_t id = sd_le16(x + q), len = sd_le16(x + q + 2);
        if (len > xl - q - 4) {
            return -1;
        }
        if (id == 1) {
            uint64_t *fields[3] = {size, csize, ofs};
            size_t r = q + 4;
            for (int f = 0; f < 3; f++) {
                if (*fields[f] == 0xFFFFFFFFu) {
                    if (r + 8 > q + 4 + len) {
                        return -1;
                    }
                    *fields[f] = sd_le64(x + r);
                    r += 8;
                }
            }
            return 0;
        }
        q += 4 + len;
    }
    return *size == 0xFFFFFFFFu || *csize == 0xFFFFFFFFu || *ofs == 0xFFFFFFFFu ? -1 : 0;
}

/* One central directory header at `p` (bounds of the directory checked here) into e. */
static sd_status entry_read(sd_zip_entry *e, const sd_mapping *m, uint64_t p, uint64_t cd_end,
                            uint64_t cd_ofs, uint64_t *next) {
    const unsigned char *d = m->data;
    char nb[96];
    if (cd_end - p < 46 || sd_le32(d + p) != 0x02014b50) {
        return sd_set_error(SD_ERR_FORMAT, "the ZIP central directory is corrupt at byte %llu",
                            (unsigned long long)p);
    }
    const uint32_t flags = sd_le16(d + p + 8), method = sd_le16(d + p + 10);
    uint64_t csize = sd_le32(d + p + 20), size = sd_le32(d + p + 24), ofs = sd_le32(d + p + 42);
    const size_t nl = sd_le16(d + p + 28), xl = sd_le16(d + p + 30), cl = sd_le16(d + p + 32);
    if (cd_end - p - 46 < nl + xl + cl) {
        return sd_set_error(SD_ERR_FORMAT, "the ZIP central directory is truncated at byte %llu",
                            (unsigned long long)p);
    }
    e->name = (const char *)d + p + 46;
    e->name_len = nl;
    sd_zip_show(nb, sizeof(nb), e->name, nl);
    if (zip64_extra(d + p + 46 + nl, xl, &size, &csize, &ofs) != 0) {
        return sd_set_error(SD_ERR_FORMAT, "ZIP entry '%s' has a malformed ZIP64 extra field", nb);
    }
    if (flags & 1u) {
        return sd_set_error(SD_ERR_UNSUPPORTED, "ZIP entry '%s' is encrypted", nb);
    }
    if (method != 0) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "ZIP entry '%s' is compressed (method %u%s); torch.save stores "
                            "entries uncompressed, and only stored entries can be mapped",
                            nb, (unsigned)method, method == 8 ? ", deflate" : "");
    }
    if (csize != size) {
        return sd_set_error(SD_ERR_FORMAT,
                            "stored ZIP entry '%s' has a compressed size (%llu) unlike its size "
                            "(%llu)",
                            nb, (unsigned long long)csize, (unsigned long long)size);
    }
    if (ofs > cd_ofs || cd_ofs - ofs < 30 || sd_le32(d + ofs) != 0x04034b50) {
        return sd_set_error(SD_ERR_FORMAT,
                            "ZIP entry '%s': no local header at byte %llu (out of range or "
                            "corrupt)",
                            nb, (unsigned long long)ofs);
    }
    const size_t lnl = sd_le16(d + ofs + 26), lxl = sd_le16(d + ofs + 28);
    const uint64_t data = ofs + 30 + lnl + lxl;
    if (data > cd_ofs || size > cd_ofs - data) {
        return sd_set_error(SD_ERR_FORMAT,
                            "ZIP entry '%s' (%llu bytes at byte %llu) runs past the start of the "
                            "central directory (byte %llu): out of range or truncated",
                            nb, (unsigned long long)size, (unsigned long long)data,
                            (unsigned long long)cd_ofs);
    }
    if (lnl != nl || memcmp(d + ofs + 30, e->name, nl) != 0) {
        return sd_set_error(SD_ERR_FORMAT, "ZIP entry '%s': its local header names another file",
                            nb);
    }
    e->header_ofs = ofs;
    e->data_ofs = data;
    e->size = size;
    *next = p + 46 + nl + xl + cl;
    return SD_OK;
}

void sd_zip_close(sd_zip *z) {
    free(z->entries);
    free(z->by_name);
    memset(z, 0, sizeof(*z));
}

sd_status sd_zip_open(sd_zip *z, const sd_mapping *m) {
    memset(z, 0, sizeof(*z));
    uint64_t n = 0, cd_ofs = 0, cd_size = 0, cd_limit = 0;
    SD_TRY(zip_find_directory(m, &n, &cd_ofs, &cd_size, &cd_limit));
    z->entries = calloc(n + 1, sizeof(*z->entries));
    z->by_name = calloc(n + 1, sizeof(*z->by_name));
    if (z->entries == NULL || z->by_name == NULL) {
        sd_zip_close(z);
        return sd_set_error(SD_ERR_NOMEM, "out of memory reading a ZIP directory");
    }
    uint64_t p = cd_ofs;
    for (uint64_t i = 0; i < n; i++) {
        const sd_status st = entry_read(&z->entries[i], m, p, cd_ofs + cd_size, cd_ofs, &p);
        if (st != SD_OK) {
            sd_zip_close(z);
            return st;
        }
        z->by_name[i] = &z->entries[i];
    }
    z->n = (size_t)n;
    char a[96], b[96];
    qsort(z->by_name, z->n, sizeof(*z->by_name), cmp_ofs);
    for (size_t i = 1; i < z->n; i++) {
        const sd_zip_entry *x = z->by_name[i - 1], *y = z->by_name[i];
        if (x->data_ofs + x->size > y->header_ofs) {
            sd_set_error(SD_ERR_FORMAT, "ZIP entries '%s' and '%s' overlap",
                         sd_zip_show(a, sizeof(a), x->name, x->name_len),
                         sd_zip_show(b, sizeof(b), y->name, y->name_len));
            sd_zip_close(z);
            return SD_ERR_FORMAT;
        }
    }
    qsort(z->by_name, z->n, sizeof(*z->by_name), cmp_name);
    for (size_t i = 1; i < z->n; i++) {
        if (cmp_name(&z->by_name[i - 1], &z->by_name[i]) == 0) {
            sd_set_error(SD_ERR_FORMAT, "the ZIP archive holds two entries named '%s'",
                         sd_zip_show(a, sizeof(a), z->by_name[i]->name, z->by_name[i]->name_len));
            sd_zip_close(z);
            return SD_ERR_FORMAT;
        }
    }
    return SD_OK;
}
