/* matmul.cu — y (T, rows) = x (T, cols) W^T on the GPU for every weight type the loader
 * accepts: F32/F16/BF16 and the quantized blocks (decoded in registers with blocks.h, the
 * decoders the CPU kernels use). One warp computes two rows for up to 8 tokens, each lane
 * walking its own columns with one accumulator per (row, token), then a fixed shuffle tree.
 * A token's arithmetic is therefore the same whatever the batch (no split by batch size, no
 * shared partial sums), so a verify batch reproduces one-token decoding bit for bit, as on
 * the CPU. Long prefills of F16/BF16/F32 matrices may go through cuBLAS instead (tensor
 * cores; SPECDEC_CUDA_CUBLAS=1, off by default), which is fast but not batch-invariant. */
#include "common.cuh"

#define MM_WARPS 8              /* warps per block */
#define MM_ROWS 2               /* rows per warp */
#define MM_TOK 8                /* tokens per pass (blockIdx.y walks the passes) */
#define MM_CHUNK 1024           /* columns of the pass's activations staged in shared memory */
#define MM_UNITS (MM_CHUNK / 4) /* float4 units of one token's chunk */

/* The staged activations: dynamic shared memory, TT * MM_UNITS float4 when staging and none
 * otherwise (a static array would be reserved by every launch, staging or not). */
extern __shared__ float4 mm_staged[];

/* Where unit u (four floats) of a token's staged chunk lives: its low three bits XOR the next
 * three, so that the eight lanes of a quarter warp reading 16 bytes each, 32 or 128 bytes
 * apart, hit eight different groups of four banks. */
__device__ __forceinline__ int mm_swz(int u) {
    return (u & ~7) | ((u & 7) ^ ((u >> 3) & 7));
}

/* Every warp of a block multiplies the same activations with its own rows, and read from global
 * memory they are fetched again for each pair of rows (from L2, for rows longer than L1 holds;
 * a Q4_K row is 4.5 bits a weight, its activations 32). When staging (mm_launch says when),
 * columns [k0, k0 + MM_CHUNK) of the pass's nt tokens are staged in shared memory by the whole
 * block (zeros past cols or nt), the same arithmetic in the same order. Callers sync around it. */
template <int TT>
__device__ __forceinline__ void mm_stage(float4 *xs, const float *xb, int64_t cols, int64_t k0,
                                         int nt) {
    for (int i = threadIdx.x; i < TT * MM_UNITS; i += blockDim.x) {
        const int t = i / MM_UNITS, u = i % MM_UNITS;
        const int64_t k = k0 + 4 * (int64_t)u; /* cols % 4 == 0: a unit is all in or all out */
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (t < nt && k < cols) {
            v = *(const float4 *)(xb + (size_t)t * (size_t)cols + (size_t)k);
        }
        xs[t * MM_UNITS + mm_swz(u)] = v;
    }
}

/* Store (row, token) sums: v + bias, added to y when accumulating (the CPU tile's order). */
__device__ __forceinline__ void mm_store(float *y, int64_t ldy, float v, const float *bias,
                                         int64_t r, int t, int accumulate) {
    v += bias != NULL ? bias[r] : 0.0f;
    float *dst = y + (size_t)t * (size_t)ldy + (size_t)r;
    *dst = accumulate ? *dst + v : v;
}

/* The end of a float-accumulating kernel: each (row, token) partial sum reduced over the warp and
 * stored by lane 0 for the rows and tokens that exist. */
template <int TT>
__device__ __forceinline__ void mm_finish(const float (&acc)[MM_ROWS][TT], float *y, int64_t ldy,
                                          const float *bias, int64_t rows, int64_t r0, int t0,
                                          int nt, int accumulate, int lane) {
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) {
#pragma unroll
        for (int t = 0; t < TT; t++) {
            const float v = sd_warp_sum(acc[r][t]);
            if (lane == 0 && t < nt && r0 + r < rows) {
                mm_store(y, ldy, v, bias, r0 + r, t0 + t, accumulate);
            }
        }
    }
}

