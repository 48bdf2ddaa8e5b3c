/* kcheck.c — the kernel checks' one entry point: run a CUDA launcher or its CPU twin (twins.h)
 * by name on host arrays. For the GPU every array is copied to the device, the launcher runs,
 * and every array is copied back; so a test can give both the same inputs and compare what
 * each wrote. Sizes are checked against the op's signature before anything runs. */
#include <stdlib.h>
#include <string.h>

#include "util/hd.h"
#include "cpu/ops_cpu.h"
#include "cpu/dispatch.h"
#include "cpu/quant.h"
#include "specdec.h"
#include "util/status.h"
#include "check/twins.h"
#ifdef SD_WITH_CUDA
#include "../cuda/sd_cuda.h"
#endif

#ifdef SD_WITH_CUDA
typedef sd_cuda_ctx kctx;
#define ON_GPU(call) return (call)
#else
typedef void kctx;
#define ON_GPU(call) return sd_set_error(SD_ERR_UNSUPPORTED, "this build has no CUDA backend")
#endif

/* An op: its argument kinds ('b' array, 'n' array or None, 'i' integer >= 0, 'u' 64 bits of
 * any value (seeds, counters), 'f' float), the
 * bytes each array must hold given the scalars, and the call (ctx NULL: the twin). */
typedef struct {
    const char *name;
    const char *sig;
    void (*sizes)(const sd_karg *a, size_t *need);
    sd_status (*run)(kctx *ctx, void **p, const sd_karg *a);
} kop;

#define I(j) ((int)a[j].i)
#define L(j) ((int64_t)a[j].i)
#define U(j) ((uint64_t)a[j].i)
#define F(j) ((float)a[j].f)

static size_t row_bytes(int type, int64_t n) {
    const size_t rb = sd_row_bytes(type, n);
    return rb > 0 ? rb : (size_t)-1; /* unknown type or ragged row: nothing fits */
}

/* embed(out, table, type, D, tokens, T, V): V only sizes the table */
static void sz_embed(const sd_karg *a, size_t *n) {
    n[0] = (size_t)I(5) * (size_t)L(3) * 4;
    n[1] = (size_t)L(6) * row_bytes(I(2), L(3));
    n[4] = (size_t)I(5) * 4;
}
static sd_status run_embed(kctx *c, void **p, const sd_karg *a) {
    if (c == NULL) {
        sd_twin_embed(p[0], p[1], I(2), L(3), p[4], I(5));
        return SD_OK;
    }
    ON_GPU(sd_cuda_embed(c, p[0], p[1], I(2), L(3), p[4], I(5)));
}

/* rmsnorm(out, x, w, T, n, eps) */
static void sz_rmsnorm(const sd_karg *a, size_t *n) {
    n[0] = n[1] = (size_t)I(3) * (size_t)I(4) * 4;
    n[2] = (size_t)I(4) * 4;
}
static sd_status run_rmsnorm(kctx *c, void **p, const sd_karg *a) {
    if (c == NULL) {
        sd_twin_rmsnorm(p[0], p[1], p[2], I(3), I(4), F(5));
        return SD_OK;
    }
    ON_GPU(sd_cuda_rmsnorm(c, p[0], p[1], p[2], I(3), I(4), F(5)));
}

/* rope(x, pos, freq, T, n_heads, head_dim, neox) */
static void sz_rope(const sd_karg *a, size_t *n) {
    n[0] = (size_t)I(3) * (size_t)I(4) * (size_t)I(5) * 4;
    n[1] = (size_t)I(3) * 4;
    n[2] = (size_t)(I(5) / 2) * 8;
}
static sd_status run_rope(kctx *c, void **p, const sd_karg *a) {
    if (c == NULL) {
        sd_twin_rope(p[0], p[1], p[2], I(3), I(4), I(5), I(6));
        return SD_OK;
    }
    ON_GPU(sd_cuda_rope(c, p[0], p[1], p[2], I(3), I(4), I(5), I(6)));
}

/* swiglu(out, gate, up, n) */
static void sz_swiglu(const sd_karg *a, size_t *n) {
    n[0] = n[1] = n[2] = (size_t)L(3) * 4;
}
static sd_status run_swiglu(kctx *c, void **p, const sd_karg *a) {
    if (c == NULL) {
        sd_twin_swiglu(p[0], p[1], p[2], L(3));
        return SD_OK;
    }
    ON_GPU(sd_cuda_swiglu(c, p[0], p[1], p[2], L(3)));
}

