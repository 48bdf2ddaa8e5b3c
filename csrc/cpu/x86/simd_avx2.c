/* simd_avx2.c — AVX2/FMA/F16C twins of the scalar row kernels in quant.c.
 * Each function carries its own target attribute, so this file builds with the default flags
 * and is only called after sd_cpu_has_avx2_fma_f16c() said yes. */
#include "cpu/x86/simd.h"

#ifdef SD_HAVE_X86_SIMD

#include <cpuid.h>
#include <math.h>
#include <immintrin.h>
#include <string.h>

#include "cpu/ops_cpu.h"
#include "cpu/x86/simd_exp.h"

int sd_cpu_has_avx2_fma_f16c(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) {
        return 0;
    }
    const int f16c = (c >> 29) & 1u;
    /* avx2 and fma as the compiler runtime sees them (it also checks the OS saves the
     * AVX registers) */
    __builtin_cpu_init();
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

SD_AVX2 static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehdup_ps(lo);
    lo = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, lo);
    lo = _mm_add_ss(lo, sh);
    return _mm_cvtss_f32(lo);
}

SD_AVX2 static inline __m256 load_f16x8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

SD_AVX2 static inline __m256 load_bf16x8(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

SD_AVX2 float sd_dot_f32_avx2(const float *a, const float *b, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps();
    __m256 acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    }
    float s = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) {
        s += a[i] * b[i];
    }
    return s;
}

SD_AVX2 void sd_f16_to_f32_avx2(float *dst, const void *src, int64_t n) {
    const uint16_t *h = (const uint16_t *)src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i, load_f16x8(h + i));
    }
    for (; i < n; i++) {
        dst[i] = _cvtsh_ss(h[i]);
    }
}

SD_AVX2 void sd_f32_to_f16_row_avx2(uint16_t *dst, const float *x, int64_t n) {
    const __m256 lo = _mm256_set1_ps(-65504.0f), hi = _mm256_set1_ps(65504.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        /* max/min return their second operand for a NaN, so NaN passes through */
        const __m256 f = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_loadu_ps(x + i)));
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++) {
        const float f = x[i] > 65504.0f ? 65504.0f : x[i] < -65504.0f ? -65504.0f : x[i];
        dst[i] = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    }
}

SD_AVX2 void sd_bf16_to_f32_avx2(float *dst, const void *src, int64_t n) {
    const uint16_t *h = (const uint16_t *)src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i, load_bf16x8(h + i));
    }
    for (; i < n; i++) {
        uint32_t bits = (uint32_t)h[i] << 16;
        memcpy(dst + i, &bits, sizeof(float));
    }
}

SD_AVX2 void sd_axpy_f32_avx2(float *y, float a, const float *x, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++) {
        y[i] += a * x[i];
    }
}

/* ---- SwiGLU and attention (exp256, exp512: simd_exp.h) ---------------------------------------
 */

SD_AVX2 static inline __m256 swiglu8(__m256 g, __m256 u) {
    const __m256 den =
        _mm256_add_ps(_mm256_set1_ps(1.0f), exp256(_mm256_sub_ps(_mm256_setzero_ps(), g)));
    return _mm256_mul_ps(_mm256_div_ps(g, den), u);
}

/* gelu(g) u in sd_geglu_ref's form: g / (1 + exp(-2c (g + 0.044715 g^3))) u. */
SD_AVX2 static inline __m256 geglu8(__m256 g, __m256 u) {
    const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    const __m256 inner = _mm256_fmadd_ps(_mm256_set1_ps(SD_GELU_CUBIC), g3, g);
    const __m256 den = _mm256_add_ps(_mm256_set1_ps(1.0f),
                                     exp256(_mm256_mul_ps(_mm256_set1_ps(-SD_GELU_2C), inner)));
    return _mm256_mul_ps(_mm256_div_ps(g, den), u);
}

/* Every element takes the same vector path (the tail through masked loads), so a value does not
 * depend on where a row starts or how many rows a call covers. */
#define SD_GLU_ROW(unit)                                                                           \
    int64_t i = 0;                                                                                 \
    for (; i + 8 <= n; i += 8) {                                                                   \
        _mm256_storeu_ps(out + i, unit(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));       \
    }                                                                                              \
    if (i < n) {                                                                                   \
        const __m256i lm = lanes_below((int)(n - i));                                              \
        _mm256_maskstore_ps(                                                                       \
            out + i, lm, unit(_mm256_maskload_ps(gate + i, lm), _mm256_maskload_ps(up + i, lm)));  \
    }

SD_AVX2 void sd_swiglu_avx2(float *out, const float *gate, const float *up,
                            int64_t n){SD_GLU_ROW(swiglu8)}

SD_AVX2 void sd_geglu_avx2(float *out, const float *gate, const float *up, int64_t n) {
    SD_GLU_ROW(geglu8)
}

/* The KV cache holds f32 or IEEE halves (F16 = 1, a compile-time constant in the kernels
 * below); a half widens to f32 exactly, so both give the same arithmetic on the values held. */
#define SD_INLINE static inline __attribute__((always_inline))

/* Eight cache elements from element i of p, as floats. */
SD_AVX2 SD_INLINE __m256 kv_load8(const int F16, const void *p, size_t i) {
    return F16 ? load_f16x8((const uint16_t *)p + i) : _mm256_loadu_ps((const float *)p + i);
}

