/* sampling.cu — from logits to tokens on the GPU: the processed distribution (temperature,
 * top-k, top-p, min-p), argmax, drawing a token with a given uniform, the chain rule of
 * speculative sampling and the synthetic acceptance of benchmarks. The rules are verify.h's,
 * step for step; the uniforms come from hd.h's RNG keyed as the CPU loop keys them, so the
 * same seed draws the same numbers on either device. Each launcher's CPU twin is in
 * csrc/check/twins.c. One block of SAMPLE_THREADS threads works on one row. */
#include <cub/cub.cuh>
#include <math.h>

#include "common.cuh"
#include "sampling.cuh"

#define SAMPLE_THREADS 1024

/* ---- block-wide pieces ------------------------------------------------------------------------
 */

/* The (value, index) pair with the largest value, the lowest index on ties, over a warp. */
__device__ __forceinline__ void warp_argmax(float *best, int *bi) {
    for (int o = SD_WARP / 2; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, *best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, *bi, o);
        if (ov > *best || (ov == *best && oi < *bi)) {
            *best = ov;
            *bi = oi;
        }
    }
}

/* Index of the largest x (the lowest index on ties) over a block, leaving out the n_skip
 * indices in skip (shared memory); n when every index is left out. */
__device__ int block_argmax_except(const float *x, int n, const int *skip, int n_skip) {
    __shared__ float sv[32];
    __shared__ int si[32];
    float best = -INFINITY;
    int bi = n; /* none yet */
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int out = 0;
        for (int u = 0; u < n_skip; u++) {
            out |= skip[u] == i;
        }
        if (!out && (x[i] > best || (x[i] == best && i < bi))) {
            best = x[i];
            bi = i;
        }
    }
    warp_argmax(&best, &bi);
    const int lane = threadIdx.x % SD_WARP, w = threadIdx.x / SD_WARP;
    __syncthreads();
    if (lane == 0) {
        sv[w] = best;
        si[w] = bi;
    }
    __syncthreads();
    if (w == 0) {
        const int nw = blockDim.x / SD_WARP;
        best = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : n;
        warp_argmax(&best, &bi);
        if (lane == 0) {
            si[0] = bi;
        }
    }
    __syncthreads();
    return si[0];
}

/* Index of the largest x (the lowest index on ties) over a block. */
__device__ int block_argmax(const float *x, int n) {
    const int r = block_argmax_except(x, n, NULL, 0);
    return r < n ? r : 0;
}

/* The first index r < n whose running sum of v[0..r] (only v > 0 counted; in double) exceeds
 * target; n when none does. Each thread takes a contiguous chunk, an exclusive scan of the
 * chunk sums places it, and the thread whose chunk crosses the target walks it. */
__device__ int block_first_crossing(const float *v, int n, double target, int strict) {
    __shared__ double chunk[SAMPLE_THREADS];
    __shared__ int found;
    const int nt = blockDim.x, tid = threadIdx.x;
    const int per = (n + nt - 1) / nt;
    const int a = tid * per, b = a + per < n ? a + per : n;
    double s = 0.0;
    for (int i = a; i < b; i++) {
        if (v[i] > 0.0f) {
            s += (double)v[i];
        }
    }
    if (tid == 0) {
        found = n;
    }
    chunk[tid] = s;
    __syncthreads();
    /* Hillis-Steele inclusive scan over the chunk sums */
    for (int o = 1; o < nt; o <<= 1) {
        const double add = tid >= o ? chunk[tid - o] : 0.0;
        __syncthreads();
        chunk[tid] += add;
        __syncthreads();
    }
    double acc = tid > 0 ? chunk[tid - 1] : 0.0;
    const double end = chunk[tid];
    if (a < b && (strict ? end > target : end >= target)) {
        for (int i = a; i < b; i++) {
            if (v[i] > 0.0f) {
                acc += (double)v[i];
                if (strict ? acc > target : acc >= target) {
                    atomicMin(&found, i);
                    break;
                }
            }
        }
    }
    __syncthreads();
    return found;
}

