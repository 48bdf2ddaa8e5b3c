/* safetensors.c — map safetensors files, parse their JSON headers, and validate each tensor's
 * dtype, shape and byte range before handing out views. */
#include "format/safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/status.h"

#define ST_MAX_HEADER ((uint64_t)100 << 20)

typedef struct {
    const char *name;
    int type; /* sd_type, or -1: readable geometry, no arithmetic */
    int elem_size;
} st_dtype;

static const st_dtype g_dtypes[] = {
    {"F32", SD_TYPE_F32, 4}, {"F16", SD_TYPE_F16, 2}, {"BF16", SD_TYPE_BF16, 2},
    {"F64", -1, 8},          {"I64", -1, 8},          {"U64", -1, 8},
    {"I32", -1, 4},          {"U32", -1, 4},          {"I16", -1, 2},
    {"U16", -1, 2},          {"I8", -1, 1},           {"U8", -1, 1},
    {"BOOL", -1, 1},         {"F8_E4M3", -1, 1},      {"F8_E5M2", -1, 1},
};

static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p != NULL) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
    }
    return p;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

sd_status sd_json_read_file(sd_json **out, const char *path) {
    *out = NULL;
    sd_mapping m;
    SD_TRY(sd_map_file(&m, path));
    sd_status st = sd_json_parse(out, (const char *)m.data, m.size);
    sd_unmap_file(&m);
    if (st != SD_OK) {
        return sd_error_prefix(st, "%s", path);
    }
    return SD_OK;
}

void sd_st_close(sd_st_set *set) {
    if (set == NULL) {
        return;
    }
    for (int i = 0; i < set->n_tensors; i++) {
        free(set->tensors[i].name);
    }
    for (int i = 0; i < set->n_files; i++) {
        sd_unmap_file(&set->maps[i]);
    }
    free(set->tensors);
    free(set->maps);
    free(set);
}

/* Parse one tensor entry of a header. */
static sd_status parse_entry(sd_tensor_info *t, const char *name, const sd_json *e,
                             const unsigned char *data, size_t data_size) {
    const char *dtype = sd_json_get_string(e, "dtype");
    const sd_json *shape = sd_json_get(e, "shape");
    const sd_json *offs = sd_json_get(e, "data_offsets");
    if (dtype == NULL || shape == NULL || shape->type != SD_JSON_ARRAY || offs == NULL ||
        offs->type != SD_JSON_ARRAY || offs->n != 2) {
        return sd_set_error(SD_ERR_FORMAT,
                            "safetensors header entry '%s' needs \"dtype\", \"shape\" and "
                            "\"data_offsets\" [begin, end]",
                            name);
    }
    const st_dtype *dt = NULL;
    for (size_t i = 0; i < sizeof(g_dtypes) / sizeof(g_dtypes[0]); i++) {
        if (strcmp(g_dtypes[i].name, dtype) == 0) {
            dt = &g_dtypes[i];
        }
    }
    if (dt == NULL) {
        return sd_set_error(SD_ERR_UNSUPPORTED, "safetensors tensor '%s' has unknown dtype '%s'",
                            name, dtype);
    }
    if (shape->n > SD_MAX_DIMS) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "safetensors tensor '%s' has %zu dimensions (at most %d supported)",
                            name, shape->n, SD_MAX_DIMS);
    }
    uint64_t numel = 1;
    for (size_t d = 0; d < shape->n; d++) {
        const sd_json *s = &shape->items[d];
        if (s->type != SD_JSON_NUMBER || !s->is_integer || s->integer < 0 ||
            s->integer > ((int64_t)1 << 40) ||
            (s->integer > 0 && numel > ((uint64_t)1 << 50) / (uint64_t)s->integer)) {
            return sd_set_error(SD_ERR_FORMAT, "safetensors tensor '%s' has an invalid shape",
                                name);
        }
        t->shape[d] = s->integer;
        numel *= (uint64_t)s->integer;
    }
    const sd_json *b = &offs->items[0], *en = &offs->items[1];
    if (b->type != SD_JSON_NUMBER || !b->is_integer || en->type != SD_JSON_NUMBER ||
        !en->is_integer || b->integer < 0 || en->integer < b->integer) {
        return sd_set_error(SD_ERR_FORMAT, "safetensors tensor '%s' has invalid data_offsets",
                            name);
    }
    uint64_t begin = (uint64_t)b->integer, end = (uint64_t)en->integer;
    if (end - begin != numel * (uint64_t)dt->elem_size) {
        return sd_set_error(SD_ERR_FORMAT,
                            "safetensors tensor '%s': data_offsets span %llu bytes but %s of "
                            "this shape needs %llu",
                            name, (unsigned long long)(end - begin), dtype,
                            (unsigned long long)(numel * (uint64_t)dt->elem_size));
    }
    if (end > data_size) {
        return sd_set_error(SD_ERR_FORMAT,
                            "safetensors tensor '%s' data [%llu, %llu) lies past the end of "
                            "file (%zu bytes of data, file truncated?)",
                            name, (unsigned long long)begin, (unsigned long long)end, data_size);
    }
    t->name = strdup(name);
    if (t->name == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory reading a safetensors header");
    }
    t->type = dt->type;
    snprintf(t->type_name, sizeof(t->type_name), "%s", dtype);
    t->n_dims = (int)shape->n;
    t->data = data + begin;
    t->nbytes = (size_t)(end - begin);
    return SD_OK;
}

