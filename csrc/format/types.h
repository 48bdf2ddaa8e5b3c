/* types.h — the geometry of every ggml tensor type specdec can validate: its name, the elements
 * of one block and the bytes of one block (ggml-common.h). A file reader needs only this; the
 * kernels that compute with a type are the CPU layer's (cpu/quant.h). */
#ifndef SD_TYPES_H
#define SD_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "specdec.h"

typedef struct {
    const char *name; /* "F16", "Q4_K", ... as ggml names it */
    int block_size;   /* elements per block (1 for float and integer types) */
    int type_size;    /* bytes per block */
} sd_type_info;

/* The geometry of a ggml type id, or NULL when the id is unknown. */
const sd_type_info *sd_type_info_get(int type);
/* Bytes of a row of n elements (n % block_size == 0), 0 on unknown types. */
size_t sd_row_bytes(int type, int64_t n);

#endif /* SD_TYPES_H */