/* The token u selects from p by inverting its cumulative sum (sd_sample_probs): the first i
 * whose running sum exceeds u * total, else the last i with p > 0. */
__device__ int block_sample(const float *p, int V, double u) {
    __shared__ double sh[32];
    __shared__ int last_sh;
    double total = 0.0;
    int last = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        if (p[i] > 0.0f) {
            total += (double)p[i];
            last = i > last ? i : last;
        }
    }
    total = sd_block_sum_d(total, sh);
    if (threadIdx.x == 0) {
        last_sh = 0;
    }
    __syncthreads();
    atomicMax(&last_sh, last);
    __syncthreads();
    const int r = block_first_crossing(p, V, u * total, 1);
    return r < V ? r : last_sh;
}

/* ---- processing logits ------------------------------------------------------------------------
 */

/* Row r: greedy one-hot at the argmax, or softmax(logits / T): each exponential by
 * sd_hd_expf (the CPU's arithmetic), the normaliser in double (summed in another order than the
 * CPU's eight lanes, so the last bits of a probability may differ). */
__global__ void softmax_kernel(float *probs, const float *logits, int V, float temperature) {
    __shared__ double shd[32];
    const float *l = logits + (size_t)blockIdx.x * (size_t)V;
    float *p = probs + (size_t)blockIdx.x * (size_t)V;
    const int best = block_argmax(l, V);
    if (temperature == 0.0f) {
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            p[i] = i == best ? 1.0f : 0.0f;
        }
        return;
    }
    const float mx = l[best];
    double sum = 0.0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        sum += (double)sd_hd_expf((l[i] - mx) / temperature);
    }
    sum = sd_block_sum_d(sum, shd);
    const float inv = (float)(1.0 / sum);
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        p[i] = sd_hd_expf((l[i] - mx) / temperature) * inv;
    }
}

/* Fill ids (rows, V) with 0..V-1 per row and offsets (rows + 1) with r * V. */
__global__ void sort_setup_kernel(int32_t *ids, int *offsets, int rows, int V) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (int64_t)rows * V) {
        ids[i] = (int32_t)(i % V);
    }
    if (i <= rows) {
        offsets[i] = (int)(i * V);
    }
}

/* After sorting each row by decreasing probability (ties by id, the sort being stable): the
 * kept prefix by top-k, then top-p over what top-k left (or over all), then min-p; the row is
 * rewritten as the kept probabilities over their sum, zero elsewhere (sd_process_logits). */
__global__ void filter_kernel(float *probs, const float *sorted, const int32_t *ids, int V,
                              int top_k, float top_p, float min_p) {
    __shared__ double shd[32];
    __shared__ int first_low;
    const size_t off = (size_t)blockIdx.x * (size_t)V;
    float *p = probs + off;
    const float *sp = sorted + off;
    const int32_t *si = ids + off;
    int keep = V;
    const int k_on = top_k > 0 && top_k < V;
    if (k_on) {
        keep = top_k;
    }
    if (top_p < 1.0f) {
        double total = 0.0;
        if (k_on) {
            for (int r = threadIdx.x; r < keep; r += blockDim.x) {
                total += (double)sp[r];
            }
        } else {
            for (int i = threadIdx.x; i < V; i += blockDim.x) {
                total += (double)p[i];
            }
        }
        total = sd_block_sum_d(total, shd);
        const int r = block_first_crossing(sp, keep, (double)top_p * total, 0);
        keep = r < keep ? r + 1 : keep;
    }
    if (min_p > 0.0f) {
        const float floor_p = min_p * sp[0];
        if (threadIdx.x == 0) {
            first_low = keep;
        }
        __syncthreads();
        for (int r = 1 + threadIdx.x; r < keep; r += blockDim.x) {
            if (sp[r] < floor_p) {
                atomicMin(&first_low, r);
            }
        }
        __syncthreads();
        keep = first_low;
    }
    double kept = 0.0;
    for (int r = threadIdx.x; r < keep; r += blockDim.x) {
        kept += (double)sp[r];
    }
    kept = sd_block_sum_d(kept, shd);
    __syncthreads();
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        p[i] = 0.0f;
    }
    __syncthreads();
    for (int r = threadIdx.x; r < keep; r += blockDim.x) {
        p[si[r]] = (float)((double)sp[r] / kept);
    }
}

