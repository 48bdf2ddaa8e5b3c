/* medusa.cu — Medusa-1's heads (Cai et al. 2024) on a GPU: each head's residual blocks
 * y + SiLU(W y + b) and its output head over the target's final-normed hidden states, the same
 * steps as sd_head_medusa_logits (model/head.c) with the device's matmul and silu_add kernels
 * (CPU twins: sd_twin_matmul, sd_twin_silu_add). The weights go to one allocation of their own
 * (the heads do not read the target's), on a stream of their own. */
#include <stdlib.h>
#include <string.h>

#include "common.cuh" /* sd_cuda.h, and through it sd_mat */

struct sd_cuda_medusa {
    sd_cuda_ctx ctx;
    int heads, blocks, D, V;
    uint8_t *weights;   /* every matrix, then the biases */
    const void **mat;   /* (heads * (blocks + 1)) device pointers, in the host's order */
    int *type;          /* ... their types */
    const float *bias;  /* (heads * blocks, D) */
    int cap;            /* rows the buffers hold */
    float *y, *u, *out; /* (cap, D), (cap, D), (heads, cap, V) */
};

extern "C" void sd_cuda_medusa_free(sd_cuda_medusa *md) {
    if (md == NULL) {
        return;
    }
    cudaSetDevice(md->ctx.device);
    if (md->ctx.stream != NULL) {
        cudaStreamSynchronize(md->ctx.stream);
    }
    cudaFree(md->weights);
    cudaFree(md->y);
    cudaFree(md->u);
    cudaFree(md->out);
    free(md->mat);
    free(md->type);
    sd_cuda_ctx_release(&md->ctx);
    free(md);
}

static sd_status medusa_upload(sd_cuda_medusa *md, const sd_mat *mats, const float *bias) {
    const int n = md->heads * (md->blocks + 1);
    size_t total = sd_align256((size_t)md->heads * (size_t)md->blocks * (size_t)md->D * 4 + 4);
    for (int i = 0; i < n; i++) {
        total += sd_align256((size_t)mats[i].rows * mats[i].row_bytes);
    }
    const cudaError_t e = cudaMalloc((void **)&md->weights, total);
    if (e != cudaSuccess) {
        cudaGetLastError();
        md->weights = NULL;
        return sd_set_error(SD_ERR_CUDA,
                            "Medusa's heads need %zu MiB of GPU memory (cudaMalloc: %s)",
                            total >> 20, cudaGetErrorString(e));
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const size_t bytes = (size_t)mats[i].rows * mats[i].row_bytes;
        SD_CUDA_TRY(cudaMemcpyAsync(md->weights + off, mats[i].data, bytes, cudaMemcpyHostToDevice,
                                    md->ctx.stream));
        md->mat[i] = md->weights + off;
        md->type[i] = mats[i].type;
        off += sd_align256(bytes);
    }
    const size_t nb = (size_t)md->heads * (size_t)md->blocks * (size_t)md->D;
    if (nb > 0) {
        SD_CUDA_TRY(cudaMemcpyAsync(md->weights + off, bias, nb * sizeof(float),
                                    cudaMemcpyHostToDevice, md->ctx.stream));
    }
    md->bias = (const float *)(md->weights + off);
    SD_CUDA_TRY(cudaStreamSynchronize(md->ctx.stream)); /* the host views may go after this */
    return SD_OK;
}

