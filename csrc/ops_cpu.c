/* ops_cpu.c — CPU operators: RMSNorm, RoPE, batched matmul over typed weight rows, SwiGLU and
 * masked attention over the slot-addressed KV cache. The SIMD lives in the row kernels
 * (quant.c / simd_avx2.c); here is the loop structure and the threading. */
#include "ops_cpu.h"

#include <math.h>
#include <string.h>

#include "quant.h"

void sd_rmsnorm(float *out, const float *x, const float *w, int T, int n, float eps) {
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * (size_t)n;
        float *ot = out + (size_t)t * (size_t)n;
        float ss = sd_dot_f32(xt, xt, n);
        float scale = 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = 0; i < n; i++) {
            ot[i] = xt[i] * scale * w[i];
        }
    }
}

void sd_rope(float *x, const float *cs, int T, int n_heads, int head_dim, int neox) {
    int half = head_dim / 2;
    for (int t = 0; t < T; t++) {
        const float *c = cs + (size_t)t * (size_t)head_dim;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)head_dim;
            for (int i = 0; i < half; i++) {
                float co = c[2 * i], si = c[2 * i + 1];
                int a = neox ? i : 2 * i;
                int b = neox ? i + half : 2 * i + 1;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * co - x1 * si;
                v[b] = x0 * si + x1 * co;
            }
        }
    }
}