sd_status sd_cuda_sorter_reserve(sd_cuda_ctx *ctx, sd_cuda_sorter *s, int rows, int V) {
    if (rows <= s->rows && V == s->V) {
        return SD_OK;
    }
    sd_cuda_sorter_release(s);
    const size_t n = (size_t)rows * (size_t)V;
    SD_CUDA_TRY(cudaMalloc((void **)&s->keys, n * sizeof(float)));
    SD_CUDA_TRY(cudaMalloc((void **)&s->ids_in, n * sizeof(int32_t)));
    SD_CUDA_TRY(cudaMalloc((void **)&s->ids_out, n * sizeof(int32_t)));
    SD_CUDA_TRY(cudaMalloc((void **)&s->offsets, (size_t)(rows + 1) * sizeof(int)));
    size_t bytes = 0;
    SD_CUDA_TRY(cub::DeviceSegmentedRadixSort::SortPairsDescending(
        (void *)NULL, bytes, (const float *)s->keys, s->keys, (const int32_t *)s->ids_in,
        s->ids_out, (int)n, rows, s->offsets, s->offsets + 1, 0, 32, ctx->stream));
    SD_CUDA_TRY(cudaMalloc(&s->temp, bytes > 0 ? bytes : 1));
    s->temp_bytes = bytes;
    sort_setup_kernel<<<sd_div_up((int64_t)n + rows + 1, 256), 256, 0, ctx->stream>>>(
        s->ids_in, s->offsets, rows, V);
    SD_CUDA_LAUNCHED("sort_setup_kernel");
    s->rows = rows;
    s->V = V;
    return SD_OK;
}

void sd_cuda_sorter_release(sd_cuda_sorter *s) {
    cudaFree(s->keys);
    cudaFree(s->ids_in);
    cudaFree(s->ids_out);
    cudaFree(s->offsets);
    cudaFree(s->temp);
    memset(s, 0, sizeof(*s));
}

sd_status sd_cuda_process_rows(sd_cuda_ctx *ctx, sd_cuda_sorter *sorter, float *probs,
                               const float *logits, int rows, int V, float temperature, int top_k,
                               float top_p, float min_p) {
    softmax_kernel<<<(unsigned)rows, SAMPLE_THREADS, 0, ctx->stream>>>(probs, logits, V,
                                                                       temperature);
    SD_CUDA_LAUNCHED("softmax_kernel");
    const int filter =
        temperature != 0.0f && ((top_k > 0 && top_k < V) || top_p < 1.0f || min_p > 0.0f);
    if (!filter) {
        return SD_OK;
    }
    if (sorter->rows < rows || sorter->V != V) {
        return sd_set_error(SD_ERR_INTERNAL, "sorting scratch for %d rows of %d, need %d of %d",
                            sorter->rows, sorter->V, rows, V);
    }
    const int n = rows * V;
    size_t bytes = sorter->temp_bytes;
    SD_CUDA_TRY(cub::DeviceSegmentedRadixSort::SortPairsDescending(
        sorter->temp, bytes, (const float *)probs, sorter->keys, (const int32_t *)sorter->ids_in,
        sorter->ids_out, n, rows, sorter->offsets, sorter->offsets + 1, 0, 32, ctx->stream));
    filter_kernel<<<(unsigned)rows, SAMPLE_THREADS, 0, ctx->stream>>>(
        probs, sorter->keys, sorter->ids_out, V, top_k, top_p, min_p);
    SD_CUDA_LAUNCHED("filter_kernel");
    return SD_OK;
}

