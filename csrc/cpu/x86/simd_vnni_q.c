/* simd_vnni_q.c — 8-row interleaved kernels of the 32-element quantized formats: the
 * AVX512-VNNI tiles over rows as stored (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), the repacking of
 * Q4_0/Q4_1/Q8_0 matrices into that layout once at load, and the tiles over the repacked copy
 * (VNNI, and AVX2 for CPUs without it).
 *
 * Eight weight rows are laid out block by block, four bytes of each row side by side, so that
 * lane k of a 256-bit vector belongs to row k. Per token and block, eight multiply-adds against
 * the token's bytes (4 at a time, broadcast) leave each row's block dot product in its own lane
 * — no horizontal sums — and the float work (convert, scale by d_w * d_x, add offset times the
 * activation sum) is one instruction each for eight rows. Up to four tokens share each load of
 * the weights; a batch of T tokens reads them from memory once. Signed formats are shifted to
 * unsigned bytes for vpdpbusd: sum((w + c) x) = sum(w x) + c sum(x). Over the repacked copy,
 * two 8-row groups side by side in 512-bit registers make a 16-row tile with the same lane
 * arithmetic (packed16_dot). */
#include "cpu/x86/simd.h"

#ifdef SD_HAVE_X86_SIMD

#include <cpuid.h>
#include <immintrin.h>
#include <string.h>

#include "cpu/quant_blocks.h"
#include "cpu/x86/simd_packed.h"
#include "cpu/x86/simd_q_common.h"

#define SD_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))

/* Longest row the on-stack unpacking buffer holds; longer rows use the AVX2 kernels. */
#define SD_VNNI_MAX_ROW 8192

int sd_cpu_has_avx512vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
}

/* One 32-element block of a row, as unsigned bytes, its scale, and the offset that multiplies
 * the activation sum (s for Q4_1/Q5_1, llama.cpp's f16 sums; e for the signed formats shifted
 * by c: -c * d). */
SD_Q_AVX2 SD_INLINE __m256i unpack_block(const int f, const uint8_t *w, float *d, float *m) {
    *d = sd_q_f16_at(w);
    switch (f) {
    case V_Q4_0: *m = -8.0f * *d; return sd_q_nibbles(w + 2);
    case V_Q4_1: *m = sd_q_f16_at(w + 2); return sd_q_nibbles(w + 4);
    case V_Q5_0:
        *m = -16.0f * *d;
        return _mm256_or_si256(sd_q_nibbles(w + 6), sd_q_fifth_bits(w + 2));
    case V_Q5_1:
        *m = sd_q_f16_at(w + 2);
        return _mm256_or_si256(sd_q_nibbles(w + 8), sd_q_fifth_bits(w + 4));
    default: /* Q8_0: int8 + 128 as unsigned */
        *m = -128.0f * *d;
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + 2)),
                                _mm256_set1_epi8((char)0x80));
    }
}

/* Unpack eight rows (missing ones as zeros) into the interleaved layout: for block b and
 * group g of 4 elements, the 32 bytes at ub + (b * 8 + g) * 32 hold elements 4g..4g+3 of rows
 * 0..7, so one vpdpbusd against the token's 4 bytes broadcast gives each row's partial sum in
 * its own lane. An 8 x 8 transpose of 32-bit lanes turns row vectors into group vectors. */
SD_Q_AVX2 SD_INLINE void unpack_rows8(const int f, const int size, uint8_t *ub, float *dw,
                                      float *mw, const uint8_t *w, size_t row_bytes, int nr,
                                      int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        __m256i r[8];
        for (int k = 0; k < 8; k++) {
            if (k < nr) {
                r[k] = unpack_block(f, w + (size_t)k * row_bytes + (size_t)b * (size_t)size,
                                    &dw[b * 8 + k], &mw[b * 8 + k]);
            } else {
                r[k] = _mm256_setzero_si256();
                dw[b * 8 + k] = mw[b * 8 + k] = 0.0f;
            }
        }
        __m256i t[8], u[8];
        for (int k = 0; k < 8; k += 2) {
            t[k] = _mm256_unpacklo_epi32(r[k], r[k + 1]);
            t[k + 1] = _mm256_unpackhi_epi32(r[k], r[k + 1]);
        }
        for (int k = 0; k < 8; k += 4) {
            u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
            u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
            u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
            u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
        }
        __m256i *g = (__m256i *)(ub + (size_t)b * 8 * 32);
        for (int k = 0; k < 4; k++) {
            _mm256_store_si256(g + k, _mm256_permute2x128_si256(u[k], u[k + 4], 0x20));
            _mm256_store_si256(g + k + 4, _mm256_permute2x128_si256(u[k], u[k + 4], 0x31));
        }
    }
}

