/* matmul.cu — y (T, rows) = x (T, cols) W^T on the GPU for every weight type the loader
 * accepts: F32/F16/BF16 and the quantized blocks (decoded in registers with blocks.h, the
 * decoders the CPU kernels use). One warp computes two rows for up to 8 tokens, each lane
 * walking its own columns with one accumulator per (row, token), then a fixed shuffle tree.
 * A token's arithmetic is therefore the same whatever the batch (no split by batch size, no
 * shared partial sums), so a verify batch reproduces one-token decoding bit for bit, as on
 * the CPU. Long prefills of F16/BF16/F32 matrices may go through cuBLAS instead (tensor
 * cores; SPECDEC_CUDA_CUBLAS=1, off by default), which is fast but not batch-invariant. */
#include "common.cuh"

#define MM_WARPS 8 /* warps per block */
#define MM_ROWS 2  /* rows per warp */
#define MM_TOK 8   /* tokens per pass (blockIdx.y walks the passes) */

/* Store (row, token) sums: v + bias, added to y when accumulating (the CPU tile's order). */
__device__ __forceinline__ void mm_store(float *y, int64_t ldy, float v, const float *bias,
                                         int64_t r, int t, int accumulate) {
    v += bias != NULL ? bias[r] : 0.0f;
    float *dst = y + (size_t)t * (size_t)ldy + (size_t)r;
    *dst = accumulate ? *dst + v : v;
}

template <int TYPE>
__device__ __forceinline__ void mm_load4(float *o, const uint8_t *row, int64_t k) {
    if (TYPE == 0) {
        const float4 v = *(const float4 *)((const float *)row + k);
        o[0] = v.x;
        o[1] = v.y;
        o[2] = v.z;
        o[3] = v.w;
    } else {
        const uint2 v = *(const uint2 *)((const uint16_t *)row + k);
        const uint16_t h[4] = {(uint16_t)(v.x & 0xffffu), (uint16_t)(v.x >> 16),
                               (uint16_t)(v.y & 0xffffu), (uint16_t)(v.y >> 16)};
        for (int e = 0; e < 4; e++) {
            o[e] = TYPE == 1 ? sd_hd_f16_to_f32(h[e]) : sd_hd_bf16_to_f32(h[e]);
        }
    }
}

/* Float weights (TYPE 0 F32, 1 F16, 30 BF16). vec: cols % 4 == 0, so rows of W and x are
 * 16- (8-) byte aligned and a lane takes 4 columns at a time; else one at a time. Which of the
 * two depends on cols only, never on the batch. */
template <int TYPE, int TT>
__global__ void __launch_bounds__(MM_WARPS * 32)
    mm_float_kernel(float *y, int64_t ldy, const uint8_t *w, int64_t rows, int64_t cols,
                    size_t row_bytes, const float *x, int T, const float *bias, int accumulate,
                    int vec) {
    const int warp = threadIdx.x / SD_WARP, lane = threadIdx.x % SD_WARP;
    const int64_t r0 = ((int64_t)blockIdx.x * MM_WARPS + warp) * MM_ROWS;
    const int t0 = blockIdx.y * MM_TOK;
    const int nt = T - t0 < TT ? T - t0 : TT;
    if (r0 >= rows) {
        return;
    }
    float acc[MM_ROWS][TT];
    for (int r = 0; r < MM_ROWS; r++) {
        for (int t = 0; t < TT; t++) {
            acc[r][t] = 0.0f;
        }
    }
    const float *xb = x + (size_t)t0 * (size_t)cols;
    if (vec) {
        for (int64_t k = (int64_t)lane * 4; k < cols; k += 4 * SD_WARP) {
            float xv[TT][4];
            for (int t = 0; t < TT; t++) {
                if (t < nt) {
                    const float4 v = *(const float4 *)(xb + (size_t)t * (size_t)cols + k);
                    xv[t][0] = v.x;
                    xv[t][1] = v.y;
                    xv[t][2] = v.z;
                    xv[t][3] = v.w;
                }
            }
            for (int r = 0; r < MM_ROWS; r++) {
                if (r0 + r < rows) {
                    float wv[4];
                    mm_load4<TYPE>(wv, w + (size_t)(r0 + r) * row_bytes, k);
                    for (int t = 0; t < TT; t++) {
                        if (t < nt) {
                            for (int e = 0; e < 4; e++) {
                                acc[r][t] = fmaf(wv[e], xv[t][e], acc[r][t]);
                            }
                        }
                    }
                }
            }
        }
    } else {
        for (int64_t k = lane; k < cols; k += SD_WARP) {
            for (int r = 0; r < MM_ROWS; r++) {
                if (r0 + r < rows) {
                    const float wv = sd_dev_float_at(TYPE, w + (size_t)(r0 + r) * row_bytes, k);
                    for (int t = 0; t < TT; t++) {
                        if (t < nt) {
                            acc[r][t] = fmaf(wv, xb[(size_t)t * (size_t)cols + k], acc[r][t]);
                        }
                    }
                }
            }
        }
    }
    for (int r = 0; r < MM_ROWS; r++) {
        for (int t = 0; t < TT; t++) {
            const float v = sd_warp_sum(acc[r][t]);
            if (lane == 0 && t < nt && r0 + r < rows) {
                mm_store(y, ldy, v, bias, r0 + r, t0 + t, accumulate);
            }
        }
    }
}

