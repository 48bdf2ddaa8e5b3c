/* ops.cu — the forward pass's elementwise and attention kernels on the GPU: embedding gather,
 * RMSNorm, RoPE, SwiGLU, KV-cache writes and masked attention over the cache, plus the
 * dummy-weight fill. Each launcher has its CPU twin in csrc/check/twins.c (same arguments after the
 * context); the kernel checks compare the two. Row-major arrays; T tokens. */
#include <math.h>

#include "common.cuh"
#include "../csrc/model/dummy.h"

/* ---- context ----------------------------------------------------------------------------------
 */

const char *sd_cublas_status_name(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_(unknown)";
    }
}

#define SD_CUBLAS_WORKSPACE (32u << 20)

sd_status sd_cuda_ctx_init(sd_cuda_ctx *ctx, int device) {
    memset(ctx, 0, sizeof(*ctx));
    ctx->device = device;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        n = 0;
    }
    if (device < 0 || device >= n) {
        return sd_set_error(SD_ERR_CUDA,
                            "CUDA device %d is not available (%d visible: no GPU or driver, or "
                            "CUDA_VISIBLE_DEVICES hides it)",
                            device, n);
    }
    SD_CUDA_TRY(cudaSetDevice(device));
    SD_CUDA_TRY(cudaDeviceGetAttribute(&ctx->n_sms, cudaDevAttrMultiProcessorCount, device));
    const char *mma = getenv("SPECDEC_CUDA_MMA");
    ctx->use_mma = mma != NULL && strcmp(mma, "0") != 0 && *mma != '\0';
    const char *stage = getenv("SPECDEC_CUDA_STAGE");
    ctx->stage_x = stage == NULL || *stage == '\0' ? -1 : strcmp(stage, "0") != 0;
    SD_CUDA_TRY(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
    SD_CUBLAS_TRY(cublasCreate(&ctx->cublas));
    SD_CUBLAS_TRY(cublasSetStream(ctx->cublas, ctx->stream));
    SD_CUDA_TRY(cudaMalloc(&ctx->workspace, SD_CUBLAS_WORKSPACE));
    ctx->workspace_bytes = SD_CUBLAS_WORKSPACE;
    SD_CUBLAS_TRY(cublasSetWorkspace(ctx->cublas, ctx->workspace, ctx->workspace_bytes));
    return SD_OK;
}

void sd_cuda_ctx_release(sd_cuda_ctx *ctx) {
    if (ctx->cublas != NULL) {
        cublasDestroy(ctx->cublas);
    }
    if (ctx->workspace != NULL) {
        cudaFree(ctx->workspace);
    }
    if (ctx->stream != NULL) {
        cudaStreamDestroy(ctx->stream);
    }
    memset(ctx, 0, sizeof(*ctx));
}

extern "C" int sd_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky error of a machine without a driver */
        n = 0;
    }
    return n;
}

extern "C" sd_status sd_cuda_ctx_create(sd_cuda_ctx **out) {
    *out = NULL;
    sd_cuda_ctx *ctx = (sd_cuda_ctx *)calloc(1, sizeof(*ctx));
    if (ctx == NULL) {
        return sd_set_error(SD_ERR_NOMEM, "out of memory");
    }
    const sd_status st = sd_cuda_ctx_init(ctx, 0);
    if (st != SD_OK) {
        sd_cuda_ctx_release(ctx);
        free(ctx);
        return st;
    }
    *out = ctx;
    return SD_OK;
}

extern "C" void sd_cuda_ctx_free(sd_cuda_ctx *ctx) {
    if (ctx != NULL) {
        sd_cuda_ctx_release(ctx);
        free(ctx);
    }
}

extern "C" sd_status sd_cuda_alloc(sd_cuda_ctx *ctx, void **dev, size_t bytes) {
    (void)ctx;
    *dev = NULL;
    SD_CUDA_TRY(cudaMalloc(dev, bytes > 0 ? bytes : 1));
    return SD_OK;
}

extern "C" void sd_cuda_free(sd_cuda_ctx *ctx, void *dev) {
    (void)ctx;
    if (dev != NULL) {
        cudaFree(dev);
    }
}