/* The 4 activation bytes of group g of block b, broadcast to every lane. */
#define XB(x, b, g) _mm256_set1_epi32(*(const int32_t *)((x).q + 32 * (b) + 4 * (g)))

/* Eight rows against TT tokens: out[t] lane k = dot(row k, token t). */
SD_VNNI SD_INLINE void rows8_dot(const int f, const int TT, __m256 *out, const uint8_t *ub,
                                 const float *dw, const float *mw, int64_t nb, const sd_q8_row *x) {
    __m256 acc[4], accm[4];
    for (int t = 0; t < TT; t++) {
        acc[t] = accm[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const __m256i *g = (const __m256i *)(ub + (size_t)b * 8 * 32);
        const __m256 dwb = _mm256_loadu_ps(dw + 8 * b), mwb = _mm256_loadu_ps(mw + 8 * b);
        for (int t = 0; t < TT; t++) {
            /* two independent chains of four vpdpbusd each */
            __m256i s0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), g[0], XB(x[t], b, 0));
            __m256i s1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), g[1], XB(x[t], b, 1));
            s0 = _mm256_dpbusd_epi32(s0, g[2], XB(x[t], b, 2));
            s1 = _mm256_dpbusd_epi32(s1, g[3], XB(x[t], b, 3));
            s0 = _mm256_dpbusd_epi32(s0, g[4], XB(x[t], b, 4));
            s1 = _mm256_dpbusd_epi32(s1, g[5], XB(x[t], b, 5));
            s0 = _mm256_dpbusd_epi32(s0, g[6], XB(x[t], b, 6));
            s1 = _mm256_dpbusd_epi32(s1, g[7], XB(x[t], b, 7));
            const __m256 sf = _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1));
            acc[t] = _mm256_fmadd_ps(sf, _mm256_mul_ps(dwb, _mm256_set1_ps(x[t].d[b])), acc[t]);
            const float *xo = (f == V_Q4_1 || f == V_Q5_1) ? x[t].s : x[t].e;
            accm[t] = _mm256_fmadd_ps(mwb, _mm256_set1_ps(xo[b]), accm[t]);
        }
    }
    for (int t = 0; t < TT; t++) {
        out[t] = _mm256_add_ps(acc[t], accm[t]);
    }
}

SD_VNNI SD_INLINE void vtile(const int f, float *y, int64_t ldy, const void *w, size_t row_bytes,
                             int64_t nrows, const sd_acts *a, int T, int64_t n, const float *bias,
                             int accumulate) {
    const int size = f == V_Q4_0 ? 18 : f == V_Q4_1 ? 20 : f == V_Q5_0 ? 22 : f == V_Q5_1 ? 24 : 34;
    const int64_t nb = n / 32;
    uint8_t ub[8 * SD_VNNI_MAX_ROW] __attribute__((aligned(32)));
    float dw[SD_VNNI_MAX_ROW / 4], mw[SD_VNNI_MAX_ROW / 4];
    for (int64_t r0 = 0; r0 < nrows; r0 += 8) {
        const int nr = nrows - r0 < 8 ? (int)(nrows - r0) : 8;
        /* fetch the next eight rows while this group is unpacked and multiplied: the weights
         * are the one stream from memory, and the unpacking walks eight rows at once, which
         * the hardware prefetcher does not follow well */
        const uint8_t *next = (const uint8_t *)w + (size_t)(r0 + 8) * row_bytes;
        const int64_t ahead = nrows - r0 - 8 < 8 ? nrows - r0 - 8 : 8;
        for (size_t o = 0; ahead > 0 && o < (size_t)ahead * row_bytes; o += 64) {
            _mm_prefetch((const char *)next + o, _MM_HINT_T0);
        }
        unpack_rows8(f, size, ub, dw, mw, (const uint8_t *)w + (size_t)r0 * row_bytes, row_bytes,
                     nr, nb);
        const float *bv = bias != NULL ? bias + r0 : NULL;
        int t = 0;
        for (; t < T; t += 4) {
            const int tt = T - t < 4 ? T - t : 4;
            sd_q8_row x[4];
            __m256 out[4];
            for (int i = 0; i < tt; i++) {
                x[i] = sd_q8_row_at(a->xq, n, t + i);
            }
            switch (tt) {
            case 4: rows8_dot(f, 4, out, ub, dw, mw, nb, x); break;
            case 3: rows8_dot(f, 3, out, ub, dw, mw, nb, x); break;
            case 2: rows8_dot(f, 2, out, ub, dw, mw, nb, x); break;
            default: rows8_dot(f, 1, out, ub, dw, mw, nb, x); break;
            }
            for (int i = 0; i < tt; i++) {
                store8(y + (size_t)(t + i) * (size_t)ldy + (size_t)r0, out[i], nr, bv, accumulate);
            }
        }
    }
}