/* Bytes of n cache elements, and element i of p as an address. */
SD_INLINE size_t kv_size(const int F16, size_t n) {
    return n * (F16 ? 2u : 4u);
}
SD_INLINE const char *kv_at(const int F16, const void *p, size_t i) {
    return (const char *)p + kv_size(F16, i);
}

/* ---- scores over tiled keys ------------------------------------------------------------------
 * A score's arithmetic, the same in every kernel here and whatever the group: for each lane
 * l < 8, c_l = the chain of FMAs from zero of q[d] k[d] over d = l, l + 8, ..., l + Dh - 8; the
 * dot product is ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)); the score that times scale,
 * or -inf where the mask shuts the slot. Over a tile of keys (SD_KV_TILE, ops_cpu.h) each c_l is
 * a vector over the tile's slots and the tree is vertical adds: no horizontal sums. */

/* Element d of the keys of a tile, eight slots from kt (a tile's first slot, or its ninth). */
SD_AVX2 SD_INLINE __m256 tile_load8(const int F16, const void *kt, int d) {
    return kv_load8(F16, kt, (size_t)d * SD_KV_TILE);
}

/* (c_l + c_(l+1)) + (c_(l+2) + c_(l+3)) of NQ (1 or 2) queries and eight keys of a tile (kt as
 * in tile_load8): 4 NQ chains in flight, each vector of keys loaded once for the NQ queries. */
SD_AVX2 SD_INLINE void lanes4_dots8(const int F16, const int NQ, const float *const *q,
                                    const void *kt, int Dh, int l, __m256 *h) {
    __m256 a[2][4];
    for (int i = 0; i < NQ; i++) {
        a[i][0] = a[i][1] = a[i][2] = a[i][3] = _mm256_setzero_ps();
    }
    for (int d = l; d < Dh; d += 8) {
        for (int u = 0; u < 4; u++) {
            const __m256 kd = tile_load8(F16, kt, d + u);
            for (int i = 0; i < NQ; i++) {
                a[i][u] = _mm256_fmadd_ps(_mm256_set1_ps(q[i][d + u]), kd, a[i][u]);
            }
        }
    }
    for (int i = 0; i < NQ; i++) {
        h[i] = _mm256_add_ps(_mm256_add_ps(a[i][0], a[i][1]), _mm256_add_ps(a[i][2], a[i][3]));
    }
}

/* The dot products of NQ (1 or 2) queries with eight keys of a tile: r[i] lane j = q[i] . k_j. */
SD_AVX2 SD_INLINE void tile_dots8(const int F16, const int NQ, const float *const *q,
                                  const void *kt, int Dh, __m256 *r) {
    __m256 lo[2], hi[2];
    lanes4_dots8(F16, NQ, q, kt, Dh, 0, lo);
    lanes4_dots8(F16, NQ, q, kt, Dh, 4, hi);
    for (int i = 0; i < NQ; i++) {
        r[i] = _mm256_add_ps(lo[i], hi[i]);
    }
}

/* softmax_row of a row with shut slots among its first n_attn (a tree's mask: a draft sees
 * its ancestors, not its cousins): the open slots' sum taken as if they were consecutive, in
 * lanes by their rank among the open slots, so that a token's bits do not depend on where its
 * context lies in the cache. A row without shut slots gives the same bits either way (its ranks
 * are its slots); each exponential is exp256's lane arithmetic. */
SD_AVX2 static void softmax_open(float *sc, int n_attn, float mx, float *st) {
    /* The run of open slots from slot 0 (a tree's context: every node sees it) is summed eight
     * at a time: there a slot's rank is the slot, so lane j adds the exponentials of slots j,
     * j + 8, ... in that order, as the loop below would; the rest (the tree's own slots, and
     * the run's last < 8) one by one. */
    int run = 0; /* the first shut slot, found eight slots at a time */
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    int shut = 0;
    for (; run + 8 <= n_attn; run += 8) {
        shut = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(sc + run), ninf, _CMP_EQ_OQ));
        if (shut != 0) {
            break;
        }
    }
    if (shut != 0) {
        run += __builtin_ctz((unsigned)shut);
    }
    while (run < n_attn && sc[run] != -INFINITY) {
        run++;
    }
    run &= ~7;
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    for (int s = 0; s < run; s += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + s), vmx));
        _mm256_storeu_ps(sc + s, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vsum);
    int r = run;
    for (int s = run; s < n_attn; s++) {
        if (sc[s] == -INFINITY) {
            sc[s] = 0.0f;
            continue;
        }
        sc[s] = _mm256_cvtss_f32(exp256(_mm256_set1_ps(sc[s] - mx)));
        lanes[r++ % 8] += sc[s];
    }
    st[0] = mx;
    st[1] = hsum256(_mm256_loadu_ps(lanes));
    const float inv = 1.0f / st[1];
    for (int s = 0; s < n_attn; s++) {
        sc[s] *= inv;
    }
}

/* Softmax in place over one query's scores sc[0 .. n_attn) (-inf for shut slots, at least one
 * open): the weights p_s, 0 for shut slots; st = the largest score and the sum of exponentials
 * the weights are divided by. */