/* 8 consecutive elements of a float-typed row (16 bytes of F16/BF16, 32 of F32), as floats. */
template <int TYPE>
__device__ __forceinline__ void mm_load8(float *o, const uint8_t *row, int64_t k) {
    if (TYPE == 0) {
        const float4 a = *(const float4 *)((const float *)row + k);
        const float4 b = *(const float4 *)((const float *)row + k + 4);
        o[0] = a.x;
        o[1] = a.y;
        o[2] = a.z;
        o[3] = a.w;
        o[4] = b.x;
        o[5] = b.y;
        o[6] = b.z;
        o[7] = b.w;
    } else {
        const uint4 v = *(const uint4 *)((const uint16_t *)row + k);
        const uint32_t wds[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const uint16_t lo = (uint16_t)(wds[e] & 0xffffu), hi = (uint16_t)(wds[e] >> 16);
            o[2 * e] = TYPE == 1 ? sd_hd_f16_to_f32(lo) : sd_hd_bf16_to_f32(lo);
            o[2 * e + 1] = TYPE == 1 ? sd_hd_f16_to_f32(hi) : sd_hd_bf16_to_f32(hi);
        }
    }
}

/* One step of a lane over float weights: 8 columns from k of the warp's rows, times each of the
 * nt tokens' 8 activations there (x_at(t, a, b) gives them as two float4: from shared memory or
 * global memory, the same arithmetic either way). */
template <int TYPE, int TT, typename XAt>
__device__ __forceinline__ void mm_float_step(float (&acc)[MM_ROWS][TT], const uint8_t *w,
                                              size_t row_bytes, int64_t r0, int64_t rows, int64_t k,
                                              int nt, XAt x_at) {
    float wv[MM_ROWS][8];
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) {
        if (r0 + r < rows) {
            mm_load8<TYPE>(wv[r], w + (size_t)(r0 + r) * row_bytes, k);
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) {
        if (t < nt) {
            float4 a, b;
            x_at(t, a, b);
            const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int r = 0; r < MM_ROWS; r++) {
                if (r0 + r < rows) {
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        acc[r][t] = fmaf(wv[r][e], xv[e], acc[r][t]);
                    }
                }
            }
        }
    }
}

/* Float weights (TYPE 0 F32, 1 F16, 30 BF16). vec: cols % 8 == 0, so rows of W and x are 16-
 * byte aligned and a lane takes 8 columns at a time (16-byte loads); else one at a time. Which
 * of the two depends on cols only, never on the batch. */
