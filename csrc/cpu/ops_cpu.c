/* ops_cpu.c — CPU operators: RMSNorm, RoPE, batched matmul over typed weight rows, SwiGLU and
 * masked attention over the slot-addressed KV cache. The SIMD lives in the row kernels
 * (quant.c, x86/ twins chosen by dispatch.c); here is the loop structure and the threading. */
#include "cpu/ops_cpu.h"

#include <math.h>
#include <string.h>

#include "cpu/quant.h"
#include "util/hd.h"

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

void sd_head_input_rows(float *out, const float *e, float *x, const float *w_in, const float *w_hid,
                        int T, int n, float eps, int norm_residual) {
    for (int t = 0; t < T; t++) {
        float *row = out + (size_t)t * 2 * (size_t)n, *xt = x + (size_t)t * (size_t)n;
        sd_rmsnorm(row, e + (size_t)t * (size_t)n, w_in, 1, n, eps);
        sd_rmsnorm(row + n, xt, w_hid, 1, n, eps);
        if (norm_residual) {
            memcpy(xt, row + n, (size_t)n * sizeof(float));
        }
    }
}

void sd_silu_add(float *x, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        x[i] += u[i] / (1.0f + expf(-u[i]));
    }
}

void sd_rope(float *x, const float *cs, int T, int n_heads, int head_dim, int neox) {
    sd_rope_part(x, cs, T, n_heads, head_dim, head_dim, neox);
}

void sd_rope_part(float *x, const float *cs, int T, int n_heads, int head_dim, int n_rot,
                  int neox) {
    int half = n_rot / 2;
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

void sd_geglu_ref(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        const float inner = fmaf(SD_GELU_CUBIC, g * g * g, g);
        out[i] = g / (1.0f + expf(-SD_GELU_2C * inner)) * up[i];
    }
}

double sd_sum_f32_ref(const float *x, int64_t n) {
    double lane[8] = {0};
    for (int64_t i = 0; i < n; i++) {
        lane[i % 8] += (double)x[i];
    }
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
           ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

double sd_softmax_exp_ref(float *e, const float *x, int64_t n, float mx, float t) {
    for (int64_t i = 0; i < n; i++) {
        e[i] = sd_hd_expf((x[i] - mx) / t);
    }
    return sd_sum_f32_ref(e, n);
}

int64_t sd_argmax_f32_ref(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++) {
        if (x[i] > x[best]) {
            best = i;
        }
    }
    return best;
}

/* ---- matmul ---------------------------------------------------------------------------------- */

#define SD_MAX_JOBS 4

typedef struct {
    const sd_matmul_job *jobs;
    int n_jobs;
    int T;
    sd_acts acts;  /* the shared input, float and quantized */
    int64_t total; /* rows of all the jobs */
    int n_tasks;
    int64_t chunk; /* > 0: tasks of `chunk` rows (a multiple of 16) within each job; 0: pieces */
    int64_t start[SD_MAX_JOBS + 1]; /* first task (chunks) or first row (pieces) of each job */
} matmul_ctx;

/* Where piece `task` starts in job j: task total / n_tasks rows into the jobs laid end to end,
 * rounded to a multiple of 16 rows of job j (whole groups of a repacked matrix, 8 rows, in pairs
 * for the 16-row AMX tile) and clamped to it. Pieces span jobs, so every thread gets the same
 * number of rows (q, k and v of 576, 192 and 192 rows on 2 threads: 480 each, not 528 and 432).
 * Only for repacked matrices, whose tiles give a row the same bits wherever the tile that
 * computes it starts (at a multiple of 8 rows): the tiles over rows as stored may not. */
static int64_t piece_start(const matmul_ctx *c, int j, int task) {
    const int64_t g = task >= c->n_tasks ? c->total : c->total * task / c->n_tasks;
    const int64_t rows = c->start[j + 1] - c->start[j];
    const int64_t r = (g - c->start[j] + 8) / 16 * 16;
    return r < 0 ? 0 : r > rows ? rows : r;
}

/* Rows [*r0, *r1) of job j that task `task` computes (none: *r1 <= *r0). */
static void task_rows(const matmul_ctx *c, int j, int task, int64_t *r0, int64_t *r1) {
    if (c->chunk == 0) {
        *r0 = piece_start(c, j, task);
        *r1 = piece_start(c, j, task + 1);
        return;
    }
    const int64_t rows = c->jobs[j].w->rows;
    *r0 = task >= c->start[j] && task < c->start[j + 1] ? (task - c->start[j]) * c->chunk : 0;
    *r1 = task >= c->start[j] && task < c->start[j + 1] ? *r0 + c->chunk : 0;
    *r1 = *r1 < rows ? *r1 : rows;
}