/* head_input(out, e, x, w_in, w_hid, T, n, eps, norm_residual) */
static void sz_head_input(const sd_karg *a, size_t *n) {
    n[0] = (size_t)I(5) * (size_t)I(6) * 8;
    n[1] = n[2] = (size_t)I(5) * (size_t)I(6) * 4;
    n[3] = n[4] = (size_t)I(6) * 4;
}
static sd_status run_head_input(kctx *c, void **p, const sd_karg *a) {
    if (c == NULL) {
        sd_twin_head_input(p[0], p[1], p[2], p[3], p[4], I(5), I(6), F(7), I(8));
        return SD_OK;
    }
    ON_GPU(sd_cuda_head_input(c, p[0], p[1], p[2], p[3], p[4], I(5), I(6), F(7), I(8)));
}

/* silu_add(x, u, n) */
static void sz_silu_add(const sd_karg *a, size_t *n) {
    n[0] = n[1] = (size_t)L(2) * 4;
}
static sd_status run_silu_add(kctx *c, void **p, const sd_karg *a) {
    if (c == NULL) {
        sd_twin_silu_add(p[0], p[1], L(2));
        return SD_OK;
    }
    ON_GPU(sd_cuda_silu_add(c, p[0], p[1], L(2)));
}

/* f16_row(dst, x, n): the CPU cache's rounding of n floats to halves (sd_f32_to_f16_row, the
 * kernel this CPU picks); the CPU only */
static void sz_f16_row(const sd_karg *a, size_t *n) {
    n[0] = (size_t)L(2) * 2;
    n[1] = (size_t)L(2) * 4;
}
static sd_status run_f16_row(kctx *c, void **p, const sd_karg *a) {
    if (c != NULL) {
        return sd_set_error(SD_ERR_UNSUPPORTED, "f16_row runs on the CPU only");
    }
    sd_kernels_init();
    sd_f32_to_f16_row(p[0], p[1], L(2));
    return SD_OK;
}

/* kv_write(kc, vc, k, v, slots, T, n_kv_heads, head_dim, capacity) */
static void sz_kv_write(const sd_karg *a, size_t *n) {
    n[0] = n[1] = (size_t)I(6) * (size_t)I(8) * (size_t)I(7) * 4;
    n[2] = n[3] = (size_t)I(5) * (size_t)I(6) * (size_t)I(7) * 4;
    n[4] = (size_t)I(5) * 4;
}
static sd_status run_kv_write(kctx *c, void **p, const sd_karg *a) {
    const int32_t *slots = p[4];
    for (int t = 0; c == NULL && t < I(5); t++) { /* the twin reads slots on the host */
        if (slots[t] < 0 || slots[t] >= I(8)) {
            return sd_set_error(SD_ERR_INVALID_ARG, "kv_write: slot %d outside [0, %d)", slots[t],
                                I(8));
        }
    }
    if (c == NULL) {
        sd_twin_kv_write(p[0], p[1], p[2], p[3], p[4], I(5), I(6), I(7), I(8));
        return SD_OK;
    }
    ON_GPU(sd_cuda_kv_write(c, p[0], p[1], p[2], p[3], p[4], I(5), I(6), I(7), I(8)));
}

/* attention(out, q, kc, vc, mask, T, n_attn, n_heads, n_kv_heads, head_dim, capacity) */
static void sz_attention(const sd_karg *a, size_t *n) {
    n[0] = n[1] = (size_t)I(5) * (size_t)I(7) * (size_t)I(9) * 4;
    n[2] = n[3] = (size_t)I(8) * (size_t)I(10) * (size_t)I(9) * 4;
    n[4] = (size_t)I(5) * (size_t)I(6);
}
static sd_status run_attention(kctx *c, void **p, const sd_karg *a) {
    if (c == NULL) {
        sd_twin_attention(p[0], p[1], p[2], p[3], p[4], I(5), I(6), I(7), I(8), I(9), I(10));
        return SD_OK;
    }
    ON_GPU(sd_cuda_attention(c, p[0], p[1], p[2], p[3], p[4], I(5), I(6), I(7), I(8), I(9), I(10)));
}