template <int TYPE, int TT>
__global__ void __launch_bounds__(MM_WARPS * 32)
    mm_float_kernel(float *y, int64_t ldy, const uint8_t *w, int64_t rows, int64_t cols,
                    size_t row_bytes, const float *x, int T, const float *bias, int accumulate,
                    int vec, int stage) {
    const int warp = threadIdx.x / SD_WARP, lane = threadIdx.x % SD_WARP;
    const int64_t r0 = ((int64_t)blockIdx.x * MM_WARPS + warp) * MM_ROWS;
    const int t0 = blockIdx.y * MM_TOK;
    const int nt = T - t0 < TT ? T - t0 : TT;
    float acc[MM_ROWS][TT] = {};
    const float *xb = x + (size_t)t0 * (size_t)cols;
    if (vec && stage) {
        /* staging: the activations from shared memory, chunk by chunk; the same columns in the
         * same order as below, so the same bits. Every warp takes part in the staging, also one
         * past the last row. */
        float4 *xs = mm_staged;
        for (int64_t k0 = 0; k0 < cols; k0 += MM_CHUNK) {
            __syncthreads();
            mm_stage<TT>(xs, xb, cols, k0, nt);
            __syncthreads();
            if (r0 >= rows) {
                continue;
            }
            for (int kk = lane * 8; kk < MM_CHUNK && k0 + kk < cols; kk += 8 * SD_WARP) {
                mm_float_step<TYPE, TT>(acc, w, row_bytes, r0, rows, k0 + kk, nt,
                                        [&](int t, float4 &xa, float4 &xb4) {
                                            xa = xs[t * MM_UNITS + mm_swz(kk / 4)];
                                            xb4 = xs[t * MM_UNITS + mm_swz(kk / 4 + 1)];
                                        });
            }
        }
        if (r0 < rows) {
            mm_finish<TT>(acc, y, ldy, bias, rows, r0, t0, nt, accumulate, lane);
        }
        return;
    }
    if (r0 >= rows) {
        return;
    }
    if (vec) {
        for (int64_t k = (int64_t)lane * 8; k < cols; k += 8 * SD_WARP) {
            mm_float_step<TYPE, TT>(acc, w, row_bytes, r0, rows, k, nt,
                                    [&](int t, float4 &xa, float4 &xb4) {
                                        const float *xt = xb + (size_t)t * (size_t)cols + k;
                                        xa = *(const float4 *)xt;
                                        xb4 = *(const float4 *)(xt + 4);
                                    });
        }
    } else {
        for (int64_t k = lane; k < cols; k += SD_WARP) {
#pragma unroll
            for (int r = 0; r < MM_ROWS; r++) {
                if (r0 + r < rows) {
                    const float wv = sd_dev_float_at(TYPE, w + (size_t)(r0 + r) * row_bytes, k);
#pragma unroll
                    for (int t = 0; t < TT; t++) {
                        if (t < nt) {
                            acc[r][t] = fmaf(wv, xb[(size_t)t * (size_t)cols + k], acc[r][t]);
                        }
                    }
                }
            }
        }
    }
    mm_finish<TT>(acc, y, ldy, bias, rows, r0, t0, nt, accumulate, lane);
}

/* ---- BF16 on the tensor cores -----------------------------------------------------------------
 * mma.sync m16n8k16 (bf16 x bf16 -> f32): a warp computes 16 rows x 8 tokens at a time. The
 * activations enter as two bf16 halves, x = hi + lo (hi = bf16(x), lo = bf16(x - hi)), so a
 * product keeps about 16 bits of x, not 8; two mmas per step. Each output column is one token's
 * dot product, untouched by the other columns, so a token's bits do not depend on the batch.
 * The k order inside a 64-column chunk is permuted the same way for weights and activations
 * (lane t4 of a quad owns columns 16 t4 .. 16 t4 + 15 of the chunk, loaded with 16-byte loads;
 * mma step s takes its elements 4s .. 4s + 3 into the fragment slots 2 t4, 2 t4 + 1, 2 t4 + 8,
 * 2 t4 + 9), which a sum over k does not see. */

__device__ __forceinline__ void mma_bf16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    return (uint32_t)sd_hd_f32_to_bf16(lo) | ((uint32_t)sd_hd_f32_to_bf16(hi) << 16);
}

__device__ __forceinline__ float round_bf16(float x) {
    return sd_hd_bf16_to_f32(sd_hd_f32_to_bf16(x));
}

#define MMA_WARPS 4

