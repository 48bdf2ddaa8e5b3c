/* simd_avx2_q.c — AVX2 matmul tiles of the quantized formats (twins of quant_blocks.c).
 *
 * A weight sub-block of 32 elements is unpacked once into 32 int8 lanes and then multiplied
 * with the int8 activations of up to four tokens: maddubs (u8 x s8 -> pairs of i16) and madd
 * (-> 8 i32, lanes 0-3 covering elements 0-15, lanes 4-7 elements 16-31), converted to float and
 * scaled by d_w * d_x in one FMA. Signed formats use |w| and sign(x, w) because maddubs needs
 * an unsigned first operand. The per-block offsets (Q4_1, Q5_1, K-quants) add m * s_x. Format
 * and token count are compile-time constants inside each instantiation. */
#include "cpu/x86/simd.h"

#ifdef SD_HAVE_X86_SIMD

#include <immintrin.h>
#include <string.h>

#include "cpu/quant_blocks.h"
#include "cpu/x86/simd_q_common.h"

#define SD_AVX2 __attribute__((target("avx2,fma,f16c")))

enum { F_Q4_0, F_Q4_1, F_Q5_0, F_Q5_1, F_Q8_0, F_Q4_K, F_Q5_K, F_Q6_K };

SD_AVX2 SD_INLINE float hsum8(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

typedef struct {
    __m256i q; /* 32 quants: unsigned for formats with offsets, signed otherwise */
    __m256 dv; /* per i32 lane: d_lo (lanes 0-3), d_hi (lanes 4-7) */
    float m;   /* per-block offset */
} dec_t;

/* Per super-block state of the K formats: the scales of its sub-blocks. */
typedef struct {
    float d[8], m[8];
} kscales_t;

SD_AVX2 SD_INLINE void k4_scales(kscales_t *ks, const uint8_t *blk) {
    const float d = sd_q_f16_at(blk), dmin = sd_q_f16_at(blk + 2);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        sd_k4_scale_min(j, blk + 4, &sc, &m);
        ks->d[j] = d * (float)sc;
        ks->m[j] = -dmin * (float)m;
    }
}

SD_AVX2 SD_INLINE dec_t decode(const int f, const uint8_t *blk, int sub, const kscales_t *ks) {
    dec_t o;
    o.m = 0.0f;
    switch (f) {
    case F_Q4_0:
        o.q = _mm256_sub_epi8(sd_q_nibbles(blk + 2), _mm256_set1_epi8(8));
        o.dv = _mm256_set1_ps(sd_q_f16_at(blk));
        break;
    case F_Q4_1:
        o.q = sd_q_nibbles(blk + 4);
        o.dv = _mm256_set1_ps(sd_q_f16_at(blk));
        o.m = sd_q_f16_at(blk + 2);
        break;
    case F_Q5_0:
        o.q = _mm256_or_si256(sd_q_nibbles(blk + 6), sd_q_fifth_bits(blk + 2));
        o.q = _mm256_sub_epi8(o.q, _mm256_set1_epi8(16));
        o.dv = _mm256_set1_ps(sd_q_f16_at(blk));
        break;
    case F_Q5_1:
        o.q = _mm256_or_si256(sd_q_nibbles(blk + 8), sd_q_fifth_bits(blk + 4));
        o.dv = _mm256_set1_ps(sd_q_f16_at(blk));
        o.m = sd_q_f16_at(blk + 2);
        break;
    case F_Q8_0:
        o.q = _mm256_loadu_si256((const __m256i *)(blk + 2));
        o.dv = _mm256_set1_ps(sd_q_f16_at(blk));
        break;
    case F_Q4_K: {
        __m256i b = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * (sub / 2)));
        b = (sub % 2) ? _mm256_srli_epi16(b, 4) : b;
        o.q = _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
        o.dv = _mm256_set1_ps(ks->d[sub]);
        o.m = ks->m[sub];
        break;
    }
    case F_Q5_K: {
        __m256i b = _mm256_loadu_si256((const __m256i *)(blk + 48 + 32 * (sub / 2)));
        b = (sub % 2) ? _mm256_srli_epi16(b, 4) : b;
        __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 16));
        h = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(sub)), _mm256_set1_epi8(1));
        o.q = _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi8(0x0F)), _mm256_slli_epi16(h, 4));
        o.dv = _mm256_set1_ps(ks->d[sub]);
        o.m = ks->m[sub];
        break;
    }
    default: { /* F_Q6_K */
        const int h = sub / 4, k = sub % 4;
        __m256i l = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (k % 2)));
        l = _mm256_and_si256(_mm256_srl_epi16(l, _mm_cvtsi32_si128(4 * (k / 2))),
                             _mm256_set1_epi8(0x0F));
        __m256i hb = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
        hb = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3));
        o.q = _mm256_sub_epi8(_mm256_or_si256(l, _mm256_slli_epi16(hb, 4)), _mm256_set1_epi8(32));
        const int8_t *sc = (const int8_t *)(blk + 192) + 8 * h + 2 * k;
        const float d = sd_q_f16_at(blk + 208);
        o.dv = _mm256_set_m128(_mm_set1_ps(d * (float)sc[1]), _mm_set1_ps(d * (float)sc[0]));
        break;
    }
    }
    return o;
}

