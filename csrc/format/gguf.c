/* gguf.c — GGUF v2/v3 reader: map, walk the header with a bounds-checked cursor, validate every
 * tensor's type, shape and extent, and hand out views. Nothing is trusted before it is checked. */
#include "format/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/types.h"
#include "util/status.h"

#define GGUF_MAX_ARRAY_DEPTH 8
#define GGUF_MAX_STRING (1u << 30)

typedef struct {
    const unsigned char *p;
    size_t size;
    size_t off;
    const char *what; /* the part being read, for "truncated" messages */
} cursor;

static sd_status truncated(const cursor *c, size_t need) {
    return sd_set_error(SD_ERR_FORMAT,
                        "file is truncated: reading %s needs %zu bytes at offset %zu, "
                        "but the file has %zu bytes",
                        c->what, need, c->off, c->size);
}

static sd_status rd(cursor *c, void *dst, size_t n) {
    if (n > c->size - c->off) {
        return truncated(c, n);
    }
    memcpy(dst, c->p + c->off, n);
    c->off += n;
    return SD_OK;
}

static sd_status skip(cursor *c, size_t n) {
    if (n > c->size - c->off) {
        return truncated(c, n);
    }
    c->off += n;
    return SD_OK;
}

static sd_status rd_u32(cursor *c, uint32_t *v) {
    return rd(c, v, 4);
}
static sd_status rd_u64(cursor *c, uint64_t *v) {
    return rd(c, v, 8);
}

/* A string: returns a view (not NUL-terminated). */
static sd_status rd_str(cursor *c, const char **s, uint64_t *len) {
    SD_TRY(rd_u64(c, len));
    if (*len > GGUF_MAX_STRING) {
        return sd_set_error(SD_ERR_FORMAT,
                            "string length %llu at offset %zu is implausible "
                            "(corrupt file?)",
                            (unsigned long long)*len, c->off - 8);
    }
    if (*len > c->size - c->off) {
        return truncated(c, (size_t)*len);
    }
    *s = (const char *)(c->p + c->off);
    c->off += (size_t)*len;
    return SD_OK;
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d != NULL) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

size_t sd_gguf_scalar_size(uint32_t type) {
    switch (type) {
    case SD_GGUF_U8:
    case SD_GGUF_I8:
    case SD_GGUF_BOOL: return 1;
    case SD_GGUF_U16:
    case SD_GGUF_I16: return 2;
    case SD_GGUF_U32:
    case SD_GGUF_I32:
    case SD_GGUF_F32: return 4;
    case SD_GGUF_U64:
    case SD_GGUF_I64:
    case SD_GGUF_F64: return 8;
    default: return 0;
    }
}

sd_gguf_scalar sd_gguf_scalar_at(uint32_t type, const unsigned char *v) {
    sd_gguf_scalar x;
    memset(&x, 0, sizeof(x));
    x.kind = SD_GGUF_KIND_UINT;
    switch (type) {
    case SD_GGUF_U8: x.u = v[0]; break;
    case SD_GGUF_BOOL:
        x.kind = SD_GGUF_KIND_BOOL;
        x.u = v[0] != 0;
        break;
    case SD_GGUF_U16: {
        uint16_t t;
        memcpy(&t, v, 2);
        x.u = t;
        break;
    }
    case SD_GGUF_U32: {
        uint32_t t;
        memcpy(&t, v, 4);
        x.u = t;
        break;
    }
    case SD_GGUF_U64: memcpy(&x.u, v, 8); break;
    case SD_GGUF_I8:
        x.kind = SD_GGUF_KIND_INT;
        x.i = (int8_t)v[0];
        break;
    case SD_GGUF_I16: {
        int16_t t;
        memcpy(&t, v, 2);
        x.kind = SD_GGUF_KIND_INT;
        x.i = t;
        break;
    }
    case SD_GGUF_I32: {
        int32_t t;
        memcpy(&t, v, 4);
        x.kind = SD_GGUF_KIND_INT;
        x.i = t;
        break;
    }
    case SD_GGUF_I64:
        x.kind = SD_GGUF_KIND_INT;
        memcpy(&x.i, v, 8);
        break;
    case SD_GGUF_F32: {
        float t;
        memcpy(&t, v, 4);
        x.kind = SD_GGUF_KIND_FLOAT;
        x.f = t;
        break;
    }
    case SD_GGUF_F64:
        x.kind = SD_GGUF_KIND_FLOAT;
        memcpy(&x.f, v, 8);
        break;
    default: x.kind = SD_GGUF_KIND_NONE; break;
    }
    return x;
}