/* NT tiles of 8 tokens (blockIdx.y walks groups of NT tiles); rows in tiles of 16 per warp. */
template <int NT>
__global__ void __launch_bounds__(MMA_WARPS * 32)
    mm_bf16_mma_kernel(float *y, int64_t ldy, const uint16_t *w, int64_t rows, int64_t cols,
                       const float *x, int T, const float *bias, int accumulate) {
    const int warp = threadIdx.x / SD_WARP, lane = threadIdx.x % SD_WARP;
    const int g = lane >> 2, t4 = lane & 3;
    const int64_t r0 = ((int64_t)blockIdx.x * MMA_WARPS + warp) * 16;
    const int tb = blockIdx.y * 8 * NT;
    if (r0 >= rows) {
        return;
    }
    const bool ra = r0 + g < rows, rb = r0 + g + 8 < rows;
    const uint16_t *wa = w + (size_t)(ra ? r0 + g : 0) * (size_t)cols;
    const uint16_t *wb = w + (size_t)(rb ? r0 + g + 8 : 0) * (size_t)cols;
    float c[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) {
        c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
    }
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int64_t k0 = 0; k0 < cols; k0 += 64) {
        const int64_t kk = k0 + 16 * t4;
        /* this lane's 16 weights of rows g and g + 8: words j hold elements 2j, 2j + 1 */
        uint32_t wA[8], wB[8];
        {
            const uint4 a0 = ra ? *(const uint4 *)(wa + kk) : zero;
            const uint4 a1 = ra ? *(const uint4 *)(wa + kk + 8) : zero;
            const uint4 b0 = rb ? *(const uint4 *)(wb + kk) : zero;
            const uint4 b1 = rb ? *(const uint4 *)(wb + kk + 8) : zero;
            const uint32_t t[16] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w,
                                    b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                wA[j] = t[j];
                wB[j] = t[8 + j];
            }
        }
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const int tok = tb + 8 * n + g;
            float xv[16];
            if (tok < T) {
                const float4 *xp = (const float4 *)(x + (size_t)tok * (size_t)cols + kk);
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const float4 v = xp[q];
                    xv[4 * q] = v.x;
                    xv[4 * q + 1] = v.y;
                    xv[4 * q + 2] = v.z;
                    xv[4 * q + 3] = v.w;
                }
            } else {
#pragma unroll
                for (int e = 0; e < 16; e++) {
                    xv[e] = 0.0f;
                }
            }
            for (int st = 0; st < 4; st++) { /* elements 4 st .. 4 st + 3 */
                const uint32_t a[4] = {wA[2 * st], wB[2 * st], wA[2 * st + 1], wB[2 * st + 1]};
                float hi[4], lo[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    hi[e] = round_bf16(xv[4 * st + e]);
                    lo[e] = xv[4 * st + e] - hi[e];
                }
                mma_bf16(c[n], a, pack_bf16(hi[0], hi[1]), pack_bf16(hi[2], hi[3]));
                mma_bf16(c[n], a, pack_bf16(lo[0], lo[1]), pack_bf16(lo[2], lo[3]));
            }
        }
    }
/* c[n][0..1]: row g, tokens 2 t4, 2 t4 + 1 of tile n; c[n][2..3]: row g + 8, the same */
#pragma unroll
    for (int n = 0; n < NT; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t r = r0 + g + (e >= 2 ? 8 : 0);
            const int tok = tb + 8 * n + 2 * t4 + (e & 1);
            if (r < rows && tok < T) {
                mm_store(y, ldy, c[n][e], bias, r, tok, accumulate);
            }
        }
    }
}

static sd_status mm_bf16_mma(sd_cuda_ctx *ctx, float *y, int64_t ldy, const uint16_t *w,
                             int64_t rows, int64_t cols, const float *x, int T, const float *bias,
                             int accumulate) {
    const int nt = T > 8 ? 2 : 1; /* 8 or 16 tokens per block */
    const dim3 grid(sd_div_up(rows, MMA_WARPS * 16), sd_div_up(T, 8 * nt));
    if (nt == 2) {
        mm_bf16_mma_kernel<2><<<grid, MMA_WARPS * 32, 0, ctx->stream>>>(y, ldy, w, rows, cols, x, T,
                                                                        bias, accumulate);
    } else {
        mm_bf16_mma_kernel<1><<<grid, MMA_WARPS * 32, 0, ctx->stream>>>(y, ldy, w, rows, cols, x, T,
                                                                        bias, accumulate);
    }
    SD_CUDA_LAUNCHED("mm_bf16_mma_kernel");
    return SD_OK;
}

/* Sub-block `sub` of a 16-byte-aligned Q4_K block as 32 floats, from three 16-byte loads (the
 * header and the sub-block's 32 bytes of nibbles) instead of sd_blk_decode_q4_K's byte reads:
 * the same fields and the same roundings, so the same floats (value = d sc q - dmin m). */