extern "C" sd_status sd_cuda_upload(sd_cuda_ctx *ctx, void *dev, const void *host, size_t bytes) {
    SD_CUDA_TRY(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, ctx->stream));
    SD_CUDA_TRY(cudaStreamSynchronize(ctx->stream));
    return SD_OK;
}

extern "C" sd_status sd_cuda_download(sd_cuda_ctx *ctx, void *host, const void *dev, size_t bytes) {
    SD_CUDA_TRY(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, ctx->stream));
    SD_CUDA_TRY(cudaStreamSynchronize(ctx->stream));
    return SD_OK;
}

extern "C" sd_status sd_cuda_sync(sd_cuda_ctx *ctx) {
    SD_CUDA_TRY(cudaStreamSynchronize(ctx->stream));
    return SD_OK;
}

/* ---- embedding ------------------------------------------------------------------------------- */

/* One thread per output element (float types) or per 32-element sub-block (quantized): `items`
 * of them per token, T tokens along one grid dimension (long prompts fit). */
__global__ void embed_kernel(float *out, const uint8_t *table, int type, int64_t D,
                             size_t row_bytes, const int32_t *tokens, int T, int64_t items) {
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (int64_t)T * items) {
        return;
    }
    const int t = (int)(g / items);
    const int64_t i = g % items;
    const uint8_t *row = table + (size_t)tokens[t] * row_bytes;
    float *o = out + (size_t)t * (size_t)D;
    const int bs = sd_dev_block_size(type);
    if (bs == 1) {
        if (i < D) {
            o[i] = sd_dev_float_at(type, row, i);
        }
        return;
    }
    if (i * 32 >= D) {
        return;
    }
    const int64_t b = i * 32 / bs;
    const int sub = (int)((i * 32 % bs) / 32);
    sd_sub32 s;
    sd_dev_decode(type, &s, row + (size_t)b * (size_t)sd_dev_type_size(type), sub);
    for (int j = 0; j < 32; j++) {
        o[i * 32 + j] = __fadd_rn(__fmul_rn(j < 16 ? s.d_lo : s.d_hi, (float)s.q[j]), s.m);
    }
}

extern "C" sd_status sd_cuda_embed(sd_cuda_ctx *ctx, float *out, const void *table, int type,
                                   int64_t D, const int32_t *tokens, int T) {
    const int bs = sd_dev_block_size(type);
    if (bs == 0 || D % bs != 0) {
        return sd_set_error(SD_ERR_UNSUPPORTED, "embedding of type %d with rows of %lld", type,
                            (long long)D);
    }
    const size_t row_bytes = (size_t)(D / bs) * (size_t)sd_dev_type_size(type);
    const int64_t items = bs == 1 ? D : D / 32;
    embed_kernel<<<sd_div_up(items * T, 128), 128, 0, ctx->stream>>>(
        out, (const uint8_t *)table, type, D, row_bytes, tokens, T, items);
    SD_CUDA_LAUNCHED("embed_kernel");
    return SD_OK;
}

/* ---- RMSNorm --------------------------------------------------------------------------------- */

/* One block per row: out = x / sqrt(mean(x^2) + eps) * w, as (x * scale) * w. */
__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int n, float eps) {
    __shared__ float sh[32];
    const float *xr = x + (size_t)blockIdx.x * (size_t)n;
    float *o = out + (size_t)blockIdx.x * (size_t)n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        ss = fmaf(xr[i], xr[i], ss);
    }
    ss = sd_block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        o[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
    }
}

extern "C" sd_status sd_cuda_rmsnorm(sd_cuda_ctx *ctx, float *out, const float *x, const float *w,
                                     int T, int n, float eps) {
    rmsnorm_kernel<<<(unsigned)T, 256, 0, ctx->stream>>>(out, x, w, n, eps);
    SD_CUDA_LAUNCHED("rmsnorm_kernel");
    return SD_OK;
}

/* ---- a drafter head's input ----------------------------------------------------------------- */

/* One block per row t: out (T, 2n) row t = cat(rmsnorm(e_t) * w_in, rmsnorm(x_t) * w_hid), the
 * attention input of an EAGLE-3 head's layer; with norm_residual, x_t becomes the normed x as
 * well (speculators' norm_before_residual). Each half as rmsnorm_kernel computes it. */