/* Map `path` as file number set->n_files and append its tensors. */
static sd_status add_file(sd_st_set *set, const char *path) {
    sd_mapping *maps = realloc(set->maps, (size_t)(set->n_files + 1) * sizeof(*maps));
    if (maps == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory opening '%s'", path);
    }
    set->maps = maps;
    sd_mapping *m = &set->maps[set->n_files];
    SD_TRY(sd_map_file(m, path));
    set->n_files++;
    uint64_t hlen = 0;
    if (m->size < 8) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: safetensors file is truncated: %zu bytes, less than the 8-byte "
                            "header length",
                            path, m->size);
    }
    memcpy(&hlen, m->data, 8);
    if (hlen > ST_MAX_HEADER || hlen > m->size - 8) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: safetensors header length %llu does not fit in the file of "
                            "%zu bytes (truncated or not a safetensors file)",
                            path, (unsigned long long)hlen, m->size);
    }
    sd_json *h = NULL;
    sd_status st = sd_json_parse(&h, (const char *)m->data + 8, (size_t)hlen);
    if (st != SD_OK) {
        return sd_error_prefix(st, "%s: invalid safetensors header", path);
    }
    if (h->type != SD_JSON_OBJECT) {
        sd_json_free(h);
        return sd_set_error(SD_ERR_FORMAT, "%s: safetensors header is not a JSON object", path);
    }
    sd_tensor_info *ts = realloc(set->tensors, (size_t)set->n_tensors * sizeof(*ts) +
                                                   h->n * sizeof(*ts) + sizeof(*ts));
    if (ts == NULL) {
        sd_json_free(h);
        return sd_set_error(SD_ERR_NOMEM, "out of memory opening '%s'", path);
    }
    set->tensors = ts;
    const unsigned char *data = m->data + 8 + hlen;
    size_t data_size = m->size - 8 - (size_t)hlen;
    for (size_t i = 0; i < h->n && st == SD_OK; i++) {
        if (strcmp(h->keys[i], "__metadata__") == 0) {
            continue;
        }
        sd_tensor_info *t = &set->tensors[set->n_tensors];
        memset(t, 0, sizeof(*t));
        st = parse_entry(t, h->keys[i], &h->items[i], data, data_size);
        if (st == SD_OK) {
            set->n_tensors++;
        }
    }
    sd_json_free(h);
    if (st != SD_OK) {
        return sd_error_prefix(st, "%s", path);
    }
    return SD_OK;
}

static sd_status open_sharded(sd_st_set *set, const char *dir, const char *index_path) {
    sd_json *idx = NULL;
    SD_TRY(sd_json_read_file(&idx, index_path));
    sd_status st = SD_OK;
    const sd_json *wm = sd_json_get(idx, "weight_map");
    if (wm == NULL || wm->type != SD_JSON_OBJECT) {
        st = sd_set_error(SD_ERR_FORMAT, "%s has no \"weight_map\" object", index_path);
    }
    /* open each distinct shard once, in order of first mention */
    const char **seen = NULL;
    size_t n_seen = 0;
    if (st == SD_OK) {
        seen = calloc(wm->n + 1, sizeof(*seen));
        if (seen == NULL) {
            st = sd_set_error(SD_ERR_NOMEM, "out of memory reading %s", index_path);
        }
    }
    for (size_t i = 0; st == SD_OK && i < wm->n; i++) {
        const sd_json *f = &wm->items[i];
        if (f->type != SD_JSON_STRING || strchr(f->string, '/') != NULL) {
            st = sd_set_error(SD_ERR_FORMAT, "%s: weight_map entry '%s' is not a file name",
                              index_path, wm->keys[i]);
            break;
        }
        int dup = 0;
        for (size_t j = 0; j < n_seen && !dup; j++) {
            dup = strcmp(seen[j], f->string) == 0;
        }
        if (dup) {
            continue;
        }
        seen[n_seen++] = f->string;
        char *p = path_join(dir, f->string);
        if (p == NULL) {
            st = sd_set_error(SD_ERR_NOMEM, "out of memory reading %s", index_path);
            break;
        }
        st = add_file(set, p);
        free(p);
    }
    free(seen);
    sd_json_free(idx);
    return st;
}

sd_status sd_st_open_dir(sd_st_set **out, const char *dir) {
    *out = NULL;
    sd_st_set *set = calloc(1, sizeof(*set));
    char *single = path_join(dir, "model.safetensors");
    char *index = path_join(dir, "model.safetensors.index.json");
    sd_status st = SD_OK;
    if (set == NULL || single == NULL || index == NULL) {
        st = sd_set_error(SD_ERR_NOMEM, "out of memory opening '%s'", dir);
    } else if (file_exists(single)) {
        st = add_file(set, single);
    } else if (file_exists(index)) {
        st = open_sharded(set, dir, index);
    } else {
        st = sd_set_error(SD_ERR_IO,
                          "'%s' holds neither model.safetensors nor "
                          "model.safetensors.index.json",
                          dir);
    }
    free(single);
    free(index);
    if (st != SD_OK) {
        sd_st_close(set);
        return st;
    }
    *out = set;
    return SD_OK;
}

sd_status sd_st_open_file(sd_st_set **out, const char *path) {
    *out = NULL;
    sd_st_set *set = calloc(1, sizeof(*set));
    if (set == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory opening '%s'", path);
    }
    const sd_status st = add_file(set, path);
    if (st != SD_OK) {
        sd_st_close(set);
        return st;
    }
    *out = set;
    return SD_OK;
}

const sd_tensor_info *sd_st_find(const sd_st_set *set, const char *name) {
    for (int i = 0; i < set->n_tensors; i++) {
        if (strcmp(set->tensors[i].name, name) == 0) {
            return &set->tensors[i];
        }
    }
    return NULL;
}
