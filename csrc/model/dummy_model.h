/* dummy_model.h — the tensors of a model with random weights (dummy.c), found by name like a
 * file's. */
#ifndef SD_DUMMY_MODEL_H
#define SD_DUMMY_MODEL_H

#include <stdint.h>

#include "specdec.h"
#include "format/tensor.h"

typedef struct {
    uint64_t seed;
    int n;
    sd_tensor_info *t;    /* (n): GGUF names, shapes and types; tensor i is filled from id i */
    unsigned char *block; /* the bytes of the tensors kept on the host */
} sd_dummy;

/* The tensors of a model of shape c with matrices of `weight_type` (norms F32 ones, qwen2
 * biases small F32), random from `seed`. host_data: fill every tensor here; 0: only the norms
 * and biases (the matrices' data stays NULL, for a device to fill). */
sd_status sd_dummy_create(sd_dummy **out, const sd_config *c, int weight_type, uint64_t seed,
                          int host_data);
void sd_dummy_free(sd_dummy *d);
const sd_tensor_info *sd_dummy_find(const sd_dummy *d, const char *name);

/* Fill a (rows, cols) tensor of `type` as tensor id `tensor` of a dummy model (dummy.h); the
 * CPU twin of the CUDA fill kernel. */
void sd_dummy_fill(void *dst, int type, int64_t rows, int64_t cols, uint64_t seed, uint64_t tensor,
                   float scale);
/* The value range of a matrix with `cols` columns: 1 / sqrt(cols). */
float sd_dummy_scale(int64_t cols);

#endif /* SD_DUMMY_MODEL_H */