/* ---- argmax, drawing ----------------------------------------------------------------------------
 */

__global__ void argmax_kernel(int32_t *out, const float *x, int V) {
    const int r = block_argmax(x + (size_t)blockIdx.x * (size_t)V, V);
    if (threadIdx.x == 0) {
        out[blockIdx.x] = r;
    }
}

__global__ void sample_kernel(int32_t *out, const float *probs, int V, uint64_t seed,
                              uint64_t stream, uint64_t index0) {
    const double u = sd_hd_uniform(seed, stream, index0 + blockIdx.x);
    const int r = block_sample(probs + (size_t)blockIdx.x * (size_t)V, V, u);
    if (threadIdx.x == 0) {
        out[blockIdx.x] = r;
    }
}

sd_status sd_cuda_argmax_rows(sd_cuda_ctx *ctx, int32_t *out, const float *x, int rows, int V) {
    argmax_kernel<<<(unsigned)rows, SAMPLE_THREADS, 0, ctx->stream>>>(out, x, V);
    SD_CUDA_LAUNCHED("argmax_kernel");
    return SD_OK;
}

sd_status sd_cuda_sample_rows(sd_cuda_ctx *ctx, int32_t *out, const float *probs, int rows, int V,
                              uint64_t seed, uint64_t stream, uint64_t index0) {
    sample_kernel<<<(unsigned)rows, SAMPLE_THREADS, 0, ctx->stream>>>(out, probs, V, seed, stream,
                                                                      index0);
    SD_CUDA_LAUNCHED("sample_kernel");
    return SD_OK;
}

/* ---- the chain rule -------------------------------------------------------------------------- */

/* result[0] = accepted drafts n, result[1] = the token emitted after them (sd_verify_chain).
 * K is read from k_dev when given (a draft cut short by p_min), else k. q: (K, V) or NULL
 * (one-hot drafts). work: V floats. */
__global__ void verify_kernel(int32_t *result, const float *p, const float *q, const int32_t *draft,
                              int k, const int32_t *k_dev, int V, uint64_t seed, uint64_t pos0,
                              float *work) {
    __shared__ double shd[32];
    const int K = k_dev != NULL ? (*k_dev < k ? *k_dev : k) : k;
    for (int i = 0; i < K; i++) {
        const float *pi = p + (size_t)i * (size_t)V;
        const float *qi = q != NULL ? q + (size_t)i * (size_t)V : NULL;
        const int d = draft[i];
        const double ua = sd_hd_uniform(seed, SD_STREAM_ACCEPT, pos0 + (uint64_t)i);
        const double qd = qi != NULL ? (double)qi[d] : 1.0;
        if (ua * qd < (double)pi[d]) { /* accepted: the same test on every thread */
            continue;
        }
        const double un = sd_hd_uniform(seed, SD_STREAM_EMIT, pos0 + (uint64_t)i);
        double mass = 0.0;
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            const float qj = qi != NULL ? qi[j] : (j == d ? 1.0f : 0.0f);
            const float r = pi[j] - qj;
            work[j] = r > 0.0f ? r : 0.0f; /* max(0, p - q) */
            mass += (double)work[j];
        }
        mass = sd_block_sum_d(mass, shd);
        __syncthreads();
        const int next = block_sample(mass > 0.0 ? work : pi, V, un);
        if (threadIdx.x == 0) {
            result[0] = i;
            result[1] = next;
        }
        return;
    }
    const double un = sd_hd_uniform(seed, SD_STREAM_EMIT, pos0 + (uint64_t)K);
    const int next = block_sample(p + (size_t)K * (size_t)V, V, un);
    if (threadIdx.x == 0) {
        result[0] = K;
        result[1] = next;
    }
}