/* attention_cpu: the same arguments through the CPU forward pass's attention (the kernel this
 * CPU picks, on a pool of two threads), not the portable twin; the CPU only. attention_cpu_f16:
 * the same with kc, vc as IEEE halves (the CPU's f16 cache). */
static void sz_attention_f16(const sd_karg *a, size_t *n) {
    sz_attention(a, n);
    n[2] = n[3] = n[2] / 2;
}
static sd_status attention_cpu(kctx *c, void **p, const sd_karg *a, int kv_f16) {
    if (c != NULL) {
        return sd_set_error(SD_ERR_UNSUPPORTED, "attention_cpu runs on the CPU only");
    }
    const int T = I(5), n_attn = I(6), H = I(7), Hkv = I(8), Dh = I(9), cap = I(10);
    if (n_attn < 1 || n_attn > cap || Hkv < 1 || H % Hkv != 0 || Dh < 1) {
        return sd_set_error(SD_ERR_INVALID_ARG,
                            "attention_cpu needs 1 <= n_attn <= capacity, n_kv_heads dividing "
                            "n_heads and head_dim >= 1");
    }
    for (int t = 0; t < T; t++) {
        const uint8_t *m = (const uint8_t *)p[4] + (size_t)t * (size_t)n_attn;
        int open = 0;
        for (int s = 0; s < n_attn && !open; s++) {
            open = m[s] != 0;
        }
        if (!open) {
            return sd_set_error(SD_ERR_INVALID_ARG, "mask row %d attends to no slot", t);
        }
    }
    sd_kernels_init();
    /* the rows given, laid out as a cache holds them: each head's keys in tiles, its values in
     * rows, heads sd_kv_slots(cap) slots apart */
    const int elt = kv_f16 ? 2 : 4, stride = sd_kv_slots(cap);
    const size_t head = (size_t)stride * (size_t)Dh;
    char *k = calloc(2 * (size_t)Hkv * head, (size_t)elt);
    char *v = k != NULL ? k + (size_t)Hkv * head * elt : NULL;
    float *scores = malloc(sd_attention_scratch(n_attn, Dh, 2) * sizeof(float));
    sd_threadpool *pool = NULL;
    sd_status st = k == NULL || scores == NULL ? sd_set_error(SD_ERR_NOMEM, "out of memory")
                                               : sd_threadpool_create(&pool, 2);
    if (st == SD_OK) {
        for (int h = 0; h < Hkv; h++) {
            for (int s = 0; s < cap; s++) {
                const size_t from = ((size_t)h * (size_t)cap + (size_t)s) * (size_t)Dh * elt;
                for (int d = 0; d < Dh; d++) {
                    memcpy(k + (h * head + sd_key_at(s, d, Dh)) * elt,
                           (const char *)p[2] + from + (size_t)d * elt, (size_t)elt);
                }
                memcpy(v + (h * head + (size_t)s * (size_t)Dh) * elt, (const char *)p[3] + from,
                       (size_t)Dh * elt);
            }
        }
        sd_attention(pool, p[0], p[1], k, v, kv_f16, head, p[4], T, n_attn, H, Hkv, Dh, scores);
    }
    sd_threadpool_free(pool);
    free(scores);
    free(k);
    return st;
}
static sd_status run_attention_cpu(kctx *c, void **p, const sd_karg *a) {
    return attention_cpu(c, p, a, 0);
}
static sd_status run_attention_cpu_f16(kctx *c, void **p, const sd_karg *a) {
    return attention_cpu(c, p, a, 1);
}

/* matmul(y, ldy, w, type, rows, cols, x, T, bias, accumulate) */
static void sz_matmul(const sd_karg *a, size_t *n) {
    n[0] = (size_t)I(7) * (size_t)L(1) * 4;
    n[2] = (size_t)L(4) * row_bytes(I(3), L(5));
    n[6] = (size_t)I(7) * (size_t)L(5) * 4;
    n[8] = (size_t)L(4) * 4;
}
static sd_status run_matmul(kctx *c, void **p, const sd_karg *a) {
    if (c == NULL) {
        sd_twin_matmul(p[0], L(1), p[2], I(3), L(4), L(5), p[6], I(7), p[8], I(9));
        return SD_OK;
    }
    ON_GPU(sd_cuda_matmul(c, p[0], L(1), p[2], I(3), L(4), L(5), p[6], I(7), p[8], I(9)));
}