__global__ void head_input_kernel(float *out, const float *e, float *x, const float *w_in,
                                  const float *w_hid, int n, float eps, int norm_residual) {
    __shared__ float sh[32];
    const size_t t = blockIdx.x;
    const float *er = e + t * (size_t)n;
    float *xr = x + t * (size_t)n;
    float *o = out + t * 2 * (size_t)n;
    float se = 0.0f, sx = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        se = fmaf(er[i], er[i], se);
        sx = fmaf(xr[i], xr[i], sx);
    }
    se = sd_block_sum(se, sh);
    sx = sd_block_sum(sx, sh);
    const float ce = 1.0f / sqrtf(se / (float)n + eps), cx = 1.0f / sqrtf(sx / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        o[i] = __fmul_rn(__fmul_rn(er[i], ce), w_in[i]);
        o[n + i] = __fmul_rn(__fmul_rn(xr[i], cx), w_hid[i]);
    }
    if (norm_residual) {
        __syncthreads(); /* every thread's reads of x are done */
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            xr[i] = o[n + i];
        }
    }
}

extern "C" sd_status sd_cuda_head_input(sd_cuda_ctx *ctx, float *out, const float *e, float *x,
                                        const float *w_in, const float *w_hid, int T, int n,
                                        float eps, int norm_residual) {
    if (T < 1) {
        return SD_OK;
    }
    head_input_kernel<<<(unsigned)T, 256, 0, ctx->stream>>>(out, e, x, w_in, w_hid, n, eps,
                                                            norm_residual);
    SD_CUDA_LAUNCHED("head_input_kernel");
    return SD_OK;
}

/* x += silu(u) elementwise: a Medusa residual block after its linear layer. */
__global__ void silu_add_kernel(float *x, const float *u, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = u[i];
        x[i] = __fadd_rn(x[i], __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))));
    }
}

extern "C" sd_status sd_cuda_silu_add(sd_cuda_ctx *ctx, float *x, const float *u, int64_t n) {
    if (n < 1) {
        return SD_OK;
    }
    silu_add_kernel<<<sd_div_up(n, 256), 256, 0, ctx->stream>>>(x, u, n);
    SD_CUDA_LAUNCHED("silu_add_kernel");
    return SD_OK;
}

/* ---- RoPE ------------------------------------------------------------------------------------ */

/* One thread per (token, head, pair); the angle pos * freq in double, as the CPU forward. */
__global__ void rope_kernel(float *x, const int32_t *pos, const double *freq, int T, int n_heads,
                            int head_dim, int neox) {
    const int half = head_dim / 2;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * n_heads * half) {
        return;
    }
    const int i = (int)(idx % half);
    const int64_t th = idx / half; /* token * n_heads + head */
    const int t = (int)(th / n_heads);
    float *v = x + (size_t)th * (size_t)head_dim;
    const double a = (double)pos[t] * freq[i];
    const float co = (float)cos(a), si = (float)sin(a);
    const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
    const float x0 = v[ia], x1 = v[ib];
    v[ia] = __fsub_rn(__fmul_rn(x0, co), __fmul_rn(x1, si));
    v[ib] = __fadd_rn(__fmul_rn(x0, si), __fmul_rn(x1, co));
}

extern "C" sd_status sd_cuda_rope(sd_cuda_ctx *ctx, float *x, const int32_t *pos,
                                  const double *freq, int T, int n_heads, int head_dim, int neox) {
    const int64_t n = (int64_t)T * n_heads * (head_dim / 2);
    rope_kernel<<<sd_div_up(n, 256), 256, 0, ctx->stream>>>(x, pos, freq, T, n_heads, head_dim,
                                                            neox);
    SD_CUDA_LAUNCHED("rope_kernel");
    return SD_OK;
}

/* ---- SwiGLU ---------------------------------------------------------------------------------- */

__global__ void swiglu_kernel(float *out, const float *gate, const float *up, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = gate[i];
        out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
    }
}

extern "C" sd_status sd_cuda_swiglu(sd_cuda_ctx *ctx, float *out, const float *gate,
                                    const float *up, int64_t n) {
    swiglu_kernel<<<sd_div_up(n, 256), 256, 0, ctx->stream>>>(out, gate, up, n);
    SD_CUDA_LAUNCHED("swiglu_kernel");
    return SD_OK;
}