sd_status sd_cuda_verify_dev(sd_cuda_ctx *ctx, int32_t *result, const float *p, const float *q,
                             const int32_t *draft, int K, const int32_t *k_dev, int V,
                             uint64_t seed, uint64_t pos0, float *work) {
    verify_kernel<<<1, SAMPLE_THREADS, 0, ctx->stream>>>(result, p, q, draft, K, k_dev, V, seed,
                                                         pos0, work);
    SD_CUDA_LAUNCHED("verify_kernel");
    return SD_OK;
}

/* ---- a row's top ids ------------------------------------------------------------------------ */

/* Row r of x (rows, V): the ids of its `top` largest values into out (rows, top), the larger
 * first, ties to the lower id, -1 past V (sd_top_ids): `top` block argmaxes, each skipping the
 * ids taken. */
__global__ void row_top_kernel(int32_t *out, const float *x, int V, int top) {
    __shared__ int taken[SD_RECYCLE_MAX_TOP];
    const float *row = x + (size_t)blockIdx.x * (size_t)V;
    for (int j = 0; j < top; j++) {
        const int r = block_argmax_except(row, V, taken, j);
        if (threadIdx.x == 0) {
            taken[j] = r < V ? r : -1;
            out[(size_t)blockIdx.x * (size_t)top + (size_t)j] = r < V ? r : -1;
        }
        __syncthreads();
    }
}

sd_status sd_cuda_row_top_dev(sd_cuda_ctx *ctx, int32_t *out, const float *x, int rows, int V,
                              int top) {
    if (top < 1 || top > SD_RECYCLE_MAX_TOP) {
        return sd_set_error(SD_ERR_INVALID_ARG, "row_top: top %d outside [1, %d]", top,
                            SD_RECYCLE_MAX_TOP);
    }
    row_top_kernel<<<(unsigned)rows, SAMPLE_THREADS, 0, ctx->stream>>>(out, x, V, top);
    SD_CUDA_LAUNCHED("row_top_kernel");
    return SD_OK;
}

/* ---- the tree rule ---------------------------------------------------------------------------- */

/* Copies row src (V floats) into dst with the block, then waits for every thread. */
__device__ void block_copy(float *dst, const float *src, int V) {
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        dst[i] = src[i];
    }
    __syncthreads();
}

/* Rejecting child token t at a node (verify.c's tree_reject): the current p (sum *P) and, for
 * sampled children, q (sum *Q) lose t as the rule says; the sums in double over the block. */
__device__ void tree_reject_dev(float *cp, double *P, float *cq, double *Q, int t, int V,
                                double *shd) {
    if (cq == NULL) { /* deterministic: p(t) <- 0 */
        __syncthreads();
        if (threadIdx.x == 0) {
            cp[t] = 0.0f;
        }
        __syncthreads();
    } else { /* sampled: p <- max(0, p/P - q/Q), unless that has no mass */
        const double p0 = *P, q0 = *Q;
        double mass = 0.0;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            mass += cp[i] / p0 > cq[i] / q0 ? cp[i] / p0 - cq[i] / q0 : 0.0;
        }
        mass = sd_block_sum_d(mass, shd);
        if (mass > 0.0) {
            for (int i = threadIdx.x; i < V; i += blockDim.x) {
                const float r =
                    p0 == 1.0 && q0 == 1.0 ? cp[i] - cq[i] : (float)(cp[i] / p0 - cq[i] / q0);
                cp[i] = r > 0.0f ? r : 0.0f;
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            cq[t] = 0.0f;
        }
        __syncthreads();
        double qs = 0.0;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            qs += (double)cq[i];
        }
        *Q = sd_block_sum_d(qs, shd);
    }
    double ps = 0.0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        ps += (double)cp[i];
    }
    *P = sd_block_sum_d(ps, shd);
}