extern "C" sd_status sd_cuda_medusa_create(sd_cuda_medusa **out, int gpu, int heads, int blocks,
                                           const sd_mat *mats, const float *bias) {
    *out = NULL;
    if (heads < 1 || blocks < 0 || mats == NULL || (blocks > 0 && bias == NULL)) {
        return sd_set_error(SD_ERR_INVALID_ARG, "Medusa heads need at least one head (got %d)",
                            heads);
    }
    const sd_mat *o = &mats[blocks];
    for (int i = 0; i < heads * (blocks + 1); i++) {
        if (mats[i].data == NULL) {
            return sd_set_error(SD_ERR_INTERNAL, "a Medusa matrix without data to upload");
        }
    }
    sd_cuda_medusa *md = (sd_cuda_medusa *)calloc(1, sizeof(*md));
    if (md == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    md->heads = heads;
    md->blocks = blocks;
    md->D = (int)o->cols;
    md->V = (int)o->rows;
    md->mat = (const void **)calloc((size_t)heads * (size_t)(blocks + 1), sizeof(void *));
    md->type = (int *)calloc((size_t)heads * (size_t)(blocks + 1), sizeof(int));
    sd_status st =
        md->mat != NULL && md->type != NULL ? SD_OK : sd_set_error(SD_ERR_NOMEM, "out of memory");
    if (st == SD_OK) {
        st = sd_cuda_ctx_init(&md->ctx, gpu);
    }
    if (st == SD_OK) {
        st = medusa_upload(md, mats, bias);
    }
    if (st != SD_OK) {
        sd_cuda_medusa_free(md);
        return st;
    }
    *out = md;
    return SD_OK;
}

/* Buffers for T rows. */
static sd_status medusa_reserve(sd_cuda_medusa *md, int T) {
    if (T <= md->cap) {
        return SD_OK;
    }
    cudaFree(md->y);
    cudaFree(md->u);
    cudaFree(md->out);
    md->y = md->u = md->out = NULL;
    md->cap = 0;
    const size_t rows = (size_t)T * (size_t)md->D * sizeof(float);
    const cudaError_t e1 = cudaMalloc((void **)&md->y, rows);
    const cudaError_t e2 = cudaMalloc((void **)&md->u, rows);
    const cudaError_t e3 = cudaMalloc((void **)&md->out, (size_t)md->heads * (size_t)T *
                                                             (size_t)md->V * sizeof(float));
    if (e1 != cudaSuccess || e2 != cudaSuccess || e3 != cudaSuccess) {
        cudaGetLastError();
        return sd_set_error(SD_ERR_CUDA, "out of GPU memory for Medusa's heads over %d rows", T);
    }
    md->cap = T;
    return SD_OK;
}

extern "C" sd_status sd_cuda_medusa_logits(sd_cuda_medusa *md, int T, const float *x, float *out) {
    if (T < 1) {
        return SD_OK;
    }
    SD_CUDA_TRY(cudaSetDevice(md->ctx.device));
    SD_TRY(medusa_reserve(md, T));
    sd_cuda_ctx *ctx = &md->ctx;
    const int D = md->D, V = md->V, B = md->blocks;
    const size_t td = (size_t)T * (size_t)D;
    for (int i = 0; i < md->heads; i++) {
        SD_CUDA_TRY(
            cudaMemcpyAsync(md->y, x, td * sizeof(float), cudaMemcpyHostToDevice, ctx->stream));
        for (int j = 0; j < B; j++) { /* y += silu(W y + b) */
            const int k = i * (B + 1) + j;
            SD_TRY(sd_cuda_matmul(ctx, md->u, D, md->mat[k], md->type[k], D, D, md->y, T,
                                  md->bias + ((size_t)i * (size_t)B + (size_t)j) * (size_t)D, 0));
            SD_TRY(sd_cuda_silu_add(ctx, md->y, md->u, (int64_t)td));
        }
        const int k = i * (B + 1) + B;
        SD_TRY(sd_cuda_matmul(ctx, md->out + (size_t)i * (size_t)T * (size_t)V, V, md->mat[k],
                              md->type[k], V, D, md->y, T, NULL, 0));
    }
    SD_CUDA_TRY(cudaMemcpyAsync(out, md->out,
                                (size_t)md->heads * (size_t)T * (size_t)V * sizeof(float),
                                cudaMemcpyDeviceToHost, ctx->stream));
    SD_CUDA_TRY(cudaStreamSynchronize(ctx->stream));
    return SD_OK;
}
