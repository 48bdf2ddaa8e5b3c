/* types.c — the one table of ggml type geometry (ggml-common.h's block definitions), indexed by
 * type id: what a reader needs to validate a tensor's extent, for every type a GGUF file of
 * llama.cpp's may hold, whether or not specdec computes with it. */
#include "format/types.h"

#include "format/tensor.h"

#include <stdio.h>
#include <string.h>

#include "util/status.h"

static const sd_type_info g_info[40] = {
    [SD_TYPE_F32] = {"F32", 1, 4},
    [SD_TYPE_F16] = {"F16", 1, 2},
    [SD_TYPE_BF16] = {"BF16", 1, 2},
    [SD_TYPE_Q4_0] = {"Q4_0", 32, 18},
    [SD_TYPE_Q4_1] = {"Q4_1", 32, 20},
    [SD_TYPE_Q5_0] = {"Q5_0", 32, 22},
    [SD_TYPE_Q5_1] = {"Q5_1", 32, 24},
    [SD_TYPE_Q8_0] = {"Q8_0", 32, 34},
    [SD_TYPE_Q4_K] = {"Q4_K", 256, 144},
    [SD_TYPE_Q5_K] = {"Q5_K", 256, 176},
    [SD_TYPE_Q6_K] = {"Q6_K", 256, 210},
    [9] = {"Q8_1", 32, 36},
    [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},
    [15] = {"Q8_K", 256, 292},
    [24] = {"I8", 1, 1},
    [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},
    [27] = {"I64", 1, 8},
    [28] = {"F64", 1, 8},
};

const sd_type_info *sd_type_info_get(int type) {
    if (type < 0 || type >= (int)(sizeof(g_info) / sizeof(g_info[0])) ||
        g_info[type].name == NULL) {
        return NULL;
    }
    return &g_info[type];
}

size_t sd_row_bytes(int type, int64_t n) {
    const sd_type_info *t = sd_type_info_get(type);
    if (t == NULL || n % t->block_size != 0) {
        return 0;
    }
    return (size_t)(n / t->block_size) * (size_t)t->type_size;
}

const char *sd_type_name(int type) {
    static __thread char buf[24];
    const sd_type_info *t = sd_type_info_get(type);
    if (t != NULL) {
        return t->name;
    }
    snprintf(buf, sizeof(buf), "type#%d", type);
    return buf;
}

/* An IEEE half is finite unless all its exponent bits are set (the rule of bfloat16 and of
 * single floats too, with their own exponent fields). */
static int f16_bad(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return (h & 0x7C00u) == 0x7C00u;
}

int64_t sd_first_nonfinite(int type, const void *data, int64_t n) {
    const unsigned char *p = (const unsigned char *)data;
    switch (type) {
    case SD_TYPE_F32:
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, p + 4 * i, 4);
            if ((u & 0x7F800000u) == 0x7F800000u) {
                return i;
            }
        }
        return -1;
    case SD_TYPE_F16:
    case SD_TYPE_BF16: {
        const uint16_t e = type == SD_TYPE_F16 ? 0x7C00u : 0x7F80u;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            if ((h & e) == e) {
                return i;
            }
        }
        return -1;
    }
    default: break;
    }
    /* block types: the offsets of their f16 scales (ggml-common.h) */
    int off[2], n_off;
    switch (type) {
    case SD_TYPE_Q4_0:
    case SD_TYPE_Q5_0:
    case SD_TYPE_Q8_0: off[0] = 0, n_off = 1; break; /* d */
    case SD_TYPE_Q4_1:
    case SD_TYPE_Q5_1:
    case SD_TYPE_Q4_K:
    case SD_TYPE_Q5_K: off[0] = 0, off[1] = 2, n_off = 2; break; /* d, m (dmin) */
    case SD_TYPE_Q6_K: off[0] = 208, n_off = 1; break;         /* ql, qh, scales, then d */
    default: return -1;
    }
    const sd_type_info *t = sd_type_info_get(type);
    const int64_t blocks = n / t->block_size;
    for (int64_t b = 0; b < blocks; b++) {
        const unsigned char *blk = p + (size_t)b * (size_t)t->type_size;
        if (f16_bad(blk + off[0]) || (n_off > 1 && f16_bad(blk + off[1]))) {
            return b * t->block_size;
        }
    }
    return -1;
}

sd_status sd_check_finite(const char *file, const char *name, int type, const void *data,
                          int64_t n, int64_t cols) {
    const int64_t i = data != NULL ? sd_first_nonfinite(type, data, n) : -1;
    if (i < 0) {
        return SD_OK;
    }
    const sd_type_info *t = sd_type_info_get(type);
    const char *what = t != NULL && t->block_size > 1 ? "block scale" : "value";
    char at[64];
    if (cols > 0) {
        snprintf(at, sizeof(at), "row %lld, column %lld", (long long)(i / cols),
                 (long long)(i % cols));
    } else {
        snprintf(at, sizeof(at), "element %lld", (long long)i);
    }
    return sd_set_error(SD_ERR_FORMAT, "%s%stensor '%s' holds a NaN or infinite %s at %s: the "
                        "file is corrupt", file != NULL ? file : "", file != NULL ? ": " : "",
                        name, what, at);
}

void sd_tensor_shape_str(char *buf, size_t n, const sd_tensor_info *t) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->n_dims && d < SD_MAX_DIMS && o < n; d++) {
        o += (size_t)snprintf(buf + o, n - o, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    }
    if (o < n) {
        snprintf(buf + o, n - o, "]");
    }
}