/* sd_verify_tree over n nodes (tokens, parent) with p (n + 1, V) and q (n, V) or NULL, the
 * uniforms keyed as the CPU loop keys them: node i's coin (seed, SD_STREAM_TREE, out_pos *
 * SD_MAX_TREE_NODES + i), the token after a accepted nodes (seed, SD_STREAM_EMIT, out_pos + a).
 * result[0] = accepted nodes, result[1] = the next token, result[2 ..] = the path. One block;
 * every thread takes the same decisions (the sums are the block's). work: 2 V floats. */
__global__ void verify_tree_kernel(int32_t *result, const float *p, const float *q,
                                   const int32_t *tokens, const int32_t *parent, int n, int V,
                                   uint64_t seed, uint64_t out_pos, float *work) {
    __shared__ double shd[32];
    float *cp = work, *cq = q != NULL ? work + V : NULL;
    int node = -1, n_acc = 0;
    block_copy(cp, p, V);
    double P = 1.0;
    for (;;) {
        int acc = -1, first = 1;
        double Q = 1.0;
        for (int c = node + 1; c < n && acc < 0; c++) {
            if (parent[c] != node) {
                continue;
            }
            const int t = tokens[c];
            if (cq != NULL && first) {
                __syncthreads();
                block_copy(cq, q + (size_t)c * (size_t)V, V);
            }
            first = 0;
            const double u = sd_hd_uniform(seed, SD_STREAM_TREE,
                                           out_pos * SD_MAX_TREE_NODES + (uint64_t)c);
            const double qt = cq != NULL ? (double)cq[t] * P : P;
            const double pt = cq != NULL ? (double)cp[t] * Q : (double)cp[t];
            const int ok = P == 1.0 && Q == 1.0
                               ? u * (cq != NULL ? (double)cq[t] : 1.0) < (double)cp[t]
                               : u * qt < pt;
            if (ok) {
                acc = c;
            } else {
                tree_reject_dev(cp, &P, cq, &Q, t, V, shd);
            }
        }
        if (acc < 0) {
            __syncthreads();
            const double un = sd_hd_uniform(seed, SD_STREAM_EMIT, out_pos + (uint64_t)n_acc);
            const int next = block_sample(cp, V, un);
            if (threadIdx.x == 0) {
                result[0] = n_acc;
                result[1] = next;
            }
            return;
        }
        if (threadIdx.x == 0) {
            result[2 + n_acc] = acc;
        }
        n_acc++;
        node = acc;
        __syncthreads();
        block_copy(cp, p + (size_t)(1 + acc) * (size_t)V, V);
        P = 1.0;
    }
}

sd_status sd_cuda_verify_tree_dev(sd_cuda_ctx *ctx, int32_t *result, const float *p,
                                  const float *q, const int32_t *tokens, const int32_t *parent,
                                  int n, int V, uint64_t seed, uint64_t out_pos, float *work) {
    verify_tree_kernel<<<1, SAMPLE_THREADS, 0, ctx->stream>>>(result, p, q, tokens, parent, n, V,
                                                              seed, out_pos, work);
    SD_CUDA_LAUNCHED("verify_tree_kernel");
    return SD_OK;
}

/* Benchmarks: accept draft i while its uniform (seed, SD_STREAM_SYNTH, pos0 + i) < alpha; the
 * next token is the argmax of logits row n (logits NULL: none). */
__global__ void synthetic_kernel(int32_t *result, int K, double alpha, uint64_t seed, uint64_t pos0,
                                 const float *logits, int V) {
    int n = 0;
    while (n < K && sd_hd_uniform(seed, SD_STREAM_SYNTH, pos0 + (uint64_t)n) < alpha) {
        n++;
    }
    int next = 0;
    if (logits != NULL) {
        next = block_argmax(logits + (size_t)n * (size_t)V, V);
    }
    if (threadIdx.x == 0) {
        result[0] = n;
        result[1] = next;
    }
}