/* Every batch size takes the same kernel (the AVX2 tiles sum in another order): a token's
 * result must not depend on how many tokens share the call. */
#define SD_VNNI_TILE(sfx, f)                                                                       \
    SD_VNNI void sd_tile_##sfx##_vnni(float *y, int64_t ldy, const void *w, size_t row_bytes,      \
                                      int64_t nrows, const sd_acts *a, int T, int64_t n,           \
                                      const float *bias, int accumulate) {                         \
        if (n > SD_VNNI_MAX_ROW) {                                                                 \
            sd_tile_##sfx##_avx2(y, ldy, w, row_bytes, nrows, a, T, n, bias, accumulate);          \
            return;                                                                                \
        }                                                                                          \
        vtile(f, y, ldy, w, row_bytes, nrows, a, T, n, bias, accumulate);                          \
    }

SD_VNNI_TILE(q4_0, V_Q4_0)
SD_VNNI_TILE(q4_1, V_Q4_1)
SD_VNNI_TILE(q5_0, V_Q5_0)
SD_VNNI_TILE(q5_1, V_Q5_1)
SD_VNNI_TILE(q8_0, V_Q8_0)

/* ---- repacked weights ---------------------------------------------------------------------------
 * A copy of a Q4_0, Q4_1 or Q8_0 matrix made once at load, in the interleaved layout the tiles
 * above build on every call, so a forward pass reads it without unpacking. Per group of 8 rows
 * and block b (block_bytes each, groups of a matrix back to back, blocks in order):
 *   Q4_0, Q4_1 (160 bytes): 4 x 32 bytes, vector h holding groups h (low nibbles) and h + 4
 *     (high nibbles), byte 4k + e = element 4h + e of row k | element 16 + 4h + e << 4;
 *     then f16 d[8], f16 m[8] (m = the Q4_1 min, or -8 d for Q4_0).
 *   Q8_0 (272 bytes): 8 x 32 bytes, vector g byte 4k + e = element 4g + e of row k, + 128;
 *     then f16 d[8].
 * Same size as the file's blocks: a token still reads each weight byte once. Q5_0, Q5_1 and the
 * K-quants are repacked by simd_kpack.c, for the AVX2 and AVX-VNNI tiles (layouts in
 * simd_packed.h), which serve them on every path. */

size_t sd_packed_bytes(int type, int64_t rows, int64_t cols) {
    const int f = packed_format(type);
    const int64_t block = f >= V_Q4_K ? 256 : 32; /* a K-quant row is whole super-blocks */
    if (f < 0 || rows % 8 != 0 || cols % block != 0 || cols > SD_VNNI_MAX_ROW) {
        return 0;
    }
    return (size_t)(rows / 8) * (size_t)(cols / 32) * (size_t)packed_bb(f);
}

SD_Q_AVX2 SD_INLINE void pack_impl(const int f, uint8_t *dst, const uint8_t *w, size_t row_bytes,
                                   int64_t rows, int64_t cols) {
    const int size = f == V_Q4_0 ? 18 : f == V_Q4_1 ? 20 : 34;
    const int bb = f == V_Q8_0 ? 272 : 160;
    const int64_t nb = cols / 32;
    uint8_t ub[8 * SD_VNNI_MAX_ROW] __attribute__((aligned(32)));
    float dw[SD_VNNI_MAX_ROW / 4], mw[SD_VNNI_MAX_ROW / 4];
    for (int64_t r0 = 0; r0 < rows; r0 += 8) {
        unpack_rows8(f, size, ub, dw, mw, w + (size_t)r0 * row_bytes, row_bytes, 8, nb);
        for (int64_t b = 0; b < nb; b++, dst += bb) {
            const __m256i *g = (const __m256i *)(ub + (size_t)b * 8 * 32);
            if (f == V_Q8_0) {
                for (int k = 0; k < 8; k++) {
                    _mm256_storeu_si256((__m256i *)(dst + 32 * k), _mm256_load_si256(g + k));
                }
                _mm_storeu_si128((__m128i *)(dst + 256),
                                 _mm256_cvtps_ph(_mm256_loadu_ps(dw + 8 * b), 0));
            } else {
                for (int h = 0; h < 4; h++) {
                    const __m256i v =
                        _mm256_or_si256(_mm256_load_si256(g + h),
                                        _mm256_slli_epi16(_mm256_load_si256(g + h + 4), 4));
                    _mm256_storeu_si256((__m256i *)(dst + 32 * h), v);
                }
                /* d and m were f16 in the file (-8 d exactly so): no rounding here */
                _mm_storeu_si128((__m128i *)(dst + 128),
                                 _mm256_cvtps_ph(_mm256_loadu_ps(dw + 8 * b), 0));
                _mm_storeu_si128((__m128i *)(dst + 144),
                                 _mm256_cvtps_ph(_mm256_loadu_ps(mw + 8 * b), 0));
            }
        }
    }
}