/* Quantized weights: a lane takes one 32-element sub-block of a row at a time, decodes it
 * (value = d * q + m per element, rounded as the CPU's to_float) and multiplies it with each
 * token. */
template <int TYPE, int TT>
__global__ void __launch_bounds__(MM_WARPS * 32)
    mm_quant_kernel(float *y, int64_t ldy, const uint8_t *w, int64_t rows, int64_t cols,
                    size_t row_bytes, const float *x, int T, const float *bias, int accumulate) {
    const int warp = threadIdx.x / SD_WARP, lane = threadIdx.x % SD_WARP;
    const int64_t r0 = ((int64_t)blockIdx.x * MM_WARPS + warp) * MM_ROWS;
    const int t0 = blockIdx.y * MM_TOK;
    const int nt = T - t0 < TT ? T - t0 : TT;
    if (r0 >= rows) {
        return;
    }
    constexpr int BS = TYPE == 12 || TYPE == 13 || TYPE == 14 ? 256 : 32;
    const int ts = sd_dev_type_size(TYPE);
    float acc[MM_ROWS][TT];
    for (int r = 0; r < MM_ROWS; r++) {
        for (int t = 0; t < TT; t++) {
            acc[r][t] = 0.0f;
        }
    }
    const float *xb = x + (size_t)t0 * (size_t)cols;
    const int64_t nsub = cols / 32;
    for (int64_t j = lane; j < nsub; j += SD_WARP) {
        const int64_t blk = j * 32 / BS;
        const int sub = (int)(j * 32 % BS) / 32;
        for (int r = 0; r < MM_ROWS; r++) {
            if (r0 + r >= rows) {
                continue;
            }
            sd_sub32 s;
            sd_dev_decode(TYPE, &s, w + (size_t)(r0 + r) * row_bytes + (size_t)blk * ts, sub);
            float wv[32];
            for (int e = 0; e < 32; e++) {
                /* d * q, then + m: the C decoder's two roundings (no fused multiply-add) */
                wv[e] = __fadd_rn(__fmul_rn(e < 16 ? s.d_lo : s.d_hi, (float)s.q[e]), s.m);
            }
            for (int t = 0; t < TT; t++) {
                if (t < nt) {
                    const float4 *xt =
                        (const float4 *)(xb + (size_t)t * (size_t)cols + (size_t)j * 32);
                    for (int e4 = 0; e4 < 8; e4++) {
                        const float4 v = xt[e4];
                        acc[r][t] = fmaf(wv[4 * e4 + 0], v.x, acc[r][t]);
                        acc[r][t] = fmaf(wv[4 * e4 + 1], v.y, acc[r][t]);
                        acc[r][t] = fmaf(wv[4 * e4 + 2], v.z, acc[r][t]);
                        acc[r][t] = fmaf(wv[4 * e4 + 3], v.w, acc[r][t]);
                    }
                }
            }
        }
    }
    for (int r = 0; r < MM_ROWS; r++) {
        for (int t = 0; t < TT; t++) {
            const float v = sd_warp_sum(acc[r][t]);
            if (lane == 0 && t < nt && r0 + r < rows) {
                mm_store(y, ldy, v, bias, r0 + r, t0 + t, accumulate);
            }
        }
    }
}

