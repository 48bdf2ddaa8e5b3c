/* gguf.h — reader for GGUF v2/v3 files (ggml's single-file model format).
 *
 * Layout (all little-endian):
 *   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x { string key | u32 value type | value }
 *   n_tensors x { string name | u32 n_dims | u64 dims[n_dims] (innermost first) | u32 type |
 *                 u64 offset (from the data section, a multiple of the alignment) }
 *   padding to `general.alignment` (default 32) | data section
 * A string is u64 length + bytes (no NUL). Value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32,
 * 6 f32, 7 bool, 8 string, 9 array (u32 element type, u64 count, elements), 10 u64, 11 i64,
 * 12 f64. The whole file is mapped and every count, length and offset is checked against the
 * file size before use. */
#ifndef SD_GGUF_H
#define SD_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "util/mapfile.h"
#include "specdec.h"
#include "format/tensor.h"

typedef struct {
    char *key;                  /* owned, NUL-terminated */
    uint32_t type;              /* SD_GGUF_* */
    const unsigned char *raw;   /* the value as stored (arrays: element type, count, elements) */
    const unsigned char *value; /* raw value bytes in the mapping (for arrays: the elements) */
    uint32_t elem_type;         /* arrays: element type */
    uint64_t count;             /* arrays: element count; scalars: 1 */
} sd_gguf_kv;

typedef struct {
    sd_mapping map;
    uint32_t version;
    uint64_t n_kv;
    sd_gguf_kv *kv; /* (n_kv) */
    uint64_t n_tensors;
    sd_tensor_info *tensors; /* (n_tensors) */
    size_t alignment;
    size_t data_offset; /* file offset of the data section */
} sd_gguf;

/* Map and validate `path`. Errors name the file and the problem. */
sd_status sd_gguf_open(sd_gguf **out, const char *path);
void sd_gguf_close(sd_gguf *g);

const sd_gguf_kv *sd_gguf_find(const sd_gguf *g, const char *key);

/* Scalar values: the bytes one of `type` takes (0 for strings, arrays and unknown types), and
 * the value at v (validated by the reader) with its kind. */
typedef enum {
    SD_GGUF_KIND_NONE,
    SD_GGUF_KIND_INT,   /* i */
    SD_GGUF_KIND_UINT,  /* u */
    SD_GGUF_KIND_FLOAT, /* f */
    SD_GGUF_KIND_BOOL   /* u: 0 or 1 */
} sd_gguf_kind;
typedef struct {
    sd_gguf_kind kind;
    int64_t i;
    uint64_t u;
    double f;
} sd_gguf_scalar;
size_t sd_gguf_scalar_size(uint32_t type);
sd_gguf_scalar sd_gguf_scalar_at(uint32_t type, const unsigned char *v);
/* Getters: 1 and the value when `key` exists with a compatible scalar type, else 0. */
int sd_gguf_get_int(const sd_gguf *g, const char *key, int64_t *out);
int sd_gguf_get_float(const sd_gguf *g, const char *key, double *out);
/* A string value as pointer + length (not NUL-terminated), or NULL. */
const char *sd_gguf_get_str(const sd_gguf *g, const char *key, size_t *len);
const sd_tensor_info *sd_gguf_find_tensor(const sd_gguf *g, const char *name);

#endif /* SD_GGUF_H */