SD_AVX2 static void softmax_row(float *sc, int n_attn, float *st) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmax = ninf, vshut = _mm256_setzero_ps();
    int s = 0;
    for (; s + 8 <= n_attn; s += 8) {
        const __m256 x = _mm256_loadu_ps(sc + s);
        vmax = _mm256_max_ps(vmax, x);
        vshut = _mm256_or_ps(vshut, _mm256_cmp_ps(x, ninf, _CMP_EQ_OQ));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float mx = _mm_cvtss_f32(m4);
    int shut = _mm256_movemask_ps(vshut) != 0;
    for (; s < n_attn; s++) {
        mx = sc[s] > mx ? sc[s] : mx;
        shut |= sc[s] == -INFINITY;
    }
    if (shut) {
        softmax_open(sc, n_attn, mx, st);
        return;
    }
    /* exp(-inf - mx) = 0 for the shut slots; the sum in lanes by slot mod 8 */
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    for (s = 0; s + 8 <= n_attn; s += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + s), vmx));
        _mm256_storeu_ps(sc + s, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    const __m256i lm = lanes_below(n_attn - s);
    if (s < n_attn) {
        const __m256 x =
            _mm256_blendv_ps(ninf, _mm256_maskload_ps(sc + s, lm), _mm256_castsi256_ps(lm));
        const __m256 e = exp256(_mm256_sub_ps(x, vmx));
        _mm256_maskstore_ps(sc + s, lm, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    st[0] = mx;
    st[1] = hsum256(vsum);
    const __m256 inv = _mm256_set1_ps(1.0f / st[1]);
    for (s = 0; s + 8 <= n_attn; s += 8) {
        _mm256_storeu_ps(sc + s, _mm256_mul_ps(_mm256_loadu_ps(sc + s), inv));
    }
    if (s < n_attn) {
        _mm256_maskstore_ps(sc + s, lm, _mm256_mul_ps(_mm256_maskload_ps(sc + s, lm), inv));
    }
}

/* How many slots ahead attention fetches keys and value rows into L1 (8: a block of keys). */
#define SD_ATTN_AHEAD 8

/* o[0 .. Dh) = sum_s p[s] v_s (v_s = v + s * Dh, contiguous rows), slot after slot into one
 * accumulator per 8 dimensions, 64 dimensions at a time: the value rows stream in order, eight
 * independent FMA chains keep the unit busy. Shut slots add 0 * v_s, which changes nothing, so
 * the sums do not depend on n_attn. */
SD_AVX2 SD_INLINE void weighted_sum(const int F16, float *o, const float *p, const void *v,
                                    int n_attn, int Dh) {
    const size_t ahead = kv_size(F16, SD_ATTN_AHEAD * (size_t)Dh);
    for (int d0 = 0; d0 < Dh; d0 += 64) {
        const int nv = Dh - d0 >= 64 ? 8 : (Dh - d0) / 8;
        __m256 a[8];
        for (int j = 0; j < 8; j++) {
            a[j] = _mm256_setzero_ps();
        }
        const void *vs = kv_at(F16, v, (size_t)d0);
        if (nv == 8) {
            for (int s = 0; s < n_attn; s++, vs = kv_at(F16, vs, (size_t)Dh)) {
                /* the value row SD_ATTN_AHEAD slots on (prefetches never fault past the
                 * cache) */
                for (size_t j = 0; j < kv_size(F16, 64); j += 64) {
                    _mm_prefetch((const char *)vs + ahead + j, _MM_HINT_T0);
                }
                const __m256 ps = _mm256_set1_ps(p[s]);
                for (int j = 0; j < 8; j++) {
                    a[j] = _mm256_fmadd_ps(ps, kv_load8(F16, vs, (size_t)(8 * j)), a[j]);
                }
            }
        } else {
            for (int s = 0; s < n_attn; s++, vs = kv_at(F16, vs, (size_t)Dh)) {
                const __m256 ps = _mm256_set1_ps(p[s]);
                for (int j = 0; j < nv; j++) {
                    a[j] = _mm256_fmadd_ps(ps, kv_load8(F16, vs, (size_t)(8 * j)), a[j]);
                }
            }
        }
        for (int j = 0; j < nv; j++) {
            _mm256_storeu_ps(o + d0 + 8 * j, a[j]);
        }
    }
}

/* Each query's slots end at its last open one, hi[i]: past it everything is shut (a causal
 * prefill's later keys, a verify batch's later drafts), and stopping there leaves the bits
 * unchanged (shut slots weigh exactly 0). Returns the largest. */
static int attend_ends(const sd_attn_group *g, int n_attn, int *hi) {
    int hi_max = 0;
    for (int i = 0; i < g->n; i++) {
        /* the heads of one token share its mask row */
        hi[i] = i > 0 && g->m[i] == g->m[i - 1] ? hi[i - 1] : sd_mask_end(g->m[i], n_attn);
        hi_max = hi[i] > hi_max ? hi[i] : hi_max;
    }
    return hi_max;
}

/* Scores of n <= 8 slots from their dot products into row: times scale, -inf where the mask
 * m shuts a slot. */
SD_AVX2 static inline void store_scores8(float *row, const uint8_t *m, __m256 dot, __m256 vscale,
                                         int n) {
    const __m256 x = _mm256_mul_ps(dot, vscale);
    if (n == 8) {
        uint64_t m8;
        memcpy(&m8, m, 8);
        const __m256 shut = _mm256_castsi256_ps(_mm256_cmpeq_epi32(
            _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m8)), _mm256_setzero_si256()));
        _mm256_storeu_ps(row, _mm256_blendv_ps(x, _mm256_set1_ps(-INFINITY), shut));
        return;
    }
    float t[8];
    _mm256_storeu_ps(t, x);
    for (int j = 0; j < n; j++) {
        row[j] = m[j] ? t[j] : -INFINITY;
    }
}