static void matmul_task(void *ctx, int task, int thread) {
    (void)thread;
    const matmul_ctx *c = (const matmul_ctx *)ctx;
    for (int ji = 0; ji < c->n_jobs; ji++) {
        const sd_matmul_job *j = &c->jobs[ji];
        const sd_mat *w = j->w;
        int64_t r0, r1;
        task_rows(c, ji, task, &r0, &r1);
        if (r1 <= r0) {
            continue;
        }
        /* rows [r0, r1) for all T tokens in the type's tile kernel: each weight row is read
         * once for the whole batch */
        if (w->packed != NULL) { /* pieces are whole groups of 8 rows, as the repacked copy is */
            sd_tile_repacked(w->type, j->y + r0, w->rows, w->packed, r0, r1 - r0, &c->acts, c->T,
                             w->cols, j->bias != NULL ? j->bias + r0 : NULL, j->accumulate);
            continue;
        }
        sd_type_get(w->type)->tile(j->y + r0, w->rows,
                                   (const unsigned char *)w->data + (size_t)r0 * w->row_bytes,
                                   w->row_bytes, r1 - r0, &c->acts, c->T, w->cols,
                                   j->bias != NULL ? j->bias + r0 : NULL, j->accumulate);
    }
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

void sd_matmul(sd_threadpool *pool, int T, const sd_matmul_job *jobs, int n_jobs, unsigned char *xq,
               int xq_ready) {
    matmul_ctx c;
    memset(&c, 0, sizeof(c));
    c.jobs = jobs;
    c.n_jobs = n_jobs;
    c.T = T;
    const int64_t n = jobs[0].w->cols;
    c.acts.x = jobs[0].x;
    c.acts.ldx = n;
    int64_t total = 0;
    int packed = 1;
    for (int i = 0; i < n_jobs; i++) {
        total += jobs[i].w->rows;
        packed = packed && jobs[i].w->packed != NULL;
    }
    c.total = total;
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
    const int64_t nt = sd_threadpool_size(pool);
    if (packed) { /* pieces of equal sizes across the jobs, none under 16 rows */
        const int64_t most = (total + 15) / 16;
        c.n_tasks = (int)(2 * nt < most ? 2 * nt : most);
        int64_t row = 0;
        for (int i = 0; i <= n_jobs; i++) {
            c.start[i] = row;
            row += i < n_jobs ? jobs[i].w->rows : 0;
        }
    } else { /* tasks of `chunk` rows within each job, at the same rows as ever */
        int64_t chunk = total / (nt * 2);
        chunk = chunk < 16 ? 16 : (chunk + 15) / 16 * 16;
        c.chunk = chunk;
        int64_t tasks = 0;
        for (int i = 0; i < n_jobs; i++) {
            c.start[i] = tasks;
            tasks += (jobs[i].w->rows + chunk - 1) / chunk;
        }
        c.start[n_jobs] = tasks;
        c.n_tasks = (int)tasks;
    }
    sd_threadpool_run(pool, matmul_task, &c, c.n_tasks);
}

/* ---- row-parallel elementwise work ----------------------------------------------------------- */

typedef struct {
    float *out;
    const float *a, *b;
    int T, per;
    int64_t n;
    float eps;
    q8_out q; /* the output rows quantized here too, when q.xq is not NULL */
    int gelu; /* the gated unit's activation: 0 SiLU, 1 GELU (tanh form) */
} rows_ctx;

static void quant_task(void *ctx, int task, int thread) {
    (void)thread;
    const rows_ctx *c = (const rows_ctx *)ctx;
    const int t1 = (task + 1) * c->per < c->T ? (task + 1) * c->per : c->T;
    quantize_range(&c->q, c->a, task * c->per, t1, c->n);
}

void sd_quantize_rows(sd_threadpool *pool, unsigned char *xq, const float *x, int T, int64_t n) {
    rows_ctx c = {NULL, x, NULL, T, 0, n, 0.0f, q8_out_at(xq, T, n), 0};
    c.per = rows_per_task(pool, T, n, &c.q);
    sd_threadpool_run(pool, quant_task, &c, (T + c.per - 1) / c.per);
}

static void swiglu_task(void *ctx, int task, int thread) {
    (void)thread;
    const rows_ctx *c = (const rows_ctx *)ctx;
    const int t1 = (task + 1) * c->per < c->T ? (task + 1) * c->per : c->T;
    const size_t o = (size_t)task * (size_t)c->per * (size_t)c->n;
    (c->gelu ? sd_geglu : sd_swiglu)(c->out + o, c->a + o, c->b + o,
                                     (int64_t)(t1 - task * c->per) * c->n);
    if (c->q.xq != NULL) {
        quantize_range(&c->q, c->out, task * c->per, t1, c->n);
    }
}

static void glu_rows(sd_threadpool *pool, float *out, const float *gate, const float *up, int T,
                     int64_t n, unsigned char *xq, int gelu) {
    rows_ctx c = {out, gate, up, T, 0, n, 0.0f, q8_out_at(xq, T, n), gelu};
    c.per = rows_per_task(pool, T, n, &c.q);
    sd_threadpool_run(pool, swiglu_task, &c, (T + c.per - 1) / c.per);
}

void sd_swiglu_rows(sd_threadpool *pool, float *out, const float *gate, const float *up, int T,
                    int64_t n, unsigned char *xq) {
    glu_rows(pool, out, gate, up, T, n, xq, 0);
}

void sd_geglu_rows(sd_threadpool *pool, float *out, const float *gate, const float *up, int T,
                   int64_t n, unsigned char *xq) {
    glu_rows(pool, out, gate, up, T, n, xq, 1);
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
    rows_ctx c = {out, x, w, T, 0, n, eps, q8_out_at(xq, T, n), 0};
    c.per = rows_per_task(pool, T, n, &c.q);
    sd_threadpool_run(pool, rmsnorm_task, &c, (T + c.per - 1) / c.per);
}

/* ---- attention ------------------------------------------------------------------------------- */

void sd_key_put(void *k, int f16, int slot, int Dh, const float *row) {
    if (f16) {
        uint16_t h[SD_MAX_HEAD_DIM];
        sd_f32_to_f16_row(h, row, Dh);
        for (int d = 0; d < Dh; d++) {
            ((uint16_t *)k)[sd_key_at(slot, d, Dh)] = h[d];
        }
    } else {
        for (int d = 0; d < Dh; d++) {
            ((float *)k)[sd_key_at(slot, d, Dh)] = row[d];
        }
    }
}

void sd_key_get(float *row, const void *k, int f16, int slot, int Dh) {
    for (int d = 0; d < Dh; d++) {
        const size_t at = sd_key_at(slot, d, Dh);
        row[d] = f16 ? sd_f16_to_f32(((const uint16_t *)k)[at]) : ((const float *)k)[at];
    }
}

void sd_key_copy(void *k, int f16, int dst, int src, int Dh) {
    for (int d = 0; d < Dh; d++) {
        const size_t to = sd_key_at(dst, d, Dh), from = sd_key_at(src, d, Dh);
        if (f16) {
            ((uint16_t *)k)[to] = ((const uint16_t *)k)[from];
        } else {
            ((float *)k)[to] = ((const float *)k)[from];
        }
    }
}

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

/* One query: the portable twin of the SIMD kernel's per-query work; keys in tiles, or (rows)
 * in rows as values are. cap > 0: each scaled score s becomes cap * tanh(s / cap) (Gemma 2's
 * attention soft-cap, which the SIMD kernels do not have). */
static void attend_one(float *o, float *st, const float *q, const uint8_t *m, const void *k,
                       const void *v, int f16, int rows, int n_attn, int Dh, float scale, float cap,
                       float *sc) {
    float row[SD_MAX_HEAD_DIM];
    float mx = -INFINITY;
    for (int s = 0; s < n_attn; s++) {
        if (m[s]) {
            const float *ks = row;
            if (rows) {
                ks = kv_row(k, f16, s, Dh, row);
            } else {
                sd_key_get(row, k, f16, s, Dh);
            }
            sc[s] = sd_dot_f32(q, ks, Dh) * scale;
            if (cap > 0.0f) {
                sc[s] = cap * tanhf(sc[s] / cap);
            }
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
    st[0] = mx;
    st[1] = sum;
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
        attend_one(g->o[i], g->st[i], g->q[i], g->m[i], k, v, kv_f16, 0, n_attn, Dh, scale, 0.0f,
                   sc + (size_t)i * (size_t)n_attn);
    }
}

void sd_attend_rows_ref(const sd_attn_group *g, const float *k, const float *v, int n_attn, int Dh,
                        float scale, float *sc) {
    for (int i = 0; i < g->n; i++) {
        attend_one(g->o[i], g->st[i], g->q[i], g->m[i], k, v, 0, 1, n_attn, Dh, scale, 0.0f,
                   sc + (size_t)i * (size_t)n_attn);
    }
}

/* How sd_attention cuts its work: each KV head's T * G queries into per_kvh groups of up to
 * `group`, and its slots into n_chunks runs of SD_ATTN_CHUNK. A task is a group (which goes
 * over its runs one after the other) or, with `split`, one run of a group: then the runs of a
 * KV head's few queries go to different threads, and a second pass weighs them together. */
typedef struct {
    int group, per_kvh, n_chunks, split, n_tasks;
} attn_plan;

static attn_plan plan_attention(int T, int n_attn, int n_heads, int n_kv_heads, int nt) {
    attn_plan p;
    const int nq = T * (n_heads / n_kv_heads);
    p.n_chunks = (n_attn + SD_ATTN_CHUNK - 1) / SD_ATTN_CHUNK;
    /* groups as large as they can be: each group reads its KV head's keys and values once
     * (after a long context, from memory), so the fewer groups the less traffic */
    p.per_kvh = (nq + SD_ATTN_GROUP - 1) / SD_ATTN_GROUP;
    p.split = p.n_chunks > 1 && n_kv_heads * p.per_kvh < 2 * nt;
    if (p.n_chunks == 1 && n_kv_heads * p.per_kvh < 2 * nt) {
        /* one run: at least two tasks per thread, of equal sizes, by cutting the groups */
        const int min_per_kvh = (2 * nt + n_kv_heads - 1) / n_kv_heads;
        p.per_kvh = min_per_kvh < nq ? min_per_kvh : nq;
    }
    p.group = (nq + p.per_kvh - 1) / p.per_kvh;
    p.per_kvh = (nq + p.group - 1) / p.group;
    p.n_tasks = n_kv_heads * p.per_kvh * (p.split ? p.n_chunks : 1);
    return p;
}

/* The record of a query's run: its output (Dh floats) and sd_attn_group.st (2). */
#define ATTN_REC(Dh) ((size_t)(Dh) + 2)

size_t sd_attention_scratch(int n_attn, int head_dim, int n_threads) {
    const size_t nt = (size_t)(n_threads > 0 ? n_threads : 1);
    const size_t run = (size_t)(n_attn < SD_ATTN_CHUNK ? n_attn : SD_ATTN_CHUNK);
    const size_t n_chunks = ((size_t)n_attn + SD_ATTN_CHUNK - 1) / SD_ATTN_CHUNK;
    /* the scores of a thread's group; with several runs, their records: a group's on each
     * thread, or all of a split batch's (fewer than 2 nt KV-head groups, so fewer than
     * 2 nt * SD_ATTN_GROUP queries) */
    return nt * SD_ATTN_GROUP * run +
           (n_chunks > 1 ? 2 * nt * SD_ATTN_GROUP * n_chunks * ATTN_REC(head_dim) : 0);
}

typedef struct {
    float *out;
    const float *q;
    const void *k, *v;
    int kv_f16;
    size_t head_stride;
    const uint8_t *mask;
    int T, n_attn, n_heads, n_kv_heads, head_dim;
    float softcap; /* > 0: the portable kernel with the soft-cap, in place of sd_attend */
    float *scores; /* (n_threads, SD_ATTN_GROUP, min(n_attn, SD_ATTN_CHUNK)) */
    float *recs;   /* the runs' records, see rec_of */
    attn_plan p;
} attn_ctx;

/* The records of query i of the group starting at i0 of KV head kvh, one per run: all the
 * batch's when split (a second pass reads them), else the thread's own. */
static float *rec_of(const attn_ctx *c, int kvh, int i0, int i, int thread) {
    const int nq = c->T * (c->n_heads / c->n_kv_heads);
    const size_t at = c->p.split ? (size_t)kvh * (size_t)nq + (size_t)(i0 + i)
                                 : (size_t)thread * SD_ATTN_GROUP + (size_t)i;
    return c->recs + at * (size_t)c->p.n_chunks * ATTN_REC(c->head_dim);
}

/* Whether m[0 .. n) opens a slot. */
static int mask_any(const uint8_t *m, int n) {
    int s = 0;
    for (; s + 8 <= n; s += 8) {
        uint64_t w;
        memcpy(&w, m + s, 8);
        if (w != 0) {
            return 1;
        }
    }
    for (; s < n; s++) {
        if (m[s]) {
            return 1;
        }
    }
    return 0;
}

/* o (Dh) from a query's n_chunks run records: each run's output weighed by its share of the
 * softmax sum, exp(max_r - max) sum_r / sum over runs of the same, in run order. Runs without
 * an open slot (sum 0) weigh nothing. With one open run the weight is sum_r / sum_r = 1 and o
 * is that run's output, bit for bit. */
static void attn_merge(float *o, const float *rec, int n_chunks, int Dh) {
    const size_t rs = ATTN_REC(Dh);
    float mx = -INFINITY, total = 0.0f;
    for (int r = 0; r < n_chunks; r++) {
        const float *st = rec + (size_t)r * rs + Dh;
        mx = st[1] > 0.0f && st[0] > mx ? st[0] : mx;
    }
    for (int r = 0; r < n_chunks; r++) {
        const float *st = rec + (size_t)r * rs + Dh;
        total += st[1] > 0.0f ? expf(st[0] - mx) * st[1] : 0.0f;
    }
    int first = 1;
    for (int r = 0; r < n_chunks; r++) {
        const float *out_r = rec + (size_t)r * rs, *st = out_r + Dh;
        if (st[1] == 0.0f) { /* no open slot in this run (a NaN sum goes on, into o) */
            continue;
        }
        const float w = expf(st[0] - mx) * st[1] / total;
        if (first) {
            for (int d = 0; d < Dh; d++) {
                o[d] = w * out_r[d];
            }
        } else {
            for (int d = 0; d < Dh; d++) {
                o[d] += w * out_r[d];
            }
        }
        first = 0;
    }
}

/* sd_attend, or with c->softcap the portable kernel that caps the scores. */
static void attend_group(const attn_ctx *c, const sd_attn_group *g, const void *k, const void *v,
                         int n_attn, float scale, float *sc) {
    if (c->softcap <= 0.0f) {
        sd_attend(g, k, v, c->kv_f16, n_attn, c->head_dim, scale, sc);
        return;
    }
    for (int i = 0; i < g->n; i++) {
        attend_one(g->o[i], g->st[i], g->q[i], g->m[i], k, v, c->kv_f16, 0, n_attn, c->head_dim,
                   scale, c->softcap, sc + (size_t)i * (size_t)n_attn);
    }
}

/* Task = one group of up to p.group queries of one KV head (with p.split, one run of it): the
 * queries (token t, head h) with h in the KV head's G = H / Hkv heads, numbered t * G + (h mod
 * G), cut into groups. KV heads are the outer order, so the threads work on one head's keys
 * and values at a time. */
static void attn_task(void *ctx, int task, int thread) {
    const attn_ctx *c = (const attn_ctx *)ctx;
    const attn_plan *p = &c->p;
    const int G = c->n_heads / c->n_kv_heads;
    const int nq = c->T * G, Dh = c->head_dim;
    const int pair = p->split ? task / p->n_chunks : task;
    const int r_lo = p->split ? task % p->n_chunks : 0, r_hi = p->split ? r_lo + 1 : p->n_chunks;
    const int kvh = pair / p->per_kvh, i0 = (pair % p->per_kvh) * p->group;
    const int n = nq - i0 < p->group ? nq - i0 : p->group;
    const float *q[SD_ATTN_GROUP];
    float *o[SD_ATTN_GROUP];
    const uint8_t *m[SD_ATTN_GROUP];
    for (int i = 0; i < n; i++) {
        const int t = (i0 + i) / G, h = kvh * G + (i0 + i) % G;
        const size_t qo = ((size_t)t * (size_t)c->n_heads + (size_t)h) * (size_t)Dh;
        q[i] = c->q + qo;
        o[i] = c->out + qo;
        m[i] = c->mask + (size_t)t * (size_t)c->n_attn;
    }
    const size_t elt = c->kv_f16 ? 2u : 4u;
    const char *k = (const char *)c->k + (size_t)kvh * c->head_stride * elt;
    const char *v = (const char *)c->v + (size_t)kvh * c->head_stride * elt;
    const float scale = 1.0f / sqrtf((float)Dh);
    const int run = c->n_attn < SD_ATTN_CHUNK ? c->n_attn : SD_ATTN_CHUNK;
    float *sc = c->scores + (size_t)thread * SD_ATTN_GROUP * (size_t)run;
    sd_attn_group g;
    if (p->n_chunks == 1) { /* the outputs straight from the kernel */
        float st[SD_ATTN_GROUP][2];
        g.n = n;
        for (int i = 0; i < n; i++) {
            g.q[i] = q[i];
            g.o[i] = o[i];
            g.st[i] = st[i];
            g.m[i] = m[i];
        }
        attend_group(c, &g, k, v, c->n_attn, scale, sc);
        return;
    }
    int hi[SD_ATTN_GROUP]; /* each query's open slots end there */
    for (int i = 0; i < n; i++) {
        hi[i] = i > 0 && m[i] == m[i - 1] ? hi[i - 1] : sd_mask_end(m[i], c->n_attn);
    }
    for (int r = r_lo; r < r_hi; r++) {
        const int s0 = r * SD_ATTN_CHUNK;
        const int len = c->n_attn - s0 < SD_ATTN_CHUNK ? c->n_attn - s0 : SD_ATTN_CHUNK;
        g.n = 0;
        for (int i = 0; i < n; i++) { /* the queries that see a slot of this run */
            float *rec = rec_of(c, kvh, i0, i, thread) + (size_t)r * ATTN_REC(Dh);
            const int end = hi[i] - s0 < len ? hi[i] - s0 : len;
            if (end > 0 && mask_any(m[i] + s0, end)) {
                g.q[g.n] = q[i];
                g.o[g.n] = rec;
                g.st[g.n] = rec + Dh;
                g.m[g.n] = m[i] + s0;
                g.n++;
            } else {
                rec[Dh] = -INFINITY;
                rec[Dh + 1] = 0.0f;
            }
        }
        if (g.n > 0) {
            const size_t at = (size_t)s0 * (size_t)Dh * elt;
            attend_group(c, &g, k + at, v + at, len, scale, sc);
        }
    }
    if (!p->split) {
        for (int i = 0; i < n; i++) {
            attn_merge(o[i], rec_of(c, kvh, i0, i, thread), p->n_chunks, Dh);
        }
    }
}

/* The second pass of a split batch: token `task`'s outputs from its queries' run records. */
static void attn_merge_task(void *ctx, int task, int thread) {
    (void)thread;
    const attn_ctx *c = (const attn_ctx *)ctx;
    const int G = c->n_heads / c->n_kv_heads, nq = c->T * G, Dh = c->head_dim;
    for (int h = 0; h < c->n_heads; h++) {
        const size_t qi = (size_t)(h / G) * (size_t)nq + (size_t)(task * G + h % G);
        attn_merge(c->out + ((size_t)task * (size_t)c->n_heads + (size_t)h) * (size_t)Dh,
                   c->recs + qi * (size_t)c->p.n_chunks * ATTN_REC(Dh), c->p.n_chunks, Dh);
    }
}

void sd_attention(sd_threadpool *pool, float *out, const float *q, const void *k, const void *v,
                  int kv_f16, size_t head_stride, const uint8_t *mask, int T, int n_attn,
                  int n_heads, int n_kv_heads, int head_dim, float *scratch) {
    sd_attention_capped(pool, out, q, k, v, kv_f16, head_stride, mask, T, n_attn, n_heads,
                        n_kv_heads, head_dim, 0.0f, scratch);
}

void sd_attention_capped(sd_threadpool *pool, float *out, const float *q, const void *k,
                         const void *v, int kv_f16, size_t head_stride, const uint8_t *mask, int T,
                         int n_attn, int n_heads, int n_kv_heads, int head_dim, float softcap,
                         float *scratch) {
    const int nt = sd_threadpool_size(pool);
    const int run = n_attn < SD_ATTN_CHUNK ? n_attn : SD_ATTN_CHUNK;
    attn_ctx c = {.out = out,
                  .q = q,
                  .k = k,
                  .v = v,
                  .kv_f16 = kv_f16,
                  .head_stride = head_stride,
                  .mask = mask,
                  .T = T,
                  .n_attn = n_attn,
                  .n_heads = n_heads,
                  .n_kv_heads = n_kv_heads,
                  .head_dim = head_dim,
                  .softcap = softcap,
                  .scores = scratch,
                  .recs = scratch + (size_t)nt * SD_ATTN_GROUP * (size_t)run,
                  .p = plan_attention(T, n_attn, n_heads, n_kv_heads, nt)};
    sd_threadpool_run(pool, attn_task, &c, c.p.n_tasks);
    if (c.p.split) {
        sd_threadpool_run(pool, attn_merge_task, &c, T);
    }
}