sd_status sd_cuda_synthetic_dev(sd_cuda_ctx *ctx, int32_t *result, int K, double alpha,
                                uint64_t seed, uint64_t pos0, const float *logits, int V) {
    synthetic_kernel<<<1, SAMPLE_THREADS, 0, ctx->stream>>>(result, K, alpha, seed, pos0, logits,
                                                            V);
    SD_CUDA_LAUNCHED("synthetic_kernel");
    return SD_OK;
}

/* ---- draft picks ----------------------------------------------------------------------------- */

/* A model drafter's token i: from q (its processed row, already written) greedy or drawn with
 * (seed, SD_STREAM_DRAFT, pos0 + i), into batch[1 + i] and next_in[0] (the draft's next input);
 * with p_min > 0, the draft ends after a token the draft gave less than p_min (its processed
 * probability when sampling, its softmax probability when greedy): *k_stop = i + 1 if not
 * already lower. */
__global__ void draft_pick_kernel(int32_t *batch, int32_t *next_in, int32_t *k_stop, const float *q,
                                  const float *logits, int V, int i, float temperature,
                                  uint64_t seed, uint64_t pos0, float p_min) {
    __shared__ double shd[32];
    int d;
    if (temperature == 0.0f) {
        d = block_argmax(q, V);
    } else {
        d = block_sample(q, V, sd_hd_uniform(seed, SD_STREAM_DRAFT, pos0 + (uint64_t)i));
    }
    double prob = 1.0;
    if (p_min > 0.0f) {
        if (temperature == 0.0f) { /* top_prob of the raw logits */
            const int best = block_argmax(logits, V);
            const float mx = logits[best];
            double sum = 0.0;
            for (int j = threadIdx.x; j < V; j += blockDim.x) {
                sum += exp((double)(logits[j] - mx));
            }
            sum = sd_block_sum_d(sum, shd);
            prob = 1.0 / sum;
        } else {
            prob = (double)q[d];
        }
    }
    if (threadIdx.x == 0) {
        batch[1 + i] = d;
        next_in[0] = d;
        if (p_min > 0.0f && prob<(double)p_min && * k_stop> i + 1) {
            *k_stop = i + 1;
        }
    }
}

sd_status sd_cuda_draft_pick_dev(sd_cuda_ctx *ctx, int32_t *batch, int32_t *next_in,
                                 int32_t *k_stop, const float *q, const float *logits, int V, int i,
                                 float temperature, uint64_t seed, uint64_t pos0, float p_min) {
    draft_pick_kernel<<<1, SAMPLE_THREADS, 0, ctx->stream>>>(batch, next_in, k_stop, q, logits, V,
                                                             i, temperature, seed, pos0, p_min);
    SD_CUDA_LAUNCHED("draft_pick_kernel");
    return SD_OK;
}

/* ---- kernel-check launchers (host ints, device arrays) -----------------------------------------
 */

extern "C" sd_status sd_cuda_process(sd_cuda_ctx *ctx, float *probs, const float *logits, int rows,
                                     int V, float temperature, int top_k, float top_p,
                                     float min_p) {
    sd_cuda_sorter s;
    memset(&s, 0, sizeof(s));
    sd_status st = sd_cuda_sorter_reserve(ctx, &s, rows, V);
    if (st == SD_OK) {
        st =
            sd_cuda_process_rows(ctx, &s, probs, logits, rows, V, temperature, top_k, top_p, min_p);
    }
    if (st == SD_OK && cudaStreamSynchronize(ctx->stream) != cudaSuccess) {
        st = sd_set_error(SD_ERR_CUDA, "%s:%d: processing logits: %s", __FILE__, __LINE__,
                          cudaGetErrorString(cudaGetLastError()));
    }
    sd_cuda_sorter_release(&s);
    return st;
}