/* Floats of widened values a kernel keeps on its stack (16 KiB, in L1): a run of SD_ATTN_WIDE /
 * Dh value rows (64 when Dh = 64). */
#define SD_ATTN_WIDE (8 * SD_MAX_HEAD_DIM)

/* The queries of g that see slot s or one after it (s < hi[i]), into act; returns how many. */
static inline int attend_active(const sd_attn_group *g, const int *hi, int s, int *act) {
    int na = 0;
    for (int i = 0; i < g->n; i++) {
        if (s < hi[i]) {
            act[na++] = i;
        }
    }
    return na;
}

/* The first of the eight (F16: halves) keys of the tile that holds slot s (a multiple of 8). */
SD_INLINE const void *tile_at(const int F16, const void *k, int s, int Dh) {
    return kv_at(F16, k, (size_t)(s - s % SD_KV_TILE) * (size_t)Dh + (size_t)(s % SD_KV_TILE));
}

/* The queries of a group share the keys and values (heads of one KV head, tokens of a batch):
 * each vector of keys is loaded once for two queries, the keys and values of one KV head stay
 * in L2 while every query goes over them. A query's arithmetic is the same whatever group it
 * is in and whatever n_attn (the score's arithmetic above, lane by lane; the softmax takes
 * every slot the same way), so a verify batch gives the bits one-token decoding gives.
 * Dh % 8 == 0 (sd_attend takes other head sizes to the portable kernel). */
SD_AVX2 SD_INLINE void attend_avx2(const int F16, const sd_attn_group *g, const void *k,
                                   const void *v, int n_attn, int Dh, float scale, float *sc) {
    int hi[SD_ATTN_GROUP];
    const int hi_max = attend_ends(g, n_attn, hi);
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int s = 0; s < hi_max; s += 8) {
        const void *kt = tile_at(F16, k, s, Dh);
        int act[SD_ATTN_GROUP];
        const int na = attend_active(g, hi, s, act);
        for (int j = 0; j < na; j += 2) {
            const int nq = na - j < 2 ? 1 : 2;
            const float *q[2] = {g->q[act[j]], g->q[act[j + nq - 1]]};
            __m256 r[2];
            if (nq == 2) {
                tile_dots8(F16, 2, q, kt, Dh, r);
            } else {
                tile_dots8(F16, 1, q, kt, Dh, r);
            }
            for (int e = 0; e < nq; e++) {
                const int i = act[j + e], n = hi[i] - s < 8 ? hi[i] - s : 8;
                store_scores8(sc + (size_t)i * (size_t)n_attn + (size_t)s, g->m[i] + s, r[e],
                              vscale, n);
            }
        }
    }
    for (int i = 0; i < g->n; i++) {
        softmax_row(sc + (size_t)i * (size_t)n_attn, hi[i], g->st[i]);
    }
    for (int i = 0; i < g->n; i++) {
        weighted_sum(F16, g->o[i], sc + (size_t)i * (size_t)n_attn, v, hi[i], Dh);
    }
}

SD_AVX2 void sd_attend_avx2(const sd_attn_group *g, const void *k, const void *v, int kv_f16,
                            int n_attn, int Dh, float scale, float *sc) {
    if (kv_f16) {
        attend_avx2(1, g, k, v, n_attn, Dh, scale, sc);
    } else {
        attend_avx2(0, g, k, v, n_attn, Dh, scale, sc);
    }
}

/* ---- the same attention on AVX-512 (32 vector registers) ------------------------------------
 * The same arithmetic as sd_attend_avx2, instruction for instruction per query, so it gives the
 * same bits; what changes is how the work is shared. A whole tile of sixteen keys per vector,
 * each vector of keys loaded once for three queries, and four queries sum the value rows
 * together, 16 dimensions per register (a lane's sums are the same FMAs in the same slot order
 * as in eight-lane registers), so the values of a KV head come from L2 once per four queries
 * instead of once per query. */

/* softmax_row with its exponentials sixteen at a time, bit for bit: the maximum does not depend
 * on the order, each half of a 16-lane block of exponentials goes into softmax_row's 8-lane sum
 * in slot order (low half, then high), and the last block of 8 and the tail take softmax_row's
 * own instructions. */