/* matmul_mma: the same arguments; the tensor-core kernel of BF16 rows (twin: the same twin) */
static sd_status run_matmul_mma(kctx *c, void **p, const sd_karg *a) {
    if (c == NULL) {
        sd_twin_matmul(p[0], L(1), p[2], I(3), L(4), L(5), p[6], I(7), p[8], I(9));
        return SD_OK;
    }
    ON_GPU(sd_cuda_matmul_mma(c, p[0], L(1), p[2], I(3), L(4), L(5), p[6], I(7), p[8], I(9)));
}

/* process(probs, logits, rows, V, temperature, top_k, top_p, min_p) */
static void sz_process(const sd_karg *a, size_t *n) {
    n[0] = n[1] = (size_t)I(2) * (size_t)I(3) * 4;
}
static sd_status run_process(kctx *c, void **p, const sd_karg *a) {
    if (c == NULL) {
        sd_twin_process(p[0], p[1], I(2), I(3), F(4), I(5), F(6), F(7));
        return SD_OK;
    }
    ON_GPU(sd_cuda_process(c, p[0], p[1], I(2), I(3), F(4), I(5), F(6), F(7)));
}

/* argmax(out, x, rows, V) */
static void sz_argmax(const sd_karg *a, size_t *n) {
    n[0] = (size_t)I(2) * 4;
    n[1] = (size_t)I(2) * (size_t)I(3) * 4;
}
static sd_status run_argmax(kctx *c, void **p, const sd_karg *a) {
    if (c == NULL) {
        sd_twin_argmax(p[0], p[1], I(2), I(3));
        return SD_OK;
    }
    ON_GPU(sd_cuda_argmax(c, p[0], p[1], I(2), I(3)));
}

/* sample(out, probs, rows, V, seed, stream, index0) */
static void sz_sample(const sd_karg *a, size_t *n) {
    n[0] = (size_t)I(2) * 4;
    n[1] = (size_t)I(2) * (size_t)I(3) * 4;
}
static sd_status run_sample(kctx *c, void **p, const sd_karg *a) {
    if (c == NULL) {
        sd_twin_sample(p[0], p[1], I(2), I(3), U(4), U(5), U(6));
        return SD_OK;
    }
    ON_GPU(sd_cuda_sample(c, p[0], p[1], I(2), I(3), U(4), U(5), U(6)));
}

/* verify(result, p, q, draft, K, V, seed, pos0) */
static void sz_verify(const sd_karg *a, size_t *n) {
    n[0] = 8;
    n[1] = (size_t)(I(4) + 1) * (size_t)I(5) * 4;
    n[2] = (size_t)I(4) * (size_t)I(5) * 4;
    n[3] = (size_t)I(4) * 4;
}
static sd_status run_verify(kctx *c, void **p, const sd_karg *a) {
    const int32_t *d = p[3];
    for (int i = 0; c == NULL && i < I(4); i++) {
        if (d[i] < 0 || d[i] >= I(5)) {
            return sd_set_error(SD_ERR_INVALID_ARG, "verify: draft %d outside [0, %d)", d[i], I(5));
        }
    }
    if (c == NULL) {
        sd_twin_verify(p[0], p[1], p[2], p[3], I(4), I(5), U(6), U(7));
        return SD_OK;
    }
    ON_GPU(sd_cuda_verify(c, p[0], p[1], p[2], p[3], I(4), I(5), U(6), U(7)));
}

/* row_top(out, x, rows, V, top) */
static void sz_row_top(const sd_karg *a, size_t *n) {
    n[0] = (size_t)I(2) * (size_t)I(4) * 4;
    n[1] = (size_t)I(2) * (size_t)I(3) * 4;
}
static sd_status run_row_top(kctx *c, void **p, const sd_karg *a) {
    if (I(4) < 1 || I(4) > SD_RECYCLE_MAX_TOP) {
        return sd_set_error(SD_ERR_INVALID_ARG, "row_top: top %d outside [1, %d]", I(4),
                            SD_RECYCLE_MAX_TOP);
    }
    if (c == NULL) {
        sd_twin_row_top(p[0], p[1], I(2), I(3), I(4));
        return SD_OK;
    }
    ON_GPU(sd_cuda_row_top(c, p[0], p[1], I(2), I(3), I(4)));
}

/* verify_tree(result, p, q, tokens, parent, n, V, seed, out_pos): a tree's nodes with parents
 * before children and distinct sibling tokens, as a drafter proposes them */