/* ---- KV cache -------------------------------------------------------------------------------- */

/* Layer `layer` of the cache kd describes, (Hkv, capacity, Dh): token t's rows of k, v
 * (T, Hkv * Dh) go to slots[t]. The cache is read from kd at run time, so a captured graph
 * serves any cache. */
__global__ void kv_write_kernel(const sd_cuda_kv_desc *kd, int layer, const float *k,
                                const float *v, const int32_t *slots, int T, int n_kv_heads,
                                int head_dim) {
    const int64_t kvd = (int64_t)n_kv_heads * head_dim;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * kvd) {
        return;
    }
    const size_t cap = (size_t)kd->capacity;
    const size_t base = (size_t)layer * (size_t)n_kv_heads * cap * (size_t)head_dim;
    const int t = (int)(idx / kvd);
    const int h = (int)(idx % kvd / head_dim), d = (int)(idx % head_dim);
    const size_t dst = base + ((size_t)h * cap + (size_t)slots[t]) * (size_t)head_dim + d;
    kd->k[dst] = k[idx];
    kd->v[dst] = v[idx];
}

sd_status sd_cuda_kv_write_dev(sd_cuda_ctx *ctx, const sd_cuda_kv_desc *kd, int layer,
                               const float *k, const float *v, const int32_t *slots, int T,
                               int n_kv_heads, int head_dim) {
    const int64_t n = (int64_t)T * n_kv_heads * head_dim;
    kv_write_kernel<<<sd_div_up(n, 256), 256, 0, ctx->stream>>>(kd, layer, k, v, slots, T,
                                                                n_kv_heads, head_dim);
    SD_CUDA_LAUNCHED("kv_write_kernel");
    return SD_OK;
}

/* A descriptor of one cache layer (kc, vc, capacity) in device memory, for the single-kernel
 * launchers of the kernel checks. */
static sd_status temp_desc(sd_cuda_ctx *ctx, sd_cuda_kv_desc **out, float *kc, float *vc,
                           int capacity) {
    sd_cuda_kv_desc h;
    memset(&h, 0, sizeof(h));
    h.k = kc;
    h.v = vc;
    h.capacity = capacity;
    SD_CUDA_TRY(cudaMalloc((void **)out, sizeof(h)));
    SD_CUDA_TRY(cudaMemcpyAsync(*out, &h, sizeof(h), cudaMemcpyHostToDevice, ctx->stream));
    SD_CUDA_TRY(cudaStreamSynchronize(ctx->stream)); /* h is on this stack */
    return SD_OK;
}

extern "C" sd_status sd_cuda_kv_write(sd_cuda_ctx *ctx, float *kc, float *vc, const float *k,
                                      const float *v, const int32_t *slots, int T, int n_kv_heads,
                                      int head_dim, int capacity) {
    sd_cuda_kv_desc *kd = NULL;
    sd_status st = temp_desc(ctx, &kd, kc, vc, capacity);
    if (st == SD_OK) {
        st = sd_cuda_kv_write_dev(ctx, kd, 0, k, v, slots, T, n_kv_heads, head_dim);
    }
    if (st == SD_OK) {
        st = sd_cuda_sync(ctx);
    }
    cudaFree(kd);
    return st;
}

/* ---- attention ------------------------------------------------------------------------------- */

#define ATTN_WARPS 4
#define ATTN_MAX_DH 256

/* One block per (token, head), a warp per key at a time (the open keys of ranks warp, warp + 4,
 * ...): the score q . k_s * scale from the head dimension spread over the lanes, then an online
 * softmax (running max m, sum l and weighted values, each lane holding head_dim / 32 of them);
 * the four warps' partial results are merged at the end. Only slots the token's mask opens
 * count. A query's arithmetic depends on the keys its mask opens, in slot order, alone: never
 * on the batch, nor on where closed slots lie between them. */