/* Skip over one value of `type`, validating it (arrays recursively). */
static sd_status skip_value(cursor *c, uint32_t type, int depth) {
    size_t sz = sd_gguf_scalar_size(type);
    if (sz != 0) {
        return skip(c, sz);
    }
    if (type == SD_GGUF_STRING) {
        const char *s = NULL;
        uint64_t len = 0;
        return rd_str(c, &s, &len);
    }
    if (type == SD_GGUF_ARRAY) {
        if (depth >= GGUF_MAX_ARRAY_DEPTH) {
            return sd_set_error(SD_ERR_FORMAT, "arrays nested deeper than %d at offset %zu",
                                GGUF_MAX_ARRAY_DEPTH, c->off);
        }
        uint32_t et = 0;
        uint64_t n = 0;
        SD_TRY(rd_u32(c, &et));
        SD_TRY(rd_u64(c, &n));
        size_t esz = sd_gguf_scalar_size(et);
        if (esz != 0) {
            if (n > (c->size - c->off) / esz) {
                return truncated(c, (size_t)(n > SIZE_MAX / esz ? SIZE_MAX : n * esz));
            }
            c->off += (size_t)(n * esz);
            return SD_OK;
        }
        if (et != SD_GGUF_STRING && et != SD_GGUF_ARRAY) {
            return sd_set_error(SD_ERR_FORMAT, "unknown array element type %u at offset %zu", et,
                                c->off - 12);
        }
        /* every element takes at least 8 bytes: reject absurd counts before looping */
        if (n > (c->size - c->off) / 8) {
            return truncated(c, (size_t)(n > SIZE_MAX / 8 ? SIZE_MAX : n * 8));
        }
        for (uint64_t i = 0; i < n; i++) {
            SD_TRY(skip_value(c, et, depth + 1));
        }
        return SD_OK;
    }
    return sd_set_error(SD_ERR_FORMAT, "unknown metadata value type %u at offset %zu", type,
                        c->off);
}

void sd_gguf_close(sd_gguf *g) {
    if (g == NULL) {
        return;
    }
    if (g->kv != NULL) {
        for (uint64_t i = 0; i < g->n_kv; i++) {
            free(g->kv[i].key);
        }
    }
    if (g->tensors != NULL) {
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            free(g->tensors[i].name);
        }
    }
    free(g->kv);
    free(g->tensors);
    sd_unmap_file(&g->map);
    free(g);
}

static int key_order(const void *a, const void *b) {
    return strcmp((*(const sd_gguf_kv *const *)a)->key, (*(const sd_gguf_kv *const *)b)->key);
}

/* A key stated twice is refused: which of the two values a reader takes is a guess, and the
 * first one found (sd_gguf_find) would silently win. */
static sd_status check_unique_keys(const sd_gguf *g) {
    if (g->n_kv < 2) {
        return SD_OK;
    }
    const sd_gguf_kv **by = malloc((size_t)g->n_kv * sizeof(*by));
    if (by == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory reading the GGUF header");
    }
    for (uint64_t i = 0; i < g->n_kv; i++) {
        by[i] = &g->kv[i];
    }
    qsort(by, (size_t)g->n_kv, sizeof(*by), key_order);
    sd_status st = SD_OK;
    for (uint64_t i = 1; i < g->n_kv && st == SD_OK; i++) {
        if (strcmp(by[i - 1]->key, by[i]->key) == 0) {
            st =
                sd_set_error(SD_ERR_FORMAT, "metadata key '%s' appears more than once", by[i]->key);
        }
    }
    free(by);
    return st;
}

