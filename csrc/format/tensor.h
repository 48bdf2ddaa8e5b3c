/* tensor.h — a named tensor found in a model file: type, shape and a view of its bytes.
 * GGUF and safetensors readers both produce these, so the model builder is format-blind. */
#ifndef SD_TENSOR_H
#define SD_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#define SD_MAX_DIMS 4

typedef struct {
    char *name;         /* owned, NUL-terminated */
    int type;           /* sd_type (ggml id), or -1 for a type specdec cannot read */
    char type_name[16]; /* as written in the file: "F16", "Q4_K", "I64", ... */
    int n_dims;
    int64_t shape[SD_MAX_DIMS]; /* outermost first (NumPy/PyTorch order); rows = shape[0] */
    const void *data;           /* view into a file mapping */
    size_t nbytes;
} sd_tensor_info;

/* t's shape as "[a, b, ...]" into buf (n bytes; cut short where it does not fit), for
 * messages. */
void sd_tensor_shape_str(char *buf, size_t n, const sd_tensor_info *t);

#endif /* SD_TENSOR_H */