__global__ void __launch_bounds__(ATTN_WARPS * 32)
    attention_kernel(float *out, const float *q, const sd_cuda_kv_desc *kd, int layer,
                     const uint8_t *mask, const int *n_attn_dev, int n_heads, int n_kv_heads,
                     int head_dim, float scale) {
    __shared__ float sm[ATTN_WARPS], sl[ATTN_WARPS];
    __shared__ float sacc[ATTN_WARPS][ATTN_MAX_DH];
    const int th = blockIdx.x; /* token * H + head */
    const int t = th / n_heads, h = th % n_heads;
    const int kvh = h / (n_heads / n_kv_heads);
    const int n_attn = *n_attn_dev;
    const size_t capacity = (size_t)kd->capacity;
    const size_t head = capacity * (size_t)head_dim;
    const size_t base = ((size_t)layer * (size_t)n_kv_heads + (size_t)kvh) * head;
    const float *qv = q + (size_t)th * (size_t)head_dim;
    const float *k = kd->k + base;
    const float *v = kd->v + base;
    const uint8_t *m = mask + (size_t)t * (size_t)n_attn;
    const int lane = threadIdx.x % SD_WARP, warp = threadIdx.x / SD_WARP;
    const int per = (head_dim + SD_WARP - 1) / SD_WARP; /* elements per lane, <= 8 */
    float qr[ATTN_MAX_DH / SD_WARP], acc[ATTN_MAX_DH / SD_WARP];
    for (int e = 0; e < ATTN_MAX_DH / SD_WARP; e++) {
        const int i = lane + SD_WARP * e;
        qr[e] = e < per && i < head_dim ? qv[i] : 0.0f;
        acc[e] = 0.0f;
    }
    float mx = -INFINITY, l = 0.0f;
    /* The open keys are dealt to the warps by their rank among the open keys (warp w takes
     * ranks w, w + 4, ...), not by slot: a tree node's ancestors sit at scattered slots in the
     * verify forward and at consecutive ones after compaction, and both must give the same
     * bits. A chunk of 32 slots at a time: the lanes' mask bytes as one ballot, then this
     * warp's set bits in slot order. */
    int rank = 0; /* open keys before this chunk */
    for (int s0 = 0; s0 < n_attn; s0 += SD_WARP) {
        const unsigned all = __ballot_sync(0xffffffffu, s0 + lane < n_attn && m[s0 + lane] != 0);
        unsigned open = all;
        for (int skip = ((warp - rank) % ATTN_WARPS + ATTN_WARPS) % ATTN_WARPS; skip > 0 && open;
             skip--) {
            open &= open - 1; /* drop the lowest open key: another warp's */
        }
        rank += __popc(all);
        while (open != 0) {
            const int s = s0 + __ffs((int)open) - 1;
            for (int j = 0; j < ATTN_WARPS && open != 0; j++) {
                open &= open - 1; /* this key, then the next three open ones (other warps') */
            }
            const float *ks = k + (size_t)s * (size_t)head_dim;
            float d = 0.0f;
            for (int e = 0; e < per; e++) {
                const int i = lane + SD_WARP * e;
                if (i < head_dim) {
                    d = fmaf(qr[e], ks[i], d);
                }
            }
            const float sc = sd_warp_sum(d) * scale;
            const float mn = fmaxf(mx, sc);
            const float corr = expf(mx - mn); /* 0 for the first open key (mx = -inf) */
            const float p = expf(sc - mn);
            l = l * corr + p;
            const float *vs = v + (size_t)s * (size_t)head_dim;
            for (int e = 0; e < per; e++) {
                const int i = lane + SD_WARP * e;
                acc[e] = fmaf(p, i < head_dim ? vs[i] : 0.0f, acc[e] * corr);
            }
            mx = mn;
        }
    }
    if (lane == 0) {
        sm[warp] = mx;
        sl[warp] = l;
    }
    for (int e = 0; e < per; e++) {
        const int i = lane + SD_WARP * e;
        if (i < head_dim) {
            sacc[warp][i] = acc[e];
        }
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATTN_WARPS; w++) {
        M = fmaxf(M, sm[w]);
    }
    float L = 0.0f, f[ATTN_WARPS];
    for (int w = 0; w < ATTN_WARPS; w++) {
        f[w] = sm[w] == -INFINITY ? 0.0f : expf(sm[w] - M); /* a warp that saw no open key */
        L = fmaf(sl[w], f[w], L);
    }
    float *o = out + (size_t)th * (size_t)head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++) {
            a = fmaf(sacc[w][i], f[w], a);
        }
        o[i] = a / L;
    }
}