__device__ __forceinline__ void mm_q4k_floats(float (&wv)[32], const uint8_t *blk, int sub) {
    const uint4 h = *(const uint4 *)blk; /* f16 d | f16 dmin | 12 bytes of scales and mins */
    const uint4 qa = *(const uint4 *)(blk + 16 + 32 * (sub / 2));
    const uint4 qb = *(const uint4 *)(blk + 32 + 32 * (sub / 2));
    /* scale byte i (0..11) of blk + 4 */
    const auto sb = [&](int i) -> uint32_t {
        const uint32_t wd = i < 4 ? h.y : i < 8 ? h.z : h.w;
        return (wd >> (8 * (i & 3))) & 0xFFu;
    };
    uint32_t sc, mn;
    if (sub < 4) {
        sc = sb(sub) & 63u;
        mn = sb(sub + 4) & 63u;
    } else {
        sc = (sb(sub + 4) & 0x0Fu) | ((sb(sub - 4) >> 6) << 4);
        mn = (sb(sub + 4) >> 4) | ((sb(sub) >> 6) << 4);
    }
    const float d = __fmul_rn(sd_hd_f16_to_f32((uint16_t)(h.x & 0xFFFFu)), (float)sc);
    const float m = -__fmul_rn(sd_hd_f16_to_f32((uint16_t)(h.x >> 16)), (float)mn);
    const int shift = 4 * (sub % 2);
    const uint32_t q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
    for (int e = 0; e < 32; e++) {
        const uint32_t nib = (q[e / 4] >> (8 * (e % 4) + shift)) & 0x0Fu;
        wv[e] = __fadd_rn(__fmul_rn(d, (float)nib), m);
    }
}

/* Quantized weights: a lane takes one 32-element sub-block of a row at a time, decodes it
 * (value = d * q + m per element, rounded as the CPU's to_float) and multiplies it with each
 * token. a16: the weights and their rows are 16-byte aligned (always, for the model's weights
 * on the device), so Q4_K decodes with vector loads (mm_q4k_floats). */