SD_AVX512 static void softmax_row512(float *sc, int n_attn, float *st) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 vmax = ninf;
    __mmask16 vshut = 0;
    int s = 0;
    for (; s + 16 <= n_attn; s += 16) {
        const __m512 x = _mm512_loadu_ps(sc + s);
        vmax = _mm512_max_ps(vmax, x);
        vshut |= _mm512_cmp_ps_mask(x, ninf, _CMP_EQ_OQ);
    }
    float mx = _mm512_reduce_max_ps(vmax);
    int shut = vshut != 0;
    for (; s < n_attn; s++) {
        mx = sc[s] > mx ? sc[s] : mx;
        shut |= sc[s] == -INFINITY;
    }
    if (shut) {
        softmax_open(sc, n_attn, mx, st);
        return;
    }
    const __m512 vmx = _mm512_set1_ps(mx);
    const __m256 vmx8 = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    for (s = 0; s + 16 <= n_attn; s += 16) {
        const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(sc + s), vmx));
        _mm512_storeu_ps(sc + s, e);
        vsum = _mm256_add_ps(vsum, _mm512_castps512_ps256(e));
        vsum =
            _mm256_add_ps(vsum, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    }
    if (s + 8 <= n_attn) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + s), vmx8));
        _mm256_storeu_ps(sc + s, e);
        vsum = _mm256_add_ps(vsum, e);
        s += 8;
    }
    const __m256i lm = lanes_below(n_attn - s);
    if (s < n_attn) {
        const __m256 x = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(sc + s, lm),
                                          _mm256_castsi256_ps(lm));
        const __m256 e = exp256(_mm256_sub_ps(x, vmx8));
        _mm256_maskstore_ps(sc + s, lm, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    st[0] = mx;
    st[1] = hsum256(vsum);
    const float inv = 1.0f / st[1];
    const __m512 vinv = _mm512_set1_ps(inv);
    for (s = 0; s + 16 <= n_attn; s += 16) {
        _mm512_storeu_ps(sc + s, _mm512_mul_ps(_mm512_loadu_ps(sc + s), vinv));
    }
    for (; s < n_attn; s++) {
        sc[s] *= inv;
    }
}

/* Sixteen cache elements from element i of p as floats, or (half) eight and zeros. */
SD_AVX512 SD_INLINE __m512 kv_load16(const int F16, const void *p, size_t i, int half) {
    if (F16) {
        const uint16_t *h = (const uint16_t *)p + i;
        return half ? _mm512_zextps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)))
                    : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
    }
    const float *f = (const float *)p + i;
    return half ? _mm512_zextps256_ps512(_mm256_loadu_ps(f)) : _mm512_loadu_ps(f);
}

/* c_l + c_(l+1) of NQ (1 to 3) queries and the sixteen keys of the tile kt: 2 NQ chains in
 * flight, each vector of keys loaded, and widened from halves, once for the NQ queries. */
SD_AVX512 SD_INLINE void lanes2_dots16(const int F16, const int NQ, const float *const *q,
                                       const void *kt, int Dh, int l, __m512 *p) {
    __m512 a[3], b[3];
    for (int i = 0; i < NQ; i++) {
        a[i] = b[i] = _mm512_setzero_ps();
    }
    for (int d = l; d < Dh; d += 8) {
        const __m512 ka = kv_load16(F16, kt, (size_t)d * SD_KV_TILE, 0);
        const __m512 kb = kv_load16(F16, kt, (size_t)(d + 1) * SD_KV_TILE, 0);
        for (int i = 0; i < NQ; i++) {
            a[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][d]), ka, a[i]);
            b[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][d + 1]), kb, b[i]);
        }
    }
    for (int i = 0; i < NQ; i++) {
        p[i] = _mm512_add_ps(a[i], b[i]);
    }
}

/* The dot products of NQ (1 to 3) queries with the sixteen keys of the tile kt: r[i] lane j =
 * q[i] . k_j, the score's arithmetic of the AVX2 kernel lane by lane, the partial trees kept
 * in registers. */
SD_AVX512 SD_INLINE void tile_dots16(const int F16, const int NQ, const float *const *q,
                                     const void *kt, int Dh, __m512 *r) {
    __m512 t0[3], t1[3], p[3];
    lanes2_dots16(F16, NQ, q, kt, Dh, 0, t0);
    lanes2_dots16(F16, NQ, q, kt, Dh, 2, p);
    for (int i = 0; i < NQ; i++) {
        t0[i] = _mm512_add_ps(t0[i], p[i]); /* (c0 + c1) + (c2 + c3) */
    }
    lanes2_dots16(F16, NQ, q, kt, Dh, 4, t1);
    lanes2_dots16(F16, NQ, q, kt, Dh, 6, p);
    for (int i = 0; i < NQ; i++) {
        r[i] = _mm512_add_ps(t0[i], _mm512_add_ps(t1[i], p[i]));
    }
}

/* Scores of n <= 16 slots from their dot products into row: store_scores8's arithmetic. */
SD_AVX512 static inline void store_scores16(float *row, const uint8_t *m, __m512 dot, __m512 vscale,
                                            int n) {
    const __m512 x = _mm512_mul_ps(dot, vscale);
    if (n == 16) {
        uint64_t lo, hi;
        memcpy(&lo, m, 8);
        memcpy(&hi, m + 8, 8);
        const __mmask16 shut = _mm512_cmpeq_epi32_mask(
            _mm512_cvtepu8_epi32(_mm_set_epi64x((long long)hi, (long long)lo)),
            _mm512_setzero_si512());
        _mm512_storeu_ps(row, _mm512_mask_blend_ps(shut, x, _mm512_set1_ps(-INFINITY)));
        return;
    }
    float t[16];
    _mm512_storeu_ps(t, x);
    for (int j = 0; j < n; j++) {
        row[j] = m[j] ? t[j] : -INFINITY;
    }
}