static sd_status read_header(sd_gguf *g) {
    cursor c = {g->map.data, g->map.size, 0, "the header"};
    char magic[4];
    SD_TRY(rd(&c, magic, 4));
    if (memcmp(magic, "GGUF", 4) != 0) {
        return sd_set_error(SD_ERR_FORMAT,
                            "bad magic: expected \"GGUF\", found bytes %02x %02x %02x %02x "
                            "(not a GGUF file)",
                            (unsigned char)magic[0], (unsigned char)magic[1],
                            (unsigned char)magic[2], (unsigned char)magic[3]);
    }
    SD_TRY(rd_u32(&c, &g->version));
    if (g->version != 2 && g->version != 3) {
        return sd_set_error(SD_ERR_UNSUPPORTED, "unsupported GGUF version %u (supported: 2 and 3)",
                            g->version);
    }
    uint64_t n_tensors = 0, n_kv = 0;
    SD_TRY(rd_u64(&c, &n_tensors));
    SD_TRY(rd_u64(&c, &n_kv));
    /* each entry takes well over 8 bytes: bound the counts by the file size */
    if (n_kv > g->map.size / 8 || n_tensors > g->map.size / 8) {
        return sd_set_error(SD_ERR_FORMAT,
                            "implausible counts (%llu tensors, %llu metadata entries) for a "
                            "file of %zu bytes: file is truncated or corrupt",
                            (unsigned long long)n_tensors, (unsigned long long)n_kv, g->map.size);
    }
    g->kv = calloc((size_t)n_kv + 1, sizeof(sd_gguf_kv));
    g->tensors = calloc((size_t)n_tensors + 1, sizeof(sd_tensor_info));
    if (g->kv == NULL || g->tensors == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory reading the GGUF header");
    }
    c.what = "metadata";
    for (uint64_t i = 0; i < n_kv; i++) {
        const char *key = NULL;
        uint64_t klen = 0;
        sd_gguf_kv *kv = &g->kv[i];
        SD_TRY(rd_str(&c, &key, &klen));
        kv->key = dup_n(key, (size_t)klen);
        g->n_kv = i + 1;
        if (kv->key == NULL) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory reading the GGUF header");
        }
        SD_TRY(rd_u32(&c, &kv->type));
        kv->raw = c.p + c.off;
        kv->count = 1;
        if (kv->type == SD_GGUF_ARRAY) {
            size_t start = c.off;
            SD_TRY(rd_u32(&c, &kv->elem_type));
            SD_TRY(rd_u64(&c, &kv->count));
            kv->value = c.p + c.off;
            c.off = start;
        } else {
            kv->value = c.p + c.off;
        }
        sd_status st = skip_value(&c, kv->type, 0);
        if (st != SD_OK) {
            return sd_error_prefix(st, "metadata '%s'", kv->key);
        }
    }
    SD_TRY(check_unique_keys(g));
    g->alignment = 32;
    int64_t align;
    if (sd_gguf_get_int(g, "general.alignment", &align)) {
        if (align <= 0 || align > (1 << 20) || (align & (align - 1)) != 0) {
            return sd_set_error(SD_ERR_FORMAT, "general.alignment = %lld is not a power of two",
                                (long long)align);
        }
        g->alignment = (size_t)align;
    }
    c.what = "tensor infos";
    for (uint64_t i = 0; i < n_tensors; i++) {
        sd_tensor_info *t = &g->tensors[i];
        const char *name = NULL;
        uint64_t nlen = 0;
        SD_TRY(rd_str(&c, &name, &nlen));
        t->name = dup_n(name, (size_t)nlen);
        g->n_tensors = i + 1;
        if (t->name == NULL) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory reading the GGUF header");
        }
        uint32_t n_dims = 0, type = 0;
        SD_TRY(rd_u32(&c, &n_dims));
        if (n_dims < 1 || n_dims > SD_MAX_DIMS) {
            return sd_set_error(SD_ERR_FORMAT, "tensor '%s' has %u dimensions (1 to %d allowed)",
                                t->name, n_dims, SD_MAX_DIMS);
        }
        uint64_t dims[SD_MAX_DIMS] = {0};
        uint64_t numel = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            SD_TRY(rd_u64(&c, &dims[d]));
            if (dims[d] == 0 || dims[d] > ((uint64_t)1 << 40) ||
                numel > ((uint64_t)1 << 50) / dims[d]) {
                return sd_set_error(SD_ERR_FORMAT, "tensor '%s' has an invalid dimension %llu",
                                    t->name, (unsigned long long)dims[d]);
            }
            numel *= dims[d];
        }
        SD_TRY(rd_u32(&c, &type));
        uint64_t offset = 0;
        SD_TRY(rd_u64(&c, &offset));
        const sd_type_info *tr = sd_type_info_get((int)type);
        if (tr == NULL) {
            return sd_set_error(SD_ERR_UNSUPPORTED, "tensor '%s' has unknown type id %u", t->name,
                                type);
        }
        if (dims[0] % (uint64_t)tr->block_size != 0) {
            return sd_set_error(SD_ERR_FORMAT,
                                "tensor '%s' of type %s: row length %llu is not a multiple of "
                                "the block size %d",
                                t->name, tr->name, (unsigned long long)dims[0], tr->block_size);
        }
        if (offset % g->alignment != 0) {
            return sd_set_error(SD_ERR_FORMAT,
                                "tensor '%s' offset %llu is not a multiple of the alignment %zu",
                                t->name, (unsigned long long)offset, g->alignment);
        }
        t->type = (int)type;
        snprintf(t->type_name, sizeof(t->type_name), "%s", tr->name);
        t->n_dims = (int)n_dims;
        for (uint32_t d = 0; d < n_dims; d++) {
            t->shape[d] = (int64_t)dims[n_dims - 1 - d]; /* GGUF is innermost first */
        }
        t->nbytes = (size_t)(numel / (uint64_t)tr->block_size) * (size_t)tr->type_size;
        t->data = (const void *)(uintptr_t)offset; /* resolved below */
    }
    size_t data_off = (c.off + g->alignment - 1) / g->alignment * g->alignment;
    if (data_off > g->map.size) {
        c.what = "the padding before the tensor data";
        return truncated(&c, data_off - c.off);
    }
    g->data_offset = data_off;
    size_t avail = g->map.size - data_off;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        sd_tensor_info *t = &g->tensors[i];
        uint64_t offset = (uint64_t)(uintptr_t)t->data;
        if (offset > avail || t->nbytes > avail - offset) {
            return sd_set_error(SD_ERR_FORMAT,
                                "tensor '%s' data (%zu bytes at data offset %llu) lies past "
                                "the end of file (%zu bytes of data, file truncated?)",
                                t->name, t->nbytes, (unsigned long long)offset, avail);
        }
        t->data = g->map.data + data_off + offset;
    }
    return SD_OK;
}