/* The kernel for a type and a pass width: TT is the smallest of 1, 2, 4, 8 holding the batch
 * (one pass) or 8 (several passes); a token's arithmetic does not depend on TT. */
template <int TYPE>
static sd_status mm_launch(sd_cuda_ctx *ctx, float *y, int64_t ldy, const uint8_t *w, int64_t rows,
                           int64_t cols, size_t row_bytes, const float *x, int T, const float *bias,
                           int accumulate) {
    const dim3 grid(sd_div_up(rows, MM_WARPS * MM_ROWS), sd_div_up(T, MM_TOK));
    const int tt = T >= MM_TOK ? 8 : T > 2 ? (T > 4 ? 8 : 4) : T;
    const unsigned threads = MM_WARPS * 32;
    const int vec = cols % 4 == 0;
#define MM_FLOAT(TTv)                                                                              \
    mm_float_kernel<TYPE, TTv><<<grid, threads, 0, ctx->stream>>>(                                 \
        y, ldy, w, rows, cols, row_bytes, x, T, bias, accumulate, vec)
#define MM_QUANT(TTv)                                                                              \
    mm_quant_kernel<TYPE, TTv><<<grid, threads, 0, ctx->stream>>>(                                 \
        y, ldy, w, rows, cols, row_bytes, x, T, bias, accumulate)
    if (TYPE == 0 || TYPE == 1 || TYPE == 30) {
        switch (tt) {
        case 1: MM_FLOAT(1); break;
        case 2: MM_FLOAT(2); break;
        case 4: MM_FLOAT(4); break;
        default: MM_FLOAT(8); break;
        }
    } else {
        switch (tt) {
        case 1: MM_QUANT(1); break;
        case 2: MM_QUANT(2); break;
        case 4: MM_QUANT(4); break;
        default: MM_QUANT(8); break;
        }
    }
#undef MM_FLOAT
#undef MM_QUANT
    SD_CUDA_LAUNCHED("matmul kernel");
    return SD_OK;
}

static sd_status mm_small(sd_cuda_ctx *ctx, float *y, int64_t ldy, const void *wv, int type,
                          int64_t rows, int64_t cols, const float *x, int T, const float *bias,
                          int accumulate) {
    const uint8_t *w = (const uint8_t *)wv;
    const int bs = sd_dev_block_size(type);
    if (bs == 0 || cols % bs != 0 || (bs > 1 && cols % 32 != 0)) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "the CUDA matmul has no kernel for type %d with rows of %lld", type,
                            (long long)cols);
    }
    const size_t row_bytes = (size_t)(cols / bs) * (size_t)sd_dev_type_size(type);
    switch (type) {
    case 0: return mm_launch<0>(ctx, y, ldy, w, rows, cols, row_bytes, x, T, bias, accumulate);
    case 1: return mm_launch<1>(ctx, y, ldy, w, rows, cols, row_bytes, x, T, bias, accumulate);
    case 30: return mm_launch<30>(ctx, y, ldy, w, rows, cols, row_bytes, x, T, bias, accumulate);
    case 2: return mm_launch<2>(ctx, y, ldy, w, rows, cols, row_bytes, x, T, bias, accumulate);
    case 3: return mm_launch<3>(ctx, y, ldy, w, rows, cols, row_bytes, x, T, bias, accumulate);
    case 6: return mm_launch<6>(ctx, y, ldy, w, rows, cols, row_bytes, x, T, bias, accumulate);
    case 7: return mm_launch<7>(ctx, y, ldy, w, rows, cols, row_bytes, x, T, bias, accumulate);
    case 8: return mm_launch<8>(ctx, y, ldy, w, rows, cols, row_bytes, x, T, bias, accumulate);
    case 12: return mm_launch<12>(ctx, y, ldy, w, rows, cols, row_bytes, x, T, bias, accumulate);
    case 13: return mm_launch<13>(ctx, y, ldy, w, rows, cols, row_bytes, x, T, bias, accumulate);
    default: return mm_launch<14>(ctx, y, ldy, w, rows, cols, row_bytes, x, T, bias, accumulate);
    }
}