SD_Q_AVX2 int sd_pack_rows8(void *dst, int type, const void *w, size_t row_bytes, int64_t rows,
                            int64_t cols) {
    if (sd_packed_bytes(type, rows, cols) == 0) {
        return 0;
    }
    switch (type) {
    case 2: pack_impl(V_Q4_0, (uint8_t *)dst, (const uint8_t *)w, row_bytes, rows, cols); break;
    case 3: pack_impl(V_Q4_1, (uint8_t *)dst, (const uint8_t *)w, row_bytes, rows, cols); break;
    case 8: pack_impl(V_Q8_0, (uint8_t *)dst, (const uint8_t *)w, row_bytes, rows, cols); break;
    default: sd_kpack_rows8(dst, packed_format(type), w, row_bytes, rows, cols); break;
    }
    return 1;
}

/* Eight packed rows against TT <= 16 tokens: out[t] lane k = dot(row k, token t). The unpacked
 * block (8 registers) and one accumulator per token fit the 32 registers AVX-512 gives, so a
 * verify batch of up to sixteen tokens unpacks each weight block once. */
SD_VNNI SD_INLINE void packed8_dot(const int f, const int TT, __m256 *out, const uint8_t *P,
                                   int64_t nb, const uint8_t *X) {
    const int bb = f == V_Q8_0 ? 272 : 160;
    __m256 acc[XI_TOKENS];
    for (int t = 0; t < TT; t++) {
        acc[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++, P += bb, X += XI_BYTES) {
        __m256i g[8];
        __m256 dw, mw;
        prefetch_next_group(P, nb, bb);
        if (f == V_Q8_0) {
            for (int k = 0; k < 8; k++) {
                g[k] = _mm256_loadu_si256((const __m256i *)(P + 32 * k));
            }
            dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + 256)));
            mw = _mm256_mul_ps(dw, _mm256_set1_ps(-128.0f));
        } else {
            unpack_packed_nibbles(g, &dw, &mw, P);
        }
#pragma GCC unroll 16 /* acc[] in registers, not in memory */
        for (int t = 0; t < TT; t++) {
            __m256i s0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), g[0], XIB(X, t, 0));
            __m256i s1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), g[1], XIB(X, t, 1));
            s0 = _mm256_dpbusd_epi32(s0, g[2], XIB(X, t, 2));
            s1 = _mm256_dpbusd_epi32(s1, g[3], XIB(X, t, 3));
            s0 = _mm256_dpbusd_epi32(s0, g[4], XIB(X, t, 4));
            s1 = _mm256_dpbusd_epi32(s1, g[5], XIB(X, t, 5));
            s0 = _mm256_dpbusd_epi32(s0, g[6], XIB(X, t, 6));
            s1 = _mm256_dpbusd_epi32(s1, g[7], XIB(X, t, 7));
            const __m256 sf = _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1));
            acc[t] = _mm256_fmadd_ps(mw, XIO(X, t), acc[t]);
            acc[t] = _mm256_fmadd_ps(sf, _mm256_mul_ps(dw, XID(X, t)), acc[t]);
        }
    }
    for (int t = 0; t < TT; t++) {
        out[t] = acc[t];
    }
}

/* Sixteen packed rows, two 8-row groups (P0: rows 0-7, P1: rows 8-15, each at the same block),
 * against TT <= 16 tokens in 512-bit registers: lanes 0-7 of out[t] are rows 0-7, lanes 8-15
 * rows 8-15. Each lane does packed8_dot's arithmetic (the same exact integer sums, then the
 * same float instructions in the same order), so every row gets the bits of the 8-row kernel,
 * with half the instructions per row: one unpacking, one multiply-add and one float step serve
 * sixteen rows instead of eight. */