sd_status sd_gguf_open(sd_gguf **out, const char *path) {
    *out = NULL;
    sd_gguf *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory opening '%s'", path);
    }
    sd_status st = sd_map_file(&g->map, path);
    if (st == SD_OK) {
        st = read_header(g);
        if (st != SD_OK) {
            sd_error_prefix(st, "%s", path);
        }
    }
    if (st != SD_OK) {
        sd_gguf_close(g);
        return st;
    }
    *out = g;
    return SD_OK;
}

const sd_gguf_kv *sd_gguf_find(const sd_gguf *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (strcmp(g->kv[i].key, key) == 0) {
            return &g->kv[i];
        }
    }
    return NULL;
}

int sd_gguf_get_int(const sd_gguf *g, const char *key, int64_t *out) {
    const sd_gguf_kv *kv = sd_gguf_find(g, key);
    if (kv == NULL || sd_gguf_scalar_size(kv->type) == 0) {
        return 0;
    }
    const sd_gguf_scalar x = sd_gguf_scalar_at(kv->type, kv->value);
    if (x.kind == SD_GGUF_KIND_INT) {
        *out = x.i;
        return 1;
    }
    if ((x.kind == SD_GGUF_KIND_UINT || x.kind == SD_GGUF_KIND_BOOL) && x.u <= INT64_MAX) {
        *out = (int64_t)x.u;
        return 1;
    }
    return 0;
}

int sd_gguf_get_float(const sd_gguf *g, const char *key, double *out) {
    const sd_gguf_kv *kv = sd_gguf_find(g, key);
    if (kv != NULL && (kv->type == SD_GGUF_F32 || kv->type == SD_GGUF_F64)) {
        *out = sd_gguf_scalar_at(kv->type, kv->value).f;
        return 1;
    }
    int64_t i;
    if (sd_gguf_get_int(g, key, &i)) {
        *out = (double)i;
        return 1;
    }
    return 0;
}

const char *sd_gguf_get_str(const sd_gguf *g, const char *key, size_t *len) {
    const sd_gguf_kv *kv = sd_gguf_find(g, key);
    if (kv == NULL || kv->type != SD_GGUF_STRING) {
        return NULL;
    }
    uint64_t n;
    memcpy(&n, kv->value, 8);
    *len = (size_t)n;
    return (const char *)kv->value + 8;
}

const sd_tensor_info *sd_gguf_find_tensor(const sd_gguf *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (strcmp(g->tensors[i].name, name) == 0) {
            return &g->tensors[i];
        }
    }
    return NULL;
}