SD_AVX2 SD_INLINE int is_signed(const int f) {
    return f == F_Q4_0 || f == F_Q5_0 || f == F_Q8_0 || f == F_Q6_K;
}

SD_AVX2 SD_INLINE int has_offset(const int f) {
    return f == F_Q4_1 || f == F_Q5_1 || f == F_Q4_K || f == F_Q5_K;
}

/* One weight row against TT tokens (t0 .. t0 + TT - 1): y[t * ldy] (= or +=) dot + bias. */
SD_AVX2 SD_INLINE void qrow(const int f, const int TT, const int block_size, const int type_size,
                            float *y, int64_t ldy, const uint8_t *w, const sd_acts *a, int t0,
                            int64_t n, float bias, int accumulate) {
    const int subs = block_size / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    float accm[4];
    sd_q8_row x[4];
    for (int t = 0; t < TT; t++) {
        acc[t] = _mm256_setzero_ps();
        accm[t] = 0.0f;
        x[t] = sd_q8_row_at(a->xq, n, t0 + t);
    }
    kscales_t ks;
    for (int64_t b = 0; b < n / block_size; b++, w += type_size) {
        if (f == F_Q4_K || f == F_Q5_K) {
            k4_scales(&ks, w);
        }
        for (int sub = 0; sub < subs; sub++) {
            const dec_t d = decode(f, w, sub, &ks);
            const __m256i u = is_signed(f) ? _mm256_sign_epi8(d.q, d.q) : d.q;
            const int64_t xb = b * subs + sub;
            for (int t = 0; t < TT; t++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x[t].q + 32 * xb));
                if (is_signed(f)) {
                    xv = _mm256_sign_epi8(xv, d.q);
                }
                const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), ones);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                         _mm256_mul_ps(d.dv, _mm256_set1_ps(x[t].d[xb])), acc[t]);
                if (has_offset(f)) {
                    accm[t] += d.m * x[t].s[xb];
                }
            }
        }
    }
    for (int t = 0; t < TT; t++) {
        float v = hsum8(acc[t]) + accm[t] + bias;
        float *dst = &y[(size_t)t * (size_t)ldy];
        *dst = accumulate ? *dst + v : v;
    }
}

/* All rows of a tile, tokens four at a time (the row is unpacked again per group of four, from
 * L1: cheaper than keeping more accumulators live). */
SD_AVX2 SD_INLINE void qtile(const int f, const int block_size, const int type_size, float *y,
                             int64_t ldy, const void *w, size_t row_bytes, int64_t nrows,
                             const sd_acts *a, int T, int64_t n, const float *bias,
                             int accumulate) {
    for (int64_t r = 0; r < nrows; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * row_bytes;
        const float bv = bias != NULL ? bias[r] : 0.0f;
        int t = 0;
        for (; t + 4 <= T; t += 4) {
            qrow(f, 4, block_size, type_size, y + (size_t)t * (size_t)ldy + r, ldy, wr, a, t, n, bv,
                 accumulate);
        }
        float *yt = y + (size_t)t * (size_t)ldy + r;
        switch (T - t) {
        case 3: qrow(f, 3, block_size, type_size, yt, ldy, wr, a, t, n, bv, accumulate); break;
        case 2: qrow(f, 2, block_size, type_size, yt, ldy, wr, a, t, n, bv, accumulate); break;
        case 1: qrow(f, 1, block_size, type_size, yt, ldy, wr, a, t, n, bv, accumulate); break;
        default: break;
        }
    }
}

#define SD_AVX2_QTILE(sfx, f, block_size, type_size)                                               \
    SD_AVX2 void sd_tile_##sfx##_avx2(float *y, int64_t ldy, const void *w, size_t row_bytes,      \
                                      int64_t nrows, const sd_acts *a, int T, int64_t n,           \
                                      const float *bias, int accumulate) {                         \
        qtile(f, block_size, type_size, y, ldy, w, row_bytes, nrows, a, T, n, bias, accumulate);   \
    }

SD_AVX2_QTILE(q4_0, F_Q4_0, 32, 18)
SD_AVX2_QTILE(q4_1, F_Q4_1, 32, 20)
SD_AVX2_QTILE(q5_0, F_Q5_0, 32, 22)
SD_AVX2_QTILE(q5_1, F_Q5_1, 32, 24)
SD_AVX2_QTILE(q8_0, F_Q8_0, 32, 34)
SD_AVX2_QTILE(q4_K, F_Q4_K, 256, 144)
SD_AVX2_QTILE(q5_K, F_Q5_K, 256, 176)
SD_AVX2_QTILE(q6_K, F_Q6_K, 256, 210)

/* ---- activation quantization ------------------------------------------------------------------
 * The twin of sd_quantize_q8_ref, byte for byte: the same IEEE divisions and products, rounding
 * to nearest even (cvtps_epi32 under the default MXCSR, as nearbyintf), f16 rounding by F16C.
 * Eight blocks at a time: their largest magnitudes and their sums gathered into one vector each
 * (max and integer sums are exact in any order), so the two divisions, the f16 roundings and
 * the stores serve eight blocks, and the blocks' chains of dependent steps overlap. */