static void sz_verify_tree(const sd_karg *a, size_t *n) {
    n[0] = (size_t)(I(5) + 2) * 4;
    n[1] = (size_t)(I(5) + 1) * (size_t)I(6) * 4;
    n[2] = (size_t)I(5) * (size_t)I(6) * 4;
    n[3] = n[4] = (size_t)I(5) * 4;
}
static sd_status run_verify_tree(kctx *c, void **p, const sd_karg *a) {
    const int32_t *t = p[3], *par = p[4];
    if (I(5) < 1 || I(5) > SD_MAX_TREE_NODES) {
        return sd_set_error(SD_ERR_INVALID_ARG, "verify_tree: %d nodes outside [1, %d]", I(5),
                            SD_MAX_TREE_NODES);
    }
    for (int i = 0; c == NULL && i < I(5); i++) { /* host arrays: the twin's inputs */
        if (t[i] < 0 || t[i] >= I(6) || par[i] < -1 || par[i] >= i) {
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "verify_tree: node %d has token %d (V = %d) and parent %d", i, t[i],
                                I(6), par[i]);
        }
    }
    if (c == NULL) {
        sd_twin_verify_tree(p[0], p[1], p[2], p[3], p[4], I(5), I(6), U(7), U(8));
        return SD_OK;
    }
    ON_GPU(sd_cuda_verify_tree(c, p[0], p[1], p[2], p[3], p[4], I(5), I(6), U(7), U(8)));
}

/* synthetic_accept(n_acc, K, alpha, seed, pos0) */
static void sz_synthetic(const sd_karg *a, size_t *n) {
    (void)a;
    n[0] = 4;
}
static sd_status run_synthetic(kctx *c, void **p, const sd_karg *a) {
    if (c == NULL) {
        sd_twin_synthetic_accept(p[0], I(1), a[2].f, U(3), U(4));
        return SD_OK;
    }
    ON_GPU(sd_cuda_synthetic_accept(c, p[0], I(1), a[2].f, U(3), U(4)));
}

/* dummy_fill(dst, type, rows, cols, seed, tensor, scale) */
static void sz_dummy(const sd_karg *a, size_t *n) {
    n[0] = (size_t)L(2) * row_bytes(I(1), L(3));
}
static sd_status run_dummy(kctx *c, void **p, const sd_karg *a) {
    if (c == NULL) {
        sd_twin_dummy_fill(p[0], I(1), L(2), L(3), U(4), U(5), F(6));
        return SD_OK;
    }
    ON_GPU(sd_cuda_dummy_fill(c, p[0], I(1), L(2), L(3), U(4), U(5), F(6)));
}

static const kop g_ops[] = {
    {"embed", "bbiibii", sz_embed, run_embed},
    {"rmsnorm", "bbbiif", sz_rmsnorm, run_rmsnorm},
    {"rope", "bbbiiii", sz_rope, run_rope},
    {"swiglu", "bbbi", sz_swiglu, run_swiglu},
    {"head_input", "bbbbbiifi", sz_head_input, run_head_input},
    {"silu_add", "bbi", sz_silu_add, run_silu_add},
    {"f16_row", "bbi", sz_f16_row, run_f16_row},
    {"kv_write", "bbbbbiiii", sz_kv_write, run_kv_write},
    {"attention", "bbbbbiiiiii", sz_attention, run_attention},
    {"attention_cpu", "bbbbbiiiiii", sz_attention, run_attention_cpu},
    {"attention_cpu_f16", "bbbbbiiiiii", sz_attention_f16, run_attention_cpu_f16},
    {"matmul", "bibiiibini", sz_matmul, run_matmul},
    {"matmul_mma", "bibiiibini", sz_matmul, run_matmul_mma},
    {"process", "bbiififf", sz_process, run_process},
    {"argmax", "bbii", sz_argmax, run_argmax},
    {"sample", "bbiiuuu", sz_sample, run_sample},
    {"verify", "bbnbiiuu", sz_verify, run_verify},
    {"verify_tree", "bbnbbiiuu", sz_verify_tree, run_verify_tree},
    {"row_top", "bbiii", sz_row_top, run_row_top},
    {"synthetic_accept", "bifuu", sz_synthetic, run_synthetic},
    {"dummy_fill", "biiiuuf", sz_dummy, run_dummy},
};