void sd_swiglu_ref(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* ---- matmul ---------------------------------------------------------------------------------- */

#define SD_MAX_JOBS 4

typedef struct {
    const sd_matmul_job *jobs;
    int n_jobs;
    int T;
    sd_acts acts;                        /* the shared input, float and quantized */
    int64_t chunk;                       /* rows per task, a multiple of 16 */
    int64_t task_start[SD_MAX_JOBS + 1]; /* first task of each job */
} matmul_ctx;

static void matmul_task(void *ctx, int task, int thread) {
    (void)thread;
    const matmul_ctx *c = (const matmul_ctx *)ctx;
    int ji = 0;
    while (ji + 1 < c->n_jobs && task >= c->task_start[ji + 1]) {
        ji++;
    }
    const sd_matmul_job *j = &c->jobs[ji];
    const sd_mat *w = j->w;
    int64_t r0 = (task - c->task_start[ji]) * c->chunk;
    int64_t r1 = r0 + c->chunk < w->rows ? r0 + c->chunk : w->rows;
    /* rows [r0, r1) for all T tokens in the type's tile kernel: each weight row is read once
     * for the whole batch */
    if (w->packed != NULL) { /* chunks are whole groups of 8 rows, as the repacked copy is */
        sd_tile_repacked(w->type, j->y + r0, w->rows, w->packed, r0, r1 - r0, &c->acts, c->T,
                         w->cols, j->bias != NULL ? j->bias + r0 : NULL, j->accumulate);
        return;
    }
    sd_type_get(w->type)->tile(j->y + r0, w->rows,
                               (const unsigned char *)w->data + (size_t)r0 * w->row_bytes,
                               w->row_bytes, r1 - r0, &c->acts, c->T, w->cols,
                               j->bias != NULL ? j->bias + r0 : NULL, j->accumulate);
}

int sd_matmul_wants_q8(const sd_matmul_job *jobs, int n_jobs) {
    int quantized = 0;
    for (int i = 0; i < n_jobs; i++) {
        quantized |= sd_type_get(jobs[i].w->type)->dot_q8 != NULL;
    }
    return quantized;
}

/* ---- quantized activations ------------------------------------------------------------------- */

/* Where rows of a batch go quantized: T rows in xq (NULL: nowhere), their scalars gathered in
 * xt when the kernels read them so (NULL otherwise). */
typedef struct {
    unsigned char *xq;
    float *xt;
} q8_out;

static q8_out q8_out_at(unsigned char *xq, int T, int64_t n) {
    q8_out o = {xq, xq != NULL && sd_kernels_want_scalars(T) ? sd_q8_scalars_at(xq, T, n) : NULL};
    return o;
}

/* Rows [t0, t1) of x (T, n) into o. */
static void quantize_range(const q8_out *o, const float *x, int t0, int t1, int64_t n) {
    for (int t = t0; t < t1; t++) {
        unsigned char *row = o->xq + (size_t)t * SD_Q8_ROW_BYTES(n);
        sd_quantize_q8(row, x + (size_t)t * (size_t)n, n);
        if (o->xt != NULL) {
            sd_q8_scatter_scalars(o->xt, row, t, n);
        }
    }
}

/* Tokens per task: a task of a few thousand elements keeps the dispatch cost small, and a
 * short batch is still shared by every thread (8 tokens on 2 threads: 4 and 4, not 7 and 1).
 * When the rows' scalars are gathered, whole groups of 4 tokens: each group's scalars are
 * cache lines of their own (quant.h), so threads do not write the same lines. */
static int rows_per_task(sd_threadpool *pool, int T, int64_t n, const q8_out *o) {
    int64_t r = 4096 / (n > 0 ? n : 1);
    const int nt = sd_threadpool_size(pool);
    const int share = (T + nt - 1) / nt;
    r = r > share ? share : r;
    if (o != NULL && o->xt != NULL) {
        r = (r + 3) / 4 * 4;
    }
    return r < 1 ? 1 : r > T ? T : (int)r;
}

void sd_matmul(sd_threadpool *pool, int T, const sd_matmul_job *jobs, int n_jobs,
               unsigned char *xq, int xq_ready) {
    matmul_ctx c;
    memset(&c, 0, sizeof(c));
    c.jobs = jobs;
    c.n_jobs = n_jobs;
    c.T = T;
    const int64_t n = jobs[0].w->cols;
    c.acts.x = jobs[0].x;
    c.acts.ldx = n;
    int64_t total = 0;
    for (int i = 0; i < n_jobs; i++) {
        total += jobs[i].w->rows;
    }
    if (sd_matmul_wants_q8(jobs, n_jobs)) {
        /* the integer kernels read the activations quantized: once, for every row (by the op
         * that produced them when xq_ready) */
        const q8_out o = q8_out_at(xq, T, n);
        if (!xq_ready) {
            sd_quantize_rows(pool, xq, jobs[0].x, T, n);
        }
        c.acts.xq = o.xq;
        c.acts.xt = o.xt;
    }
    /* about two tasks per thread: on two threads, one-token and 8-token forwards ran 5-12 %
     * faster with two than with eight (each task claims the shared work word, sets up its
     * tiles and starts its own stream of blocks), and a thread the OS deschedules still holds
     * only part of the product */
    int nt = sd_threadpool_size(pool);
    int64_t chunk = total / ((int64_t)nt * 2);
    /* whole groups of a repacked matrix (8 rows), in pairs for the 16-row AMX tile */
    chunk = chunk < 16 ? 16 : (chunk + 15) / 16 * 16;
    c.chunk = chunk;
    int64_t tasks = 0;
    for (int i = 0; i < n_jobs; i++) {
        c.task_start[i] = tasks;
        tasks += (jobs[i].w->rows + chunk - 1) / chunk;
    }
    c.task_start[n_jobs] = tasks;
    sd_threadpool_run(pool, matmul_task, &c, (int)tasks);
}

/* ---- row-parallel elementwise work ----------------------------------------------------------- */

typedef struct {
    float *out;
    const float *a, *b;
    int T, per;
    int64_t n;
    float eps;
    q8_out q; /* the output rows quantized here too, when q.xq is not NULL */
} rows_ctx;

static void quant_task(void *ctx, int task, int thread) {
    (void)thread;
    const rows_ctx *c = (const rows_ctx *)ctx;
    const int t1 = (task + 1) * c->per < c->T ? (task + 1) * c->per : c->T;
    quantize_range(&c->q, c->a, task * c->per, t1, c->n);
}

void sd_quantize_rows(sd_threadpool *pool, unsigned char *xq, const float *x, int T, int64_t n) {
    rows_ctx c = {NULL, x, NULL, T, 0, n, 0.0f, q8_out_at(xq, T, n)};
    c.per = rows_per_task(pool, T, n, &c.q);
    sd_threadpool_run(pool, quant_task, &c, (T + c.per - 1) / c.per);
}

static void swiglu_task(void *ctx, int task, int thread) {
    (void)thread;
    const rows_ctx *c = (const rows_ctx *)ctx;
    const int t1 = (task + 1) * c->per < c->T ? (task + 1) * c->per : c->T;
    const size_t o = (size_t)task * (size_t)c->per * (size_t)c->n;
    sd_swiglu(c->out + o, c->a + o, c->b + o, (int64_t)(t1 - task * c->per) * c->n);
    if (c->q.xq != NULL) {
        quantize_range(&c->q, c->out, task * c->per, t1, c->n);
    }
}

void sd_swiglu_rows(sd_threadpool *pool, float *out, const float *gate, const float *up, int T,
                    int64_t n, unsigned char *xq) {
    rows_ctx c = {out, gate, up, T, 0, n, 0.0f, q8_out_at(xq, T, n)};
    c.per = rows_per_task(pool, T, n, &c.q);
    sd_threadpool_run(pool, swiglu_task, &c, (T + c.per - 1) / c.per);
}

static void rmsnorm_task(void *ctx, int task, int thread) {
    (void)thread;
    const rows_ctx *c = (const rows_ctx *)ctx;
    const int t1 = (task + 1) * c->per < c->T ? (task + 1) * c->per : c->T;
    const size_t o = (size_t)task * (size_t)c->per * (size_t)c->n;
    sd_rmsnorm(c->out + o, c->a + o, c->b, t1 - task * c->per, (int)c->n, c->eps);
    if (c->q.xq != NULL) {
        quantize_range(&c->q, c->out, task * c->per, t1, c->n);
    }
}

void sd_rmsnorm_rows(sd_threadpool *pool, float *out, const float *x, const float *w, int T, int n,
                     float eps, unsigned char *xq) {
    rows_ctx c = {out, x, w, T, 0, n, eps, q8_out_at(xq, T, n)};
    c.per = rows_per_task(pool, T, n, &c.q);
    sd_threadpool_run(pool, rmsnorm_task, &c, (T + c.per - 1) / c.per);
}

/* ---- attention ------------------------------------------------------------------------------- */

typedef struct {
    float *out;
    const float *q;
    const void *k, *v;
    int kv_f16;
    size_t head_stride;
    const uint8_t *mask;
    int T, n_attn, n_heads, n_kv_heads, head_dim;
    float *scores;
    int group; /* queries per task, <= SD_ATTN_GROUP */
} attn_ctx;

/* Row s of a cache's rows (Dh elements each) as floats: in place for f32, else widened
 * (exactly) from halves into buf. */
static const float *kv_row(const void *rows, int f16, int s, int Dh, float *buf) {
    const size_t at = (size_t)s * (size_t)Dh;
    if (!f16) {
        return (const float *)rows + at;
    }
    for (int d = 0; d < Dh; d++) {
        buf[d] = sd_f16_to_f32(((const uint16_t *)rows)[at + (size_t)d]);
    }
    return buf;
}

/* One query: the portable twin of the SIMD kernel's per-query work. */
static void attend_one(float *o, const float *q, const uint8_t *m, const void *k, const void *v,
                       int f16, int n_attn, int Dh, float scale, float *sc) {
    float row[SD_MAX_HEAD_DIM];
    float mx = -INFINITY;
    for (int s = 0; s < n_attn; s++) {
        if (m[s]) {
            sc[s] = sd_dot_f32(q, kv_row(k, f16, s, Dh, row), Dh) * scale;
            mx = sc[s] > mx ? sc[s] : mx;
        }
    }
    float sum = 0.0f;
    for (int s = 0; s < n_attn; s++) {
        if (m[s]) {
            sc[s] = expf(sc[s] - mx);
            sum += sc[s];
        }
    }
    memset(o, 0, (size_t)Dh * sizeof(float));
    const float inv = 1.0f / sum;
    for (int s = 0; s < n_attn; s++) {
        if (m[s]) {
            sd_axpy_f32(o, sc[s] * inv, kv_row(v, f16, s, Dh, row), Dh);
        }
    }
}

void sd_attend_ref(const sd_attn_group *g, const void *k, const void *v, int kv_f16, int n_attn,
                   int Dh, float scale, float *sc) {
    for (int i = 0; i < g->n; i++) {
        attend_one(g->o[i], g->q[i], g->m[i], k, v, kv_f16, n_attn, Dh, scale,
                   sc + (size_t)i * (size_t)n_attn);
    }
}

/* Task = one group of up to `group` queries of one KV head: the queries (token t, head h)
 * with h in the KV head's G = H / Hkv heads, numbered t * G + (h mod G), cut into groups. KV
 * heads are the outer order, so the threads work on one head's keys and values at a time. */
static void attn_task(void *ctx, int task, int thread) {
    const attn_ctx *c = (const attn_ctx *)ctx;
    const int G = c->n_heads / c->n_kv_heads;
    const int nq = c->T * G;
    const int per_kvh = (nq + c->group - 1) / c->group;
    const int kvh = task / per_kvh, i0 = (task % per_kvh) * c->group;
    const int Dh = c->head_dim;
    sd_attn_group g;
    g.n = nq - i0 < c->group ? nq - i0 : c->group;
    for (int i = 0; i < g.n; i++) {
        const int t = (i0 + i) / G, h = kvh * G + (i0 + i) % G;
        const size_t qo = ((size_t)t * (size_t)c->n_heads + (size_t)h) * (size_t)Dh;
        g.q[i] = c->q + qo;
        g.o[i] = c->out + qo;
        g.m[i] = c->mask + (size_t)t * (size_t)c->n_attn;
    }
    const size_t off = (size_t)kvh * c->head_stride * (c->kv_f16 ? 2u : 4u); /* bytes */
    sd_attend(&g, (const char *)c->k + off, (const char *)c->v + off, c->kv_f16, c->n_attn, Dh,
              1.0f / sqrtf((float)Dh),
              c->scores + (size_t)thread * SD_ATTN_GROUP * (size_t)c->n_attn);
}

void sd_attention(sd_threadpool *pool, float *out, const float *q, const void *k, const void *v,
                  int kv_f16, size_t head_stride, const uint8_t *mask, int T, int n_attn,
                  int n_heads, int n_kv_heads, int head_dim, float *scores) {
    attn_ctx c = {out, q,      k,       v,          kv_f16,   head_stride, mask,
                  T,   n_attn, n_heads, n_kv_heads, head_dim, scores,      0};
    /* groups as large as they can be: each group reads its KV head's keys and values once
     * (after a long context, from memory), so the fewer groups the less traffic; but at least
     * two tasks per thread, of equal sizes. The size changes no query's arithmetic. */
    const int nq = T * (n_heads / n_kv_heads);
    const int nt = sd_threadpool_size(pool);
    int per_kvh = (nq + SD_ATTN_GROUP - 1) / SD_ATTN_GROUP; /* groups per KV head */
    const int min_per_kvh = (2 * nt + n_kv_heads - 1) / n_kv_heads;
    per_kvh = per_kvh < min_per_kvh ? (min_per_kvh < nq ? min_per_kvh : nq) : per_kvh;
    const int group = (nq + per_kvh - 1) / per_kvh;
    c.group = group;
    sd_threadpool_run(pool, attn_task, &c, n_kv_heads * ((nq + group - 1) / group));
}