/* Lane b of the result: the largest lane of m[b]. */
SD_AVX2 SD_INLINE __m256 lanes_max8(const __m256 *m) {
    __m256 p[4], r[2];
    for (int i = 0; i < 4; i++) { /* lanes: m[2i], m[2i+1] alternating, halves of each lane */
        p[i] = _mm256_max_ps(_mm256_unpacklo_ps(m[2 * i], m[2 * i + 1]),
                             _mm256_unpackhi_ps(m[2 * i], m[2 * i + 1]));
    }
    for (int i = 0; i < 2; i++) { /* m[4i .. 4i+3] in each 128-bit half */
        const __m256d a = _mm256_castps_pd(p[2 * i]), b = _mm256_castps_pd(p[2 * i + 1]);
        r[i] = _mm256_max_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)),
                             _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }
    return _mm256_max_ps(_mm256_permute2f128_ps(r[0], r[1], 0x20),
                         _mm256_permute2f128_ps(r[0], r[1], 0x31));
}

/* Lane b of the result: the sum of the lanes of m[b]. */
SD_AVX2 SD_INLINE __m256i lanes_sum8(const __m256i *m) {
    __m256i p[4], r[2];
    for (int i = 0; i < 4; i++) {
        p[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(m[2 * i], m[2 * i + 1]),
                                _mm256_unpackhi_epi32(m[2 * i], m[2 * i + 1]));
    }
    for (int i = 0; i < 2; i++) {
        r[i] = _mm256_add_epi32(_mm256_unpacklo_epi64(p[2 * i], p[2 * i + 1]),
                                _mm256_unpackhi_epi64(p[2 * i], p[2 * i + 1]));
    }
    return _mm256_add_epi32(_mm256_permute2x128_si256(r[0], r[1], 0x20),
                            _mm256_permute2x128_si256(r[0], r[1], 0x31));
}

/* 32 quants of block xb scaled by iv (broadcast), in element order; *sum: their 8 partial sums. */
SD_AVX2 SD_INLINE void quantize_block(int8_t *q, __m256i *sum, const float *xb, __m256 iv) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb), iv));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 8), iv));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 16), iv));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 24), iv));
    *sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    /* packs work within 128-bit lanes: 32-bit groups come out as 0 2 4 6 1 3 5 7 (in units of
     * four elements); the permutation restores element order */
    const __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(p8, order));
}

SD_AVX2 SD_INLINE __m256 abs_max32(const float *xb) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    return _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb), absmask),
                                       _mm256_and_ps(_mm256_loadu_ps(xb + 8), absmask)),
                         _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + 16), absmask),
                                       _mm256_and_ps(_mm256_loadu_ps(xb + 24), absmask)));
}

SD_AVX2 void sd_quantize_q8_avx2(int8_t *q, float *d, float *s, float *e, const float *x,
                                 int64_t nb) {
    int64_t b0 = 0;
    for (; b0 + 8 <= nb; b0 += 8) {
        const float *xb = x + 32 * b0;
        __m256 mx[8];
        __m256i sums[8];
        for (int b = 0; b < 8; b++) {
            mx[b] = abs_max32(xb + 32 * b);
        }
        const __m256 db = _mm256_div_ps(lanes_max8(mx), _mm256_set1_ps(127.0f));
        /* db != 0 as C has it (true for a NaN, as the one-block path below) */
        const __m256 id = _mm256_and_ps(_mm256_cmp_ps(db, _mm256_setzero_ps(), _CMP_NEQ_UQ),
                                        _mm256_div_ps(_mm256_set1_ps(1.0f), db));
        for (int b = 0; b < 8; b++) {
            quantize_block(q + 32 * (b0 + b), &sums[b], xb + 32 * b,
                           _mm256_permutevar8x32_ps(id, _mm256_set1_epi32(b)));
        }
        const __m256 sf = _mm256_cvtepi32_ps(lanes_sum8(sums));
        const __m256 dh = _mm256_cvtph_ps(_mm256_cvtps_ph(db, 0));
        _mm256_storeu_ps(d + b0, dh);
        _mm256_storeu_ps(s + b0, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(db, sf), 0)));
        _mm256_storeu_ps(e + b0, _mm256_mul_ps(dh, sf));
    }
    for (int64_t b = b0; b < nb; b++) { /* the last nb % 8 blocks, one at a time */
        const __m256 mx = abs_max32(x + 32 * b);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float db = _mm_cvtss_f32(m4) / 127.0f;
        const float id = db != 0.0f ? 1.0f / db : 0.0f;
        __m256i sum;
        quantize_block(q + 32 * b, &sum, x + 32 * b, _mm256_set1_ps(id));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        const int isum = _mm_cvtsi128_si32(s4);
        d[b] = _cvtsh_ss(_cvtss_sh(db, 0));
        s[b] = _cvtsh_ss(_cvtss_sh(db * (float)isum, 0));
        e[b] = d[b] * (float)isum;
    }
}

#endif /* SD_HAVE_X86_SIMD */