/* ---- cuBLAS (long prefills of float weights) ------------------------------------------------
 * cuBLAS is column-major, we are row-major: a row-major (M x N) array is the column-major
 * (N x M) array with the same bytes. We want Y (T x rows, row-major, leading dimension ldy) =
 * X (T x cols) W^T with W (rows x cols) row-major. In column-major terms Y is Y' (rows x T,
 * ld = ldy), X is X' (cols x T, ld = cols) and W is W' (cols x rows, ld = cols), so
 *     Y' = W'^T X'   :  gemm(op(A) = T, op(B) = N, m = rows, n = T, k = cols,
 *                          A = W, lda = cols, B = X, ldb = cols, C = Y, ldc = ldy).
 * cuBLAS wants A and B of one type, so F16/BF16 weights take X in their type, split in two so
 * that little is lost: X = hi + lo with hi = round(X), lo = round(X - hi) (about 16 bits of
 * mantissa for BF16 instead of 8), Y = W hi + W lo, accumulated in f32 (beta = 1 adds to Y).
 * F16 cannot hold activations beyond 65504. This is the only place cuBLAS is called. */

__global__ void split_half_kernel(uint16_t *hi, uint16_t *lo, const float *src, int64_t n,
                                  int bf16) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float x = src[i];
        const uint16_t h = bf16 ? sd_hd_f32_to_bf16(x) : sd_hd_f32_to_f16(x);
        const float hv = bf16 ? sd_hd_bf16_to_f32(h) : sd_hd_f16_to_f32(h);
        hi[i] = h;
        lo[i] = bf16 ? sd_hd_f32_to_bf16(x - hv) : sd_hd_f32_to_f16(x - hv);
    }
}

__global__ void add_bias_kernel(float *y, int64_t ldy, const float *bias, int64_t rows, int T) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * T) {
        const int64_t t = i / rows, r = i % rows;
        y[(size_t)t * (size_t)ldy + (size_t)r] += bias[r];
    }
}

static sd_status mm_cublas(sd_cuda_ctx *ctx, float *y, int64_t ldy, const void *w, int type,
                           int64_t rows, int64_t cols, const float *x, int T, const float *bias,
                           int accumulate, void *xh_scratch) {
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    if (type == 0) {
        SD_CUBLAS_TRY(cublasSgemm(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, T, (int)cols,
                                  &alpha, (const float *)w, (int)cols, x, (int)cols, &beta, y,
                                  (int)ldy));
    } else {
        const int64_t n = (int64_t)T * cols;
        uint16_t *hi = (uint16_t *)xh_scratch, *lo = hi + n;
        split_half_kernel<<<sd_div_up(n, 256), 256, 0, ctx->stream>>>(hi, lo, x, n, type == 30);
        SD_CUDA_LAUNCHED("split_half_kernel");
        const cudaDataType_t dt = type == 30 ? CUDA_R_16BF : CUDA_R_16F;
        const float one = 1.0f;
        SD_CUBLAS_TRY(cublasGemmEx(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, T, (int)cols,
                                   &alpha, w, dt, (int)cols, hi, dt, (int)cols, &beta, y,
                                   CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        SD_CUBLAS_TRY(cublasGemmEx(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, T, (int)cols,
                                   &alpha, w, dt, (int)cols, lo, dt, (int)cols, &one, y, CUDA_R_32F,
                                   (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    if (bias != NULL) {
        add_bias_kernel<<<sd_div_up(rows * T, 256), 256, 0, ctx->stream>>>(y, ldy, bias, rows, T);
        SD_CUDA_LAUNCHED("add_bias_kernel");
    }
    return SD_OK;
}

sd_status sd_cuda_matmul_cublas(sd_cuda_ctx *ctx, float *y, int64_t ldy, const void *w, int type,
                                int64_t rows, int64_t cols, const float *x, int T,
                                const float *bias, int accumulate, void *xh_scratch) {
    return mm_cublas(ctx, y, ldy, w, type, rows, cols, x, T, bias, accumulate, xh_scratch);
}

extern "C" sd_status sd_cuda_matmul(sd_cuda_ctx *ctx, float *y, int64_t ldy, const void *w,
                                    int type, int64_t rows, int64_t cols, const float *x, int T,
                                    const float *bias, int accumulate) {
    return mm_small(ctx, y, ldy, w, type, rows, cols, x, T, bias, accumulate);
}