SD_VNNI SD_INLINE void packed16_dot(const int f, const int TT, __m512 *out, const uint8_t *P0,
                                    const uint8_t *P1, int64_t nb, const uint8_t *X) {
    const int bb = f == V_Q8_0 ? 272 : 160;
    const size_t pair = 2 * (size_t)nb * (size_t)bb; /* to the same block of the next pair */
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    __m512 acc[XI_TOKENS];
    for (int t = 0; t < TT; t++) {
        acc[t] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++, P0 += bb, P1 += bb, X += XI_BYTES) {
        __m512i g[8];
        for (int o = 0; o < bb; o += 64) {
            _mm_prefetch((const char *)P0 + pair + o, _MM_HINT_T0);
            _mm_prefetch((const char *)P1 + pair + o, _MM_HINT_T0);
        }
#define SD_PAIR(o)                                                                                 \
    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(P0 + (o)))),    \
                       _mm256_loadu_si256((const __m256i *)(P1 + (o))), 1)
#define SD_PAIR_PH(o)                                                                              \
    _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)(P1 + (o))),                 \
                                     _mm_loadu_si128((const __m128i *)(P0 + (o)))))
        __m512 dw, mw;
        if (f == V_Q8_0) {
            for (int k = 0; k < 8; k++) {
                g[k] = SD_PAIR(32 * k);
            }
            dw = SD_PAIR_PH(256);
            mw = _mm512_mul_ps(dw, _mm512_set1_ps(-128.0f));
        } else {
            for (int h = 0; h < 4; h++) {
                const __m512i v = SD_PAIR(32 * h);
                g[h] = _mm512_and_si512(v, lo4);
                /* the mask makes any lane width right */
                g[h + 4] = _mm512_and_si512(_mm512_srli_epi32(v, 4), lo4);
            }
            dw = SD_PAIR_PH(128);
            mw = SD_PAIR_PH(144);
        }
#undef SD_PAIR
#undef SD_PAIR_PH
#pragma GCC unroll 16 /* acc[] in registers, not in memory */
        for (int t = 0; t < TT; t++) {
#define XB16(g) _mm512_set1_epi32(*(const int32_t *)(X + 32 * t + 4 * (g)))
            __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), g[0], XB16(0));
            __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), g[1], XB16(1));
            s0 = _mm512_dpbusd_epi32(s0, g[2], XB16(2));
            s1 = _mm512_dpbusd_epi32(s1, g[3], XB16(3));
            s0 = _mm512_dpbusd_epi32(s0, g[4], XB16(4));
            s1 = _mm512_dpbusd_epi32(s1, g[5], XB16(5));
            s0 = _mm512_dpbusd_epi32(s0, g[6], XB16(6));
            s1 = _mm512_dpbusd_epi32(s1, g[7], XB16(7));
#undef XB16
            const __m512 sf = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            /* the token's d and offset multiplier, where XID and XIO read them */
            const float xd = *(const float *)(X + XI_D + 4 * t);
            const float xo = *(const float *)(X + XI_O + 4 * t);
            acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xo), acc[t]);
            acc[t] = _mm512_fmadd_ps(sf, _mm512_mul_ps(dw, _mm512_set1_ps(xd)), acc[t]);
        }
    }
    for (int t = 0; t < TT; t++) {
        out[t] = acc[t];
    }
}

static int g_pair_tokens = 1;

void sd_tile_vnni_set_pair_tokens(int tokens) {
    g_pair_tokens = tokens < 1 ? 1 : tokens;
}

int sd_cpu_is_amd(void) {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd");
}

int sd_cpu_family(void) {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
        return 0;
    }
    const int base = (int)((eax >> 8) & 0xF);
    return base == 0xF ? base + (int)((eax >> 20) & 0xFF) : base;
}

/* The VNNI tile's step over sixteen rows at once, for groups of at least g_pair_tokens tokens
 * (the rest of the rows, if 8, and smaller groups take packed8): an iteration of the tile's
 * loop over groups of 8 rows that consumes two of them. */
#define PACKED_WIDE16(f, tt, P, nb, bb, xi, y, ldy, t, r0, re, bv, accumulate)                     \
    if (r0 + 16 <= re && tt >= g_pair_tokens) {                                                    \
        __m512 out16[XI_TOKENS];                                                                   \
        PACKED_DISPATCH(packed16_dot, f, tt, out16, P, P + (size_t)nb * (size_t)bb, nb, xi);       \
        for (int i = 0; i < tt; i++) {                                                             \
            sd_q_store16(y + (size_t)(t + i) * (size_t)ldy + (size_t)r0, out16[i], bv,             \
                         accumulate);                                                              \
        }                                                                                          \
        r0 += 8;                                                                                   \
        continue;                                                                                  \
    }

PACKED_TILE(sd_tile_packed_vnni, SD_VNNI, packed8_dot, 16, PACKED_WIDE16, PACKED_DISPATCH)

#endif /* SD_HAVE_X86_SIMD */