extern "C" sd_status sd_cuda_argmax(sd_cuda_ctx *ctx, int32_t *out, const float *x, int rows,
                                    int V) {
    return sd_cuda_argmax_rows(ctx, out, x, rows, V);
}

extern "C" sd_status sd_cuda_sample(sd_cuda_ctx *ctx, int32_t *out, const float *probs, int rows,
                                    int V, uint64_t seed, uint64_t stream, uint64_t index0) {
    return sd_cuda_sample_rows(ctx, out, probs, rows, V, seed, stream, index0);
}

extern "C" sd_status sd_cuda_verify(sd_cuda_ctx *ctx, int32_t *result, const float *p,
                                    const float *q, const int32_t *draft, int K, int V,
                                    uint64_t seed, uint64_t pos0) {
    float *work = NULL;
    SD_CUDA_TRY(cudaMalloc((void **)&work, (size_t)V * sizeof(float)));
    sd_status st = sd_cuda_verify_dev(ctx, result, p, q, draft, K, NULL, V, seed, pos0, work);
    if (st == SD_OK && cudaStreamSynchronize(ctx->stream) != cudaSuccess) {
        st = sd_set_error(SD_ERR_CUDA, "%s:%d: verify: %s", __FILE__, __LINE__,
                          cudaGetErrorString(cudaGetLastError()));
    }
    cudaFree(work);
    return st;
}

extern "C" sd_status sd_cuda_row_top(sd_cuda_ctx *ctx, int32_t *out, const float *x, int rows,
                                     int V, int top) {
    sd_status st = sd_cuda_row_top_dev(ctx, out, x, rows, V, top);
    if (st == SD_OK && cudaStreamSynchronize(ctx->stream) != cudaSuccess) {
        st = sd_set_error(SD_ERR_CUDA, "%s:%d: row_top: %s", __FILE__, __LINE__,
                          cudaGetErrorString(cudaGetLastError()));
    }
    return st;
}

extern "C" sd_status sd_cuda_verify_tree(sd_cuda_ctx *ctx, int32_t *result, const float *p,
                                         const float *q, const int32_t *tokens,
                                         const int32_t *parent, int n, int V, uint64_t seed,
                                         uint64_t out_pos) {
    float *work = NULL;
    SD_CUDA_TRY(cudaMalloc((void **)&work, 2 * (size_t)V * sizeof(float)));
    sd_status st =
        sd_cuda_verify_tree_dev(ctx, result, p, q, tokens, parent, n, V, seed, out_pos, work);
    if (st == SD_OK && cudaStreamSynchronize(ctx->stream) != cudaSuccess) {
        st = sd_set_error(SD_ERR_CUDA, "%s:%d: verify_tree: %s", __FILE__, __LINE__,
                          cudaGetErrorString(cudaGetLastError()));
    }
    cudaFree(work);
    return st;
}

extern "C" sd_status sd_cuda_synthetic_accept(sd_cuda_ctx *ctx, int32_t *n_acc, int K, double alpha,
                                              uint64_t seed, uint64_t pos0) {
    int32_t *res = NULL;
    SD_CUDA_TRY(cudaMalloc((void **)&res, 2 * sizeof(int32_t)));
    sd_status st = sd_cuda_synthetic_dev(ctx, res, K, alpha, seed, pos0, NULL, 0);
    if (st == SD_OK && cudaMemcpyAsync(n_acc, res, sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                       ctx->stream) != cudaSuccess) {
        st = sd_set_error(SD_ERR_CUDA, "%s:%d: copying the result", __FILE__, __LINE__);
    }
    if (st == SD_OK && cudaStreamSynchronize(ctx->stream) != cudaSuccess) {
        st = sd_set_error(SD_ERR_CUDA, "%s:%d: synthetic acceptance: %s", __FILE__, __LINE__,
                          cudaGetErrorString(cudaGetLastError()));
    }
    cudaFree(res);
    return st;
}