template <int TYPE, int TT>
__global__ void __launch_bounds__(MM_WARPS * 32)
    mm_quant_kernel(float *y, int64_t ldy, const uint8_t *w, int64_t rows, int64_t cols,
                    size_t row_bytes, const float *x, int T, const float *bias, int accumulate,
                    int stage, int a16) {
    const int warp = threadIdx.x / SD_WARP, lane = threadIdx.x % SD_WARP;
    const int64_t r0 = ((int64_t)blockIdx.x * MM_WARPS + warp) * MM_ROWS;
    const int t0 = blockIdx.y * MM_TOK;
    const int nt = T - t0 < TT ? T - t0 : TT;
    const bool st = stage != 0;
    if (!st && r0 >= rows) { /* when staging, the warp still takes part */
        return;
    }
    constexpr int BS = TYPE == 12 || TYPE == 13 || TYPE == 14 ? 256 : 32;
    const int ts = sd_dev_type_size(TYPE);
    float acc[MM_ROWS][TT] = {};
    const float *xb = x + (size_t)t0 * (size_t)cols;
    const int64_t nsub = cols / 32;
    /* staging (SPECDEC_CUDA_STAGE=1): the activations from shared memory (mm_stage), a chunk of
     * MM_CHUNK columns being one 32-column sub-block per lane: the same sub-blocks in the same
     * order as without. */
    float4 *xs = mm_staged;
    for (int64_t j0 = 0; j0 < nsub; j0 += SD_WARP) {
        if (st) {
            __syncthreads();
            mm_stage<TT>(xs, xb, cols, j0 * 32, nt);
            __syncthreads();
        }
        const int64_t j = j0 + lane;
        if (r0 >= rows || j >= nsub) {
            continue;
        }
        const int64_t blk = j * 32 / BS;
        const int sub = (int)(j * 32 % BS) / 32;
#pragma unroll
        for (int r = 0; r < MM_ROWS; r++) {
            if (r0 + r >= rows) {
                continue;
            }
            const uint8_t *bp = w + (size_t)(r0 + r) * row_bytes + (size_t)blk * ts;
            float wv[32];
            if (TYPE == 12 && a16) {
                mm_q4k_floats(wv, bp, sub);
            } else {
                sd_sub32 s;
                sd_dev_decode(TYPE, &s, bp, sub);
#pragma unroll
                for (int e = 0; e < 32; e++) {
                    /* d * q, then + m: the C decoder's two roundings (no fused multiply-add) */
                    wv[e] = __fadd_rn(__fmul_rn(e < 16 ? s.d_lo : s.d_hi, (float)s.q[e]), s.m);
                }
            }
#pragma unroll
            for (int t = 0; t < TT; t++) {
                if (t < nt) {
                    const float4 *xt =
                        (const float4 *)(xb + (size_t)t * (size_t)cols + (size_t)j * 32);
#pragma unroll
                    for (int e4 = 0; e4 < 8; e4++) {
                        const float4 v = st ? xs[t * MM_UNITS + mm_swz(lane * 8 + e4)] : xt[e4];
                        acc[r][t] = fmaf(wv[4 * e4 + 0], v.x, acc[r][t]);
                        acc[r][t] = fmaf(wv[4 * e4 + 1], v.y, acc[r][t]);
                        acc[r][t] = fmaf(wv[4 * e4 + 2], v.z, acc[r][t]);
                        acc[r][t] = fmaf(wv[4 * e4 + 3], v.w, acc[r][t]);
                    }
                }
            }
        }
    }
    if (r0 >= rows) {
        return;
    }
    mm_finish<TT>(acc, y, ldy, bias, rows, r0, t0, nt, accumulate, lane);
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
    const int vec = cols % 8 == 0;
    const bool is_float = TYPE == 0 || TYPE == 1 || TYPE == 30;
    /* Staged activations (the same bits either way, so the choice may follow the batch): by
     * default where they measured faster on an H200 (benchmarks/RESULTS.md): quantized rows at
     * every T, float rows from 2 tokens (one token alone was 13 % slower staged). */
    const int stage = ctx->stage_x >= 0 ? ctx->stage_x : !is_float || T >= 2;
    const int a16 = ((uintptr_t)w % 16 == 0 && row_bytes % 16 == 0) ? 1 : 0;
    /* the staged activations' shared memory (mm_staged), asked for only when staging */
    const auto smem = [&](int width) -> size_t {
        return stage ? (size_t)width * MM_UNITS * sizeof(float4) : 0;
    };
#define MM_FLOAT(TTv)                                                                              \
    mm_float_kernel<TYPE, TTv><<<grid, threads, smem(TTv), ctx->stream>>>(                         \
        y, ldy, w, rows, cols, row_bytes, x, T, bias, accumulate, vec, stage)
#define MM_QUANT(TTv)                                                                              \
    mm_quant_kernel<TYPE, TTv><<<grid, threads, smem(TTv), ctx->stream>>>(                         \
        y, ldy, w, rows, cols, row_bytes, x, T, bias, accumulate, stage, a16)
    if (is_float) {
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
    if (type == 30 && ctx->use_mma && cols % 64 == 0) {
        return mm_bf16_mma(ctx, y, ldy, (const uint16_t *)w, rows, cols, x, T, bias, accumulate);
    }
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

extern "C" sd_status sd_cuda_matmul_mma(sd_cuda_ctx *ctx, float *y, int64_t ldy, const void *w,
                                        int type, int64_t rows, int64_t cols, const float *x, int T,
                                        const float *bias, int accumulate) {
    if (type != 30 || cols % 64 != 0) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "the tensor-core matmul takes BF16 rows of a multiple of 64 elements, "
                            "got type %d with rows of %lld",
                            type, (long long)cols);
    }
    return mm_bf16_mma(ctx, y, ldy, (const uint16_t *)w, rows, cols, x, T, bias, accumulate);
}