/* The ops with a weight type: its argument index, or -1. */
static int type_arg(const char *name) {
    if (strcmp(name, "embed") == 0) {
        return 2;
    }
    if (strcmp(name, "matmul") == 0 || strcmp(name, "matmul_mma") == 0) {
        return 3;
    }
    return strcmp(name, "dummy_fill") == 0 ? 1 : -1;
}

const char *sd_kernel_names(int i) {
    return i >= 0 && i < (int)(sizeof(g_ops) / sizeof(g_ops[0])) ? g_ops[i].name : NULL;
}

sd_status sd_kernel_run(const char *name, int device, sd_karg *args, int n_args) {
    const kop *op = NULL;
    for (size_t i = 0; i < sizeof(g_ops) / sizeof(g_ops[0]); i++) {
        if (strcmp(g_ops[i].name, name) == 0) {
            op = &g_ops[i];
        }
    }
    if (op == NULL) {
        return sd_set_error(SD_ERR_INVALID_ARG, "no kernel named '%s'", name);
    }
    const int n = (int)strlen(op->sig);
    if (n_args != n || n > 16) {
        return sd_set_error(SD_ERR_INVALID_ARG, "kernel '%s' takes %d arguments, got %d", name, n,
                            n_args);
    }
    const int ta = type_arg(name);
    if (ta >= 0) {
        const sd_type_traits *tr = sd_type_get((int)args[ta].i);
        if (tr == NULL || tr->to_float == NULL) {
            return sd_set_error(SD_ERR_INVALID_ARG, "kernel '%s': type %lld has no kernels", name,
                                (long long)args[ta].i);
        }
    }
    for (int j = 0; j < n; j++) {
        if (op->sig[j] == 'i' && args[j].i < 0) {
            return sd_set_error(SD_ERR_INVALID_ARG, "kernel '%s': argument %d is negative", name,
                                j);
        }
    }
    size_t need[16] = {0};
    op->sizes(args, need);
    for (int j = 0; j < n; j++) {
        const char k = op->sig[j];
        if ((k == 'b' && args[j].data == NULL) ||
            ((k == 'b' || k == 'n') && args[j].data != NULL && args[j].bytes != need[j])) {
            return sd_set_error(SD_ERR_INVALID_ARG,
                                "kernel '%s': argument %d must be an array of %zu bytes, got %zu",
                                name, j, need[j], args[j].data != NULL ? args[j].bytes : 0);
        }
    }
    if (strcmp(name, "embed") == 0) {
        const int32_t *tok = args[4].data;
        for (int t = 0; t < (int)args[5].i; t++) {
            if (tok[t] < 0 || tok[t] >= args[6].i) {
                return sd_set_error(SD_ERR_INVALID_ARG, "embed: token %d outside [0, %lld)", tok[t],
                                    (long long)args[6].i);
            }
        }
    }
    void *p[16] = {0};
    if (device == SD_DEVICE_CPU) {
        for (int j = 0; j < n; j++) {
            p[j] = args[j].data;
        }
        return op->run(NULL, p, args);
    }
#ifdef SD_WITH_CUDA
    sd_cuda_ctx *ctx = NULL;
    SD_TRY(sd_cuda_ctx_create(&ctx));
    sd_status st = SD_OK;
    for (int j = 0; st == SD_OK && j < n; j++) {
        if (args[j].data != NULL && (op->sig[j] == 'b' || op->sig[j] == 'n')) {
            st = sd_cuda_alloc(ctx, &p[j], args[j].bytes);
            if (st == SD_OK) {
                st = sd_cuda_upload(ctx, p[j], args[j].data, args[j].bytes);
            }
        }
    }
    if (st == SD_OK) {
        st = op->run(ctx, p, args);
    }
    if (st == SD_OK) {
        st = sd_cuda_sync(ctx);
    }
    for (int j = 0; st == SD_OK && j < n; j++) {
        if (p[j] != NULL) {
            st = sd_cuda_download(ctx, args[j].data, p[j], args[j].bytes);
        }
    }
    for (int j = 0; j < n; j++) {
        sd_cuda_free(ctx, p[j]);
    }
    sd_cuda_ctx_free(ctx);
    return st;
#else
    return sd_set_error(SD_ERR_UNSUPPORTED,
                        "this build has no CUDA backend (nvcc was not found when it was built)");
#endif
}
