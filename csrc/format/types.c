/* types.c — the one table of ggml type geometry (ggml-common.h's block definitions), indexed by
 * type id: what a reader needs to validate a tensor's extent, for every type a GGUF file of
 * llama.cpp's may hold, whether or not specdec computes with it. */
#include "format/types.h"

#include <stdio.h>

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
