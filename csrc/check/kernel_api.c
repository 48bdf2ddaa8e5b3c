/* kernel_api.c — the row kernels behind the public kernel-check calls of specdec.h
 * (sd_dequantize, sd_quantize_activations, sd_matmul_rows): argument checks, then the kernel the
 * caller names (the forward's, the portable one, or this CPU's over unrepacked rows), so tests
 * and benchmarks can hold each against an independent reference. */
#include <stdlib.h>

#include "cpu/dispatch.h"
#include "cpu/quant.h"
#include "specdec.h"
#include "util/status.h"

static sd_status check_type(int type, int64_t n, const sd_type_traits **out) {
    sd_kernels_init();
    const sd_type_traits *tr = sd_type_get(type);
    if (tr == NULL || tr->tile == NULL) {
        return sd_set_error(SD_ERR_UNSUPPORTED, "type %s has no kernels", sd_type_name(type));
    }
    if (n <= 0 || n % tr->block_size != 0) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "row length %lld is not a positive multiple of the %s block size %d",
                            (long long)n, tr->name, tr->block_size);
    }
    *out = tr;
    return SD_OK;
}

static sd_status check_size(const sd_type_traits *tr, size_t have, int64_t rows, int64_t n) {
    size_t need = (size_t)rows * (size_t)(n / tr->block_size) * (size_t)tr->type_size;
    if (have != need) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "%lld rows of %lld %s elements take %zu bytes, got %zu",
                            (long long)rows, (long long)n, tr->name, need, have);
    }
    return SD_OK;
}

sd_status sd_dequantize(float *dst, int type, const void *src, size_t src_bytes, int64_t n) {
    const sd_type_traits *tr = NULL;
    SD_TRY(check_type(type, n, &tr));
    SD_TRY(check_size(tr, src_bytes, 1, n));
    tr->to_float(dst, src, n);
    return SD_OK;
}

size_t sd_quantized_activation_bytes(int64_t n) {
    return SD_Q8_ROW_BYTES(n);
}

sd_status sd_quantize_activations(unsigned char *dst, size_t dst_bytes, const float *x, int64_t n) {
    sd_kernels_init();
    if (n <= 0 || n % 32 != 0) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "length must be a positive multiple of 32, got %lld", (long long)n);
    }
    if (dst_bytes != SD_Q8_ROW_BYTES(n)) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "%lld quantized activations take %zu bytes, got %zu", (long long)n,
                            SD_Q8_ROW_BYTES(n), dst_bytes);
    }
    sd_quantize_q8(dst, x, n);
    return SD_OK;
}

sd_status sd_matmul_rows(float *y, int type, const void *w, size_t w_bytes, int64_t nrows,
                         int64_t n, const float *x, int T, int kernel) {
    const sd_type_traits *tr = NULL;
    SD_TRY(check_type(type, n, &tr));
    if (nrows < 1 || T < 1) {
        return sd_set_error(SD_ERR_INVALID_ARG, "need nrows >= 1 and T >= 1");
    }
    SD_TRY(check_size(tr, w_bytes, nrows, n));
    sd_acts a = {x, n, NULL, NULL};
    unsigned char *xq = NULL;
    if (tr->dot_q8 != NULL) {
        if (n % 32 != 0) {
            return sd_set_error(SD_ERR_INVALID_ARG, "row length %lld is not a multiple of 32",
                                (long long)n);
        }
        xq = malloc(SD_Q8_BATCH_BYTES(T, n));
        if (xq == NULL) {
            return sd_set_error(SD_ERR_NOMEM, "out of memory");
        }
        float *xt = sd_kernels_want_scalars(T) ? sd_q8_scalars_at(xq, T, n) : NULL;
        for (int t = 0; t < T; t++) {
            unsigned char *row = xq + (size_t)t * SD_Q8_ROW_BYTES(n);
            sd_quantize_q8(row, x + (size_t)t * (size_t)n, n);
            if (xt != NULL) {
                sd_q8_scatter_scalars(xt, row, t, n);
            }
        }
        a.xq = xq;
        a.xt = xt;
    }
    const size_t packed_bytes = sd_repack_bytes(type, nrows, n);
    if (kernel == SD_KERNEL_FORWARD && packed_bytes > 0) {
        void *packed = malloc(packed_bytes);
        if (packed == NULL) {
            free(xq);
            return sd_set_error(SD_ERR_NOMEM, "out of memory");
        }
        sd_repack(packed, type, w, sd_row_bytes(type, n), nrows, n);
        sd_tile_repacked(type, y, nrows, packed, 0, nrows, &a, T, n, NULL, 0);
        free(packed);
    } else {
        sd_tile_fn tile = kernel == SD_KERNEL_PORTABLE ? sd_portable_tile(type) : tr->tile;
        tile(y, nrows, w, sd_row_bytes(type, n), nrows, &a, T, n, NULL, 0);
    }
    free(xq);
    return SD_OK;
}