/* weighted_sum of four queries at once over dimensions d0 .. d0 + 16 NV (the last register
 * holding `last` lanes, 8 or 16): o_i += p_i[s] v_s for s < hi[i], slot by slot, each query's
 * lanes only while s < hi[i] (a masked FMA leaves them as they are), so every lane sees exactly
 * the FMAs of weighted_sum. nq (1 to 4) queries, a compile-time constant like NV. Slots s0 to
 * s1 only, v at slot s0's row: with `resume` the sums go on from those in o (a float stored and
 * loaded again is the same float, so cutting the slots into runs changes no bit). */
SD_AVX512 SD_INLINE void values4(const int F16, const int NV, const int nq, float *const *o,
                                 const float *const *p, const int *hi, const void *v, int s0,
                                 int s1, int resume, int Dh, int d0, int last) {
    /* accumulators a<query><register> as named variables: GCC keeps an array of them in
     * memory across the masked FMAs */
    __m512 a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33;
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = _mm512_setzero_ps();
    a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = _mm512_setzero_ps();
    const __mmask16 lm = last == 16 ? (__mmask16)0xFFFF : (__mmask16)0x00FF; /* of the stores */
    if (resume) {
#define SD_V4_LOAD(i, j)                                                                           \
    if (NV > j && nq > i) {                                                                        \
        a##i##j = _mm512_maskz_loadu_ps(j == NV - 1 ? lm : (__mmask16)0xFFFF, o[i] + d0 + 16 * j); \
    }
#define SD_V4_LOAD4(i) SD_V4_LOAD(i, 0) SD_V4_LOAD(i, 1) SD_V4_LOAD(i, 2) SD_V4_LOAD(i, 3)
        SD_V4_LOAD4(0)
        SD_V4_LOAD4(1)
        SD_V4_LOAD4(2)
        SD_V4_LOAD4(3)
#undef SD_V4_LOAD4
#undef SD_V4_LOAD
    }
    int h[4] = {0, 0, 0, 0}, hmax = 0;
    for (int i = 0; i < nq; i++) {
        h[i] = hi[i] < s1 ? hi[i] : s1;
        hmax = h[i] > hmax ? h[i] : hmax;
    }
    const float *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
    const void *vs = kv_at(F16, v, (size_t)d0);
    const size_t ahead = kv_size(F16, SD_ATTN_AHEAD * (size_t)Dh);
    int s = s0;
    while (s < hmax) {
        /* a run of slots with the same queries open */
        int end = hmax;
        for (int i = 0; i < 4; i++) {
            end = s < h[i] && h[i] < end ? h[i] : end;
        }
        const __mmask16 k0 = s < h[0] ? 0xFFFF : 0, k1 = s < h[1] ? 0xFFFF : 0;
        const __mmask16 k2 = s < h[2] ? 0xFFFF : 0, k3 = s < h[3] ? 0xFFFF : 0;
        for (; s < end; s++, vs = kv_at(F16, vs, (size_t)Dh)) {
#pragma GCC unroll 4
            for (size_t j = 0; j < kv_size(F16, 16 * (size_t)NV); j += 64) { /* SD_ATTN_AHEAD on */
                _mm_prefetch((const char *)vs + ahead + j, _MM_HINT_T0);
            }
            const __m512 q0 = _mm512_set1_ps(p0[s]), q1 = _mm512_set1_ps(p1[s]);
            const __m512 q2 = _mm512_set1_ps(p2[s]), q3 = _mm512_set1_ps(p3[s]);
#define SD_V4(j)                                                                                   \
    if (NV > j) {                                                                                  \
        const __m512 vj = kv_load16(F16, vs, 16 * j, j == NV - 1 && last == 8);                    \
        a0##j = _mm512_mask3_fmadd_ps(q0, vj, a0##j, k0);                                          \
        if (nq > 1) {                                                                              \
            a1##j = _mm512_mask3_fmadd_ps(q1, vj, a1##j, k1);                                      \
        }                                                                                          \
        if (nq > 2) {                                                                              \
            a2##j = _mm512_mask3_fmadd_ps(q2, vj, a2##j, k2);                                      \
        }                                                                                          \
        if (nq > 3) {                                                                              \
            a3##j = _mm512_mask3_fmadd_ps(q3, vj, a3##j, k3);                                      \
        }                                                                                          \
    }
            SD_V4(0)
            SD_V4(1)
            SD_V4(2)
            SD_V4(3)
#undef SD_V4
        }
    }
#define SD_V4_STORE(i, j)                                                                          \
    if (NV > j && nq > i) {                                                                        \
        _mm512_mask_storeu_ps(o[i] + d0 + 16 * j, j == NV - 1 ? lm : (__mmask16)0xFFFF, a##i##j);  \
    }
#define SD_V4_STORE4(i) SD_V4_STORE(i, 0) SD_V4_STORE(i, 1) SD_V4_STORE(i, 2) SD_V4_STORE(i, 3)
    SD_V4_STORE4(0)
    SD_V4_STORE4(1)
    SD_V4_STORE4(2)
    SD_V4_STORE4(3)
#undef SD_V4_STORE4
#undef SD_V4_STORE
}

/* n halves (n % 8 == 0) widened to f32, exactly, 16 at a time: when several queries read the
 * same keys or values, converting them once and reading floats costs less than converting them
 * for each. */
SD_AVX512 SD_INLINE void widen_rows512(float *dst, const void *src, int n) {
    const uint16_t *h = (const uint16_t *)src;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm512_store_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
    }
    if (i < n) {
        _mm256_store_ps(dst + i, load_f16x8(h + i));
    }
}