extern "C" sd_status sd_cuda_attention_dev(sd_cuda_ctx *ctx, float *out, const float *q,
                                           const sd_cuda_kv_desc *kd, int layer,
                                           const uint8_t *mask, int T, const int *n_attn_dev,
                                           int n_heads, int n_kv_heads, int head_dim) {
    if (head_dim > ATTN_MAX_DH) {
        return sd_set_error(SD_ERR_UNSUPPORTED, "CUDA attention supports head_dim <= %d, got %d",
                            ATTN_MAX_DH, head_dim);
    }
    const float scale = 1.0f / sqrtf((float)head_dim);
    attention_kernel<<<(unsigned)(T * n_heads), ATTN_WARPS * 32, 0, ctx->stream>>>(
        out, q, kd, layer, mask, n_attn_dev, n_heads, n_kv_heads, head_dim, scale);
    SD_CUDA_LAUNCHED("attention_kernel");
    return SD_OK;
}

extern "C" sd_status sd_cuda_attention(sd_cuda_ctx *ctx, float *out, const float *q,
                                       const float *kc, const float *vc, const uint8_t *mask, int T,
                                       int n_attn, int n_heads, int n_kv_heads, int head_dim,
                                       int capacity) {
    int *n_dev = NULL;
    sd_cuda_kv_desc *kd = NULL;
    SD_CUDA_TRY(cudaMalloc((void **)&n_dev, sizeof(int)));
    sd_status st = temp_desc(ctx, &kd, (float *)kc, (float *)vc, capacity);
    if (st == SD_OK && cudaMemcpyAsync(n_dev, &n_attn, sizeof(int), cudaMemcpyHostToDevice,
                                       ctx->stream) != cudaSuccess) {
        st = sd_set_error(SD_ERR_CUDA, "%s:%d: copying n_attn: %s", __FILE__, __LINE__,
                          cudaGetErrorString(cudaGetLastError()));
    }
    if (st == SD_OK) {
        st = sd_cuda_attention_dev(ctx, out, q, kd, 0, mask, T, n_dev, n_heads, n_kv_heads,
                                   head_dim);
    }
    if (st == SD_OK) {
        st = sd_cuda_sync(ctx); /* before n_attn leaves this stack */
    }
    cudaFree(n_dev);
    cudaFree(kd);
    return st;
}

/* ---- dummy weights --------------------------------------------------------------------------- */

/* One thread per element (float types) or block (quantized), dummy.h's values. */
__global__ void dummy_fill_kernel(uint8_t *dst, int type, int64_t n_items, int type_size,
                                  uint64_t seed, uint64_t tensor, float scale) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_items) {
        return;
    }
    if (type == 0 || type == 1 || type == 30) {
        const float v = sd_dummy_value(seed, tensor, (uint64_t)i, scale);
        if (type == 0) {
            ((float *)dst)[i] = v;
        } else {
            ((uint16_t *)dst)[i] = type == 1 ? sd_hd_f32_to_f16(v) : sd_hd_f32_to_bf16(v);
        }
        return;
    }
    sd_dummy_block(dst + (size_t)i * (size_t)type_size, type, type_size, seed, tensor, (uint64_t)i,
                   scale);
}

extern "C" sd_status sd_cuda_dummy_fill(sd_cuda_ctx *ctx, void *dst, int type, int64_t rows,
                                        int64_t cols, uint64_t seed, uint64_t tensor, float scale) {
    const int bs = sd_dev_block_size(type);
    if (bs == 0 || cols % bs != 0) {
        return sd_set_error(SD_ERR_UNSUPPORTED, "dummy fill of type %d with rows of %lld", type,
                            (long long)cols);
    }
    const int64_t items = rows * (cols / bs);
    dummy_fill_kernel<<<sd_div_up(items, 256), 256, 0, ctx->stream>>>(
        (uint8_t *)dst, type, items, sd_dev_type_size(type), seed, tensor, scale);
    SD_CUDA_LAUNCHED("dummy_fill_kernel");
    return SD_OK;
}
