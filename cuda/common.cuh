/* common.cuh — what every CUDA source of the backend shares: the C core's headers, the
 * error-checking macros (a failed call records SD_ERR_CUDA with the call, the error and
 * file:line, and returns), the launch context, and warp/block reductions. */
#ifndef SD_CUDA_COMMON_CUH
#define SD_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../csrc/util/status.h"
}
#include "../csrc/format/blocks.h"
#include "../csrc/util/hd.h"
#include "sd_cuda.h"

/* A CUDA runtime call; on failure record it and return SD_ERR_CUDA from the enclosing function. */
#define SD_CUDA_TRY(call)                                                                          \
    do {                                                                                           \
        const cudaError_t sd_e_ = (call);                                                          \
        if (sd_e_ != cudaSuccess) {                                                                \
            return sd_set_error(SD_ERR_CUDA, "%s:%d: %s failed: %s (%s)", __FILE__, __LINE__,      \
                                #call, cudaGetErrorString(sd_e_), cudaGetErrorName(sd_e_));        \
        }                                                                                          \
    } while (0)

/* The launch just issued: configuration errors show at once, faults at the next sync. */
#define SD_CUDA_LAUNCHED(name)                                                                     \
    do {                                                                                           \
        const cudaError_t sd_e_ = cudaGetLastError();                                              \
        if (sd_e_ != cudaSuccess) {                                                                \
            return sd_set_error(SD_ERR_CUDA, "%s:%d: launching %s failed: %s (%s)", __FILE__,      \
                                __LINE__, name, cudaGetErrorString(sd_e_),                         \
                                cudaGetErrorName(sd_e_));                                          \
        }                                                                                          \
    } while (0)

const char *sd_cublas_status_name(cublasStatus_t st);

#define SD_CUBLAS_TRY(call)                                                                        \
    do {                                                                                           \
        const cublasStatus_t sd_s_ = (call);                                                       \
        if (sd_s_ != CUBLAS_STATUS_SUCCESS) {                                                      \
            return sd_set_error(SD_ERR_CUDA, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call,    \
                                sd_cublas_status_name(sd_s_));                                     \
        }                                                                                          \
    } while (0)

/* Everything a launch needs: the stream all of a model's work goes to, the cuBLAS handle bound
 * to it and its workspace. One per model (and one per kernel-check session); never global. */
struct sd_cuda_ctx {
    int device;
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *workspace; /* cuBLAS workspace (fixed, so graph capture never allocates) */
    size_t workspace_bytes;
    int n_sms;
    int use_mma; /* BF16 matmuls on the tensor cores (SPECDEC_CUDA_MMA=1) */
    /* matmul activations staged in shared memory: -1 where that measured faster (quantized
     * rows; float rows for 2+ tokens); SPECDEC_CUDA_STAGE=0 / 1: never / always */
    int stage_x;
};

/* Create a context on `device` (stream, cuBLAS handle, workspace) / release it. */
sd_status sd_cuda_ctx_init(sd_cuda_ctx *ctx, int device);
void sd_cuda_ctx_release(sd_cuda_ctx *ctx);

/* ---- device helpers ------------------------------------------------------------------------ */

#define SD_WARP 32

/* Reductions over a warp and over a block, for the sum (float or double) and the maximum. */
struct sd_op_sum {
    template <typename T> __device__ __forceinline__ static T apply(T a, T b) { return a + b; }
    template <typename T> __device__ __forceinline__ static T identity() { return T(0); }
};
struct sd_op_max {
    template <typename T> __device__ __forceinline__ static T apply(T a, T b) {
        return a > b ? a : b;
    }
    template <typename T> __device__ __forceinline__ static T identity() { return T(-INFINITY); }
};

template <typename Op, typename T> __device__ __forceinline__ T sd_warp_reduce(T v) {
    for (int o = SD_WARP / 2; o > 0; o >>= 1) {
        v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

/* Over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets the
 * result. `sh` holds 32 values. */
template <typename Op, typename T> __device__ __forceinline__ T sd_block_reduce(T v, T *sh) {
    const int lane = threadIdx.x % SD_WARP, w = threadIdx.x / SD_WARP;
    v = sd_warp_reduce<Op>(v);
    __syncthreads(); /* sh may still be read by an earlier call */
    if (lane == 0) {
        sh[w] = v;
    }
    __syncthreads();
    const int nw = blockDim.x / SD_WARP;
    v = lane < nw ? sh[lane] : Op::template identity<T>();
    return sd_warp_reduce<Op>(v);
}

__device__ __forceinline__ float sd_warp_sum(float v) {
    return sd_warp_reduce<sd_op_sum>(v);
}
__device__ __forceinline__ double sd_block_sum_d(double v, double *sh) {
    return sd_block_reduce<sd_op_sum>(v, sh);
}
__device__ __forceinline__ float sd_block_sum(float v, float *sh) {
    return sd_block_reduce<sd_op_sum>(v, sh);
}
__device__ __forceinline__ float sd_block_max(float v, float *sh) {
    return sd_block_reduce<sd_op_max>(v, sh);
}

static inline unsigned sd_div_up(int64_t a, int64_t b) {
    return (unsigned)((a + b - 1) / b);
}

/* n rounded up to 256 bytes: where each array of a device allocation starts. */
static inline size_t sd_align256(size_t n) {
    return (n + 255) / 256 * 256;
}

/* ---- element types on the device ------------------------------------------------------------- */

/* Elements per block and bytes per block of the types the kernels read (0: unknown). */
static __host__ __device__ __forceinline__ int sd_dev_block_size(int type) {
    switch (type) {
    case 0:
    case 1:
    case 30: return 1;
    case 2:
    case 3:
    case 6:
    case 7:
    case 8: return 32;
    case 12:
    case 13:
    case 14: return 256;
    default: return 0;
    }
}

static __host__ __device__ __forceinline__ int sd_dev_type_size(int type) {
    switch (type) {
    case 0: return 4;
    case 1:
    case 30: return 2;
    case 2: return 18;
    case 3: return 20;
    case 6: return 22;
    case 7: return 24;
    case 8: return 34;
    case 12: return 144;
    case 13: return 176;
    case 14: return 210;
    default: return 0;
    }
}

static __device__ __forceinline__ void sd_dev_decode(int type, sd_sub32 *o, const uint8_t *blk,
                                                     int sub) {
    switch (type) {
    case 2: sd_blk_decode_q4_0(o, blk, sub); break;
    case 3: sd_blk_decode_q4_1(o, blk, sub); break;
    case 6: sd_blk_decode_q5_0(o, blk, sub); break;
    case 7: sd_blk_decode_q5_1(o, blk, sub); break;
    case 8: sd_blk_decode_q8_0(o, blk, sub); break;
    case 12: sd_blk_decode_q4_K(o, blk, sub); break;
    case 13: sd_blk_decode_q5_K(o, blk, sub); break;
    default: sd_blk_decode_q6_K(o, blk, sub); break;
    }
}

static __device__ __forceinline__ float sd_dev_float_at(int type, const void *row, int64_t i) {
    if (type == 0) {
        return ((const float *)row)[i];
    }
    const uint16_t h = ((const uint16_t *)row)[i];
    return type == 1 ? sd_hd_f16_to_f32(h) : sd_hd_bf16_to_f32(h);
}

/* ---- launchers the forward pass uses with device-side scalars -------------------------------- */

/* Where a forward's KV cache is, read by the kernels at run time, so that one captured graph
 * serves every cache of its model. */
typedef struct {
    float *k, *v; /* (L, Hkv, capacity, Dh) */
    int capacity;
    int pad;
} sd_cuda_kv_desc;

/* KV write into layer `layer` of the cache kd describes (sd_cuda_kv_write's twin). */
sd_status sd_cuda_kv_write_dev(sd_cuda_ctx *ctx, const sd_cuda_kv_desc *kd, int layer,
                               const float *k, const float *v, const int32_t *slots, int T,
                               int n_kv_heads, int head_dim);

/* Masked attention as sd_cuda_attention, the mask's width read from n_attn_dev (so a captured
 * graph serves every step). */
extern "C" sd_status sd_cuda_attention_dev(sd_cuda_ctx *ctx, float *out, const float *q,
                                           const sd_cuda_kv_desc *kd, int layer,
                                           const uint8_t *mask, int T, const int *n_attn_dev,
                                           int n_heads, int n_kv_heads, int head_dim);

/* The matmul through cuBLAS (F32/F16/BF16 weights; long prefills): xh_scratch holds 2 * T * cols
 * halves for x split into two halves of the weights' type. Not batch-invariant, unlike
 * sd_cuda_matmul. */
sd_status sd_cuda_matmul_cublas(sd_cuda_ctx *ctx, float *y, int64_t ldy, const void *w, int type,
                                int64_t rows, int64_t cols, const float *x, int T,
                                const float *bias, int accumulate, void *xh_scratch);

#endif /* SD_CUDA_COMMON_CUH */