/* values4 over all the queries of g, four at a time, and every 64 dimensions: slots s0 to s1,
 * v at slot s0's row. */
SD_AVX512 SD_INLINE void values_all(const int F16, const sd_attn_group *g, const float *sc,
                                    const int *hi, const void *v, int s0, int s1, int resume,
                                    int n_attn, int Dh) {
    for (int i0 = 0; i0 < g->n; i0 += 4) {
        const int nq = g->n - i0 < 4 ? g->n - i0 : 4;
        const float *p[4];
        for (int i = 0; i < 4; i++) {
            p[i] = sc + (size_t)(i0 + (i < nq ? i : 0)) * (size_t)n_attn;
        }
        for (int d0 = 0; d0 < Dh; d0 += 64) {
            const int rest = Dh - d0 < 64 ? Dh - d0 : 64, nv = (rest + 15) / 16;
            const int last = rest - 16 * (nv - 1);
#define SD_VQ(NQ)                                                                                  \
    case NQ:                                                                                       \
        switch (nv) {                                                                              \
        case 1: values4(F16, 1, NQ, g->o + i0, p, hi + i0, v, s0, s1, resume, Dh, d0, last);       \
            break;                                                                                 \
        case 2: values4(F16, 2, NQ, g->o + i0, p, hi + i0, v, s0, s1, resume, Dh, d0, last);       \
            break;                                                                                 \
        case 3: values4(F16, 3, NQ, g->o + i0, p, hi + i0, v, s0, s1, resume, Dh, d0, last);       \
            break;                                                                                 \
        default: values4(F16, 4, NQ, g->o + i0, p, hi + i0, v, s0, s1, resume, Dh, d0, last);      \
            break;                                                                                 \
        }                                                                                          \
        break;
            switch (nq) {
                SD_VQ(1)
                SD_VQ(2)
                SD_VQ(3)
                SD_VQ(4)
            }
#undef SD_VQ
        }
    }
}

SD_AVX512 SD_INLINE void attend_avx512(const int F16, const sd_attn_group *g, const void *k,
                                       const void *v, int n_attn, int Dh, float scale, float *sc) {
    int hi[SD_ATTN_GROUP];
    const int hi_max = attend_ends(g, n_attn, hi);
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int s = 0; s < hi_max; s += SD_KV_TILE) {
        const void *kt = kv_at(F16, k, (size_t)s * (size_t)Dh);
        /* the next tile into L1 */
        for (size_t o = 0; o < kv_size(F16, SD_KV_TILE * (size_t)Dh); o += 64) {
            _mm_prefetch(kv_at(F16, kt, SD_KV_TILE * (size_t)Dh) + o, _MM_HINT_T0);
        }
        int act[SD_ATTN_GROUP];
        const int na = attend_active(g, hi, s, act);
        for (int j = 0; j < na; j += 3) {
            const int nq = na - j < 3 ? na - j : 3;
            const float *q[3] = {g->q[act[j]], g->q[act[j + (nq > 1)]], g->q[act[j + nq - 1]]};
            __m512 r[3];
            switch (nq) {
            case 3: tile_dots16(F16, 3, q, kt, Dh, r); break;
            case 2: tile_dots16(F16, 2, q, kt, Dh, r); break;
            default: tile_dots16(F16, 1, q, kt, Dh, r); break;
            }
            for (int e = 0; e < nq; e++) {
                const int i = act[j + e], n = hi[i] - s < 16 ? hi[i] - s : 16;
                store_scores16(sc + (size_t)i * (size_t)n_attn + (size_t)s, g->m[i] + s, r[e],
                               vscale, n);
            }
        }
    }
    for (int i = 0; i < g->n; i++) {
        softmax_row512(sc + (size_t)i * (size_t)n_attn, hi[i], g->st[i]);
    }
    if (F16 && g->n > 4) {
        /* several passes over the values: widen a run of rows to floats once for all of them */
        _Alignas(64) float vb[SD_ATTN_WIDE];
        const int run = SD_ATTN_WIDE / Dh;
        for (int s0 = 0; s0 < hi_max; s0 += run) {
            const int s1 = hi_max - s0 < run ? hi_max : s0 + run;
            widen_rows512(vb, kv_at(F16, v, (size_t)s0 * (size_t)Dh), (s1 - s0) * Dh);
            values_all(0, g, sc, hi, vb, s0, s1, s0 > 0, n_attn, Dh);
        }
    } else {
        values_all(F16, g, sc, hi, v, 0, hi_max, 0, n_attn, Dh);
    }
}

/* Dh stays a value known at run time: were it a constant (a clone for 64, say), GCC would
 * unroll the dimension loops whole and hoist the queries' broadcasts out of the loop over
 * tiles, more of them than there are registers, and spill them (scores at half the speed). */
SD_AVX512 void sd_attend_avx512(const sd_attn_group *g, const void *k, const void *v, int kv_f16,
                                int n_attn, int Dh, float scale, float *sc) {
    if (kv_f16) {
        attend_avx512(1, g, k, v, n_attn, Dh, scale, sc);
    } else {
        attend_avx512(0, g, k, v, n_attn, Dh, scale, sc);
    }
}

