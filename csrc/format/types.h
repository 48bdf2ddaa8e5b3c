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

/* The first element of n (n % block_size == 0) of type `type` at data whose value is not
 * finite: a NaN or infinite float, or the first element of a block whose float scale (d, m,
 * dmin) is; -1 when all are finite, or the type has no float field this knows (the integer
 * quants of a block are always finite). */
int64_t sd_first_nonfinite(int type, const void *data, int64_t n);

/* SD_OK, or SD_ERR_FORMAT naming the tensor `name` (of the file `file`, or NULL) and where, when
 * one of its n elements of type `type` at data (rows of `cols`; 0: a vector), or a block's
 * scale, is a NaN or an infinity: a file holding one is corrupt, and a forward would turn it
 * into logits that mean nothing. NULL data (a matrix a GPU fills) is not read. */
sd_status sd_check_finite(const char *file, const char *name, int type, const void *data,
                          int64_t n, int64_t cols);

#endif /* SD_TYPES_H */