/* ---- batched rows x tokens tile (the verify batch) ------------------------------------------
 * y[t * ldy] (= or +=) dot(w, x_t) + bias for one weight row and TT tokens at once: each
 * weight vector is loaded and widened once for TT tokens and the accumulators stay in
 * registers. TT and the type (a ggml id) become compile-time constants when tile_kernel is
 * inlined into tile_impl's calls. */

SD_AVX2 static inline __m256 load_w8(int type, const void *w, int64_t i) {
    if (type == 1) { /* F16 */
        return load_f16x8((const uint16_t *)w + i);
    }
    if (type == 30) { /* BF16 */
        return load_bf16x8((const uint16_t *)w + i);
    }
    return _mm256_loadu_ps((const float *)w + i);
}

SD_AVX2 static inline float load_w1(int type, const void *w, int64_t i) {
    if (type == 1) {
        return _cvtsh_ss(((const uint16_t *)w)[i]);
    }
    if (type == 30) {
        uint32_t bits = (uint32_t)((const uint16_t *)w)[i] << 16;
        float f;
        memcpy(&f, &bits, sizeof(f));
        return f;
    }
    return ((const float *)w)[i];
}

SD_AVX2 static inline __attribute__((always_inline)) void
tile_kernel(const int TT, int type, float *y, int64_t ldy, const unsigned char *w, const float *x,
            int64_t ldx, int64_t n, float bias, int accumulate) {
    /* Two accumulator sets (even and odd 8-element steps) hide the FMA latency when few
     * tokens share a row. Every token count uses both: a token's sums must not depend on how
     * many tokens share the tile (a verify batch has to reproduce one-token decoding). */
    __m256 acc[2][4];
    for (int k = 0; k < 2; k++) {
        for (int t = 0; t < TT; t++) {
            acc[k][t] = _mm256_setzero_ps();
        }
    }
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        for (int k = 0; k < 2; k++) {
            __m256 wv = load_w8(type, w, i + 8 * k);
            for (int t = 0; t < TT; t++) {
                __m256 xv = _mm256_loadu_ps(x + (size_t)t * (size_t)ldx + i + 8 * k);
                acc[k][t] = _mm256_fmadd_ps(wv, xv, acc[k][t]);
            }
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m256 wv = load_w8(type, w, i);
        for (int t = 0; t < TT; t++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)t * (size_t)ldx + i);
            acc[0][t] = _mm256_fmadd_ps(wv, xv, acc[0][t]);
        }
    }
    for (int t = 0; t < TT; t++) {
        float v = hsum256(_mm256_add_ps(acc[0][t], acc[1][t]));
        for (int64_t k = i; k < n; k++) {
            v += load_w1(type, w, k) * x[(size_t)t * (size_t)ldx + k];
        }
        v += bias;
        float *dst = &y[(size_t)t * (size_t)ldy];
        *dst = accumulate ? *dst + v : v;
    }
}

/* Rows one after the other, so the weights stream through memory in file order (several rows
 * in flight defeat the hardware prefetcher); each row serves the tokens 4 at a time. Long
 * batches (prefill) go in blocks of 16 tokens whose activations stay in L1, the rows of this
 * call coming again from L2 for each block. */
SD_AVX2 static inline __attribute__((always_inline)) void
tile_impl(const int type, float *y, int64_t ldy, const void *w, size_t row_bytes, int64_t nrows,
          const float *x, int64_t ldx, int T, int64_t n, const float *bias, int accumulate) {
    for (int t0 = 0; t0 < T; t0 += 16) {
        const int t1 = T - t0 < 16 ? T : t0 + 16;
        for (int64_t r = 0; r < nrows; r++) {
            const unsigned char *wr = (const unsigned char *)w + (size_t)r * row_bytes;
            const float b = bias != NULL ? bias[r] : 0.0f;
            int t = t0;
            for (; t + 4 <= t1; t += 4) {
                tile_kernel(4, type, y + (size_t)t * (size_t)ldy + r, ldy, wr,
                            x + (size_t)t * (size_t)ldx, ldx, n, b, accumulate);
            }
            float *yt = y + (size_t)t * (size_t)ldy + r;
            const float *xt = x + (size_t)t * (size_t)ldx;
            switch (t1 - t) {
            case 3: tile_kernel(3, type, yt, ldy, wr, xt, ldx, n, b, accumulate); break;
            case 2: tile_kernel(2, type, yt, ldy, wr, xt, ldx, n, b, accumulate); break;
            case 1: tile_kernel(1, type, yt, ldy, wr, xt, ldx, n, b, accumulate); break;
            default: break;
            }
        }
    }
}

/* The weight type becomes a constant too, so the inner loops carry no type test. */
SD_AVX2 void sd_matmul_tile_avx2(int type, float *y, int64_t ldy, const void *w, size_t row_bytes,
                                 int64_t nrows, const float *x, int64_t ldx, int T, int64_t n,
                                 const float *bias, int accumulate) {
    switch (type) {
    case 1: tile_impl(1, y, ldy, w, row_bytes, nrows, x, ldx, T, n, bias, accumulate); break;
    case 30: tile_impl(30, y, ldy, w, row_bytes, nrows, x, ldx, T, n, bias, accumulate); break;
    default: tile_impl(0, y, ldy, w, row_bytes, nrows, x, ldx, T, n, bias, accumulate); break;
    }
}

#endif /* SD_HAVE_X86_SIMD */
