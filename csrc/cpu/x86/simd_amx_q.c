/* simd_amx_q.c — AMX-INT8 tiles over the repacked Q4_0/Q4_1/Q8_0 matrices (simd_vnni_q.c's
 * 8-row interleaved copy), for batches of tokens: verify batches and prefill on CPUs with AMX
 * (Intel Xeon since Sapphire Rapids).
 *
 * One tile multiply gives the block dot products of up to 16 tokens with 16 weight rows:
 * A = the tokens' 32 int8 activation quants of one block (a row per token, read in place from
 * the quantized activations with their row stride), B = the 16 rows' 32 unsigned weights of
 * that block, four consecutive elements of each row side by side (two 8-row groups of the
 * repacked copy, nibbles unpacked to bytes), C = 16 x 16 int32 sums. What is left per token,
 * block and 16 rows is the float work of the VNNI tile, on 16 lanes instead of 8:
 *     acc = fma(m_w, o_x, acc); acc = fma(float(C), d_w * d_x, acc)
 * in the same order with the same operands, so each output has exactly the bits the VNNI tile
 * gives for that token alone (integer sums are exact): a verify batch still reproduces
 * one-token decoding. Single tokens stay on the VNNI tile, which streams the weights without
 * unpacking them to memory. */
#include "cpu/x86/simd.h"

#ifdef SD_HAVE_X86_SIMD

/* AMX intrinsics came with GCC 11 and clang 12; older compilers build without this tile. */
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11)

#include <cpuid.h>
#include <immintrin.h>
#include <string.h>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "cpu/x86/simd_q_common.h"

#define SD_AMX                                                                                     \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,"           \
                          "amx-tile,amx-int8")))

/* Tokens per tile multiply (rows of A and C). */
#define AMX_TOKENS 16

int sd_cpu_has_amx_int8(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!sd_cpu_has_avx512vnni() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        return 0;
    }
    const int bw_dq = ((b >> 30) & 1u) && ((b >> 17) & 1u); /* AVX512BW, AVX512DQ */
    const int tile = (d >> 24) & 1u, int8 = (d >> 25) & 1u;
    if (!bw_dq || !tile || !int8) {
        return 0;
    }
#if defined(__linux__) && defined(SYS_arch_prctl)
    /* Linux hands out the 8 KB tile register state only on request (arch_prctl
     * ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA), once per process; a kernel without AMX
     * support refuses, and we stay on the VNNI tiles. */
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#else
    return 0;
#endif
}

enum { A_Q4_0, A_Q4_1, A_Q8_0 };

/* The tile configuration (ldtilecfg's 64-byte operand): tile 0 = C (tt rows of 16 int32),
 * tile 1 = A (tt rows of 32 int8), tile 2 = B (8 rows of 64 bytes); tiles 3-5 likewise. */
typedef struct {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

SD_AMX static void amx_configure(int tt) {
    amx_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    cfg.rows[0] = (uint8_t)tt;
    cfg.colsb[0] = 64;
    cfg.rows[1] = (uint8_t)tt;
    cfg.colsb[1] = 32;
    cfg.rows[2] = 8;
    cfg.colsb[2] = 64;
    for (int i = 3; i < 6; i++) { /* a second set of the same shapes */
        cfg.rows[i] = cfg.rows[i - 3];
        cfg.colsb[i] = cfg.colsb[i - 3];
    }
    _tile_loadconfig(&cfg);
}

/* Block b of two 8-row groups of the repacked copy (p0: rows 0-7, p1: rows 8-15, at that
 * block) -> the B tile at B: row g = elements 4g..4g+3 of rows 0..15, as bytes. */
SD_AMX SD_INLINE void unpack16(const int f, uint8_t *B, const uint8_t *p0, const uint8_t *p1) {
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    for (int h = 0; h < (f == A_Q8_0 ? 8 : 4); h++) {
        const __m512i v = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p0 + 32 * h))),
            _mm256_loadu_si256((const __m256i *)(p1 + 32 * h)), 1);
        if (f == A_Q8_0) {
            _mm512_store_si512((__m512i *)(B + 64 * h), v);
        } else {
            _mm512_store_si512((__m512i *)(B + 64 * h), _mm512_and_si512(v, lo4));
            _mm512_store_si512((__m512i *)(B + 64 * (h + 4)),
                               _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4));
        }
    }
}

/* The same block's 16 row scales d_w (*dw) and offsets m_w (*mw) as floats. */
SD_AMX SD_INLINE void scales16(const int f, __m512 *dw, __m512 *mw, const uint8_t *p0,
                               const uint8_t *p1) {
    const int od = f == A_Q8_0 ? 256 : 128;
    *dw = _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)(p1 + od)),
                                           _mm_loadu_si128((const __m128i *)(p0 + od))));
    if (f == A_Q8_0) {
        *mw = _mm512_mul_ps(*dw, _mm512_set1_ps(-128.0f));
    } else {
        *mw = _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)(p1 + 144)),
                                               _mm_loadu_si128((const __m128i *)(p0 + 144))));
    }
}

/* The float work of one block for TT tokens: c (TT x 16 int32) the block's integer sums, dwb and
 * mwb the rows' scales and offsets, x the tokens' gathered scalars of the block (quant.h: d at
 * x[SD_Q8_XT_D(t)], the offsets' multiplier oo floats on: s for Q4_1, e for the formats shifted
 * to unsigned). */
SD_AMX SD_INLINE void block16(const int f, const int TT, __m512 *acc, const int32_t *c, __m512 dwb,
                              __m512 mwb, const float *x) {
    const int oo = f == A_Q4_1 ? 4 : 8;
    for (int t = 0; t < TT; t++) {
        const float *xd = x + SD_Q8_XT_D(t);
        const __m512 sf = _mm512_cvtepi32_ps(_mm512_load_si512((const __m512i *)(c + 16 * t)));
        acc[t] = _mm512_fmadd_ps(mwb, _mm512_set1_ps(xd[oo]), acc[t]);
        acc[t] = _mm512_fmadd_ps(sf, _mm512_mul_ps(dwb, _mm512_set1_ps(xd[0])), acc[t]);
    }
}

/* A block's integer sums into tile tc: tile ta = the tokens' quants of the block (rows rb
 * bytes apart), tile tb = the unpacked weights. Tile numbers are literals (they name
 * registers). */
#define AMX_MUL(tc, ta, tb, xa, rb, B)                                                             \
    do {                                                                                           \
        _tile_loadd(ta, (xa), (rb));                                                               \
        _tile_loadd(tb, (B), 64);                                                                  \
        _tile_zero(tc);                                                                            \
        _tile_dpbsud(tc, ta, tb);                                                                  \
    } while (0)

/* A position in a stream of blocks: block b (of nb per row) of a pair of 8-row groups of the
 * repacked copy, p = that block in the pair's first group (the second is `group` bytes on). */
typedef struct {
    const uint8_t *p;
    int64_t b;
} amx_cursor;

SD_INLINE void cursor_next(amx_cursor *c, int bb, int64_t nb, size_t group) {
    c->p += bb;
    if (++c->b == nb) { /* past the first group's last block: on to the next pair */
        c->b = 0;
        c->p += group;
    }
}

/* Blocks unpacked ahead of the multiply that reads them (a tile load cannot take bytes from
 * stores still in flight, so they get a few blocks' time to land), and the ring they wait in. */
#define AMX_AHEAD 4
#define AMX_RING 8

/* The block at p in both 8-row groups of a pair (group bytes apart) into L2. */
SD_INLINE void prefetch_block(const uint8_t *p, int bb, size_t group) {
    for (int o = 0; o < bb; o += 64) {
        _mm_prefetch((const char *)p + o, _MM_HINT_T1);
        _mm_prefetch((const char *)p + group + o, _MM_HINT_T1);
    }
}

/* ng pairs of 8-row groups from P (rows 16 g .. 16 g + 15 -> y + 16 g) against TT tokens, as one
 * stream of ng * nb blocks, pipelined across the pairs: while block i + 1 is multiplied in one
 * tile set and block i's sums leave the other, block i - 1's sums (stored one step earlier)
 * are scaled on the vector units and block i + AMX_AHEAD is unpacked; a pair's outputs are
 * stored as its last block is scaled. xq: the first token's quantized activations (rows rb
 * bytes apart); xs: the tokens' gathered scalars (quant.h), block b's at xs + 64 b. The block of
 * the next pair is fetched as each block is unpacked, while that is below pend. */
SD_AMX SD_INLINE void rows16_stream(const int f, const int TT, float *y, int64_t ldy,
                                    const uint8_t *P, int64_t ng, size_t group, int bb, int64_t nb,
                                    const int8_t *xq, size_t rb, const float *xs, const float *bias,
                                    int accumulate, const uint8_t *pend) {
    uint8_t ring[AMX_RING][512] __attribute__((aligned(64)));
    int32_t c[3][AMX_TOKENS * 16] __attribute__((aligned(64)));
    __m512 acc[AMX_TOKENS];
    for (int t = 0; t < TT; t++) {
        acc[t] = _mm512_setzero_ps();
    }
    const int64_t total = ng * nb;
    amx_cursor u = {P, 0}, sc = {P, 0}; /* the next block to unpack, the next to scale */
    int64_t mb = 0;                     /* the block index of the next multiply */
    int64_t g = 0;                      /* the pair being scaled */
#define UNPACK(i)                                                                                  \
    do {                                                                                           \
        unpack16(f, ring[(i) % AMX_RING], u.p, u.p + group);                                       \
        if (u.p + 2 * group < pend) {                                                              \
            prefetch_block(u.p + 2 * group, bb, group);                                            \
        }                                                                                          \
        cursor_next(&u, bb, nb, group);                                                            \
    } while (0)
#define MUL(i, tc, ta, tb)                                                                         \
    do {                                                                                           \
        AMX_MUL(tc, ta, tb, xq + 32 * mb, rb, ring[(i) % AMX_RING]);                               \
        mb = mb + 1 == nb ? 0 : mb + 1;                                                            \
    } while (0)
#define SCALE(i)                                                                                   \
    do {                                                                                           \
        __m512 dwb, mwb;                                                                           \
        scales16(f, &dwb, &mwb, sc.p, sc.p + group);                                               \
        block16(f, TT, acc, c[(i) % 3], dwb, mwb, xs + 64 * sc.b);                                 \
        if (sc.b == nb - 1) { /* the pair's last block: its outputs are done */                    \
            const float *bv = bias != NULL ? bias + 16 * g : NULL;                                 \
            for (int t = 0; t < TT; t++) {                                                         \
                sd_q_store16(y + (size_t)t * (size_t)ldy + (size_t)(16 * g), acc[t], bv,           \
                             accumulate);                                                          \
                acc[t] = _mm512_setzero_ps();                                                      \
            }                                                                                      \
            g++;                                                                                   \
        }                                                                                          \
        cursor_next(&sc, bb, nb, group);                                                           \
    } while (0)
    for (int64_t i = 0; i < AMX_AHEAD && i < total; i++) {
        UNPACK(i);
    }
    MUL(0, 0, 1, 2);
    for (int64_t i = 0; i < total; i += 2) { /* here block i is in tile set 0 */
        if (i + AMX_AHEAD < total) {
            UNPACK(i + AMX_AHEAD);
        }
        if (i + 1 < total) {
            MUL(i + 1, 3, 4, 5);
        }
        _tile_stored(0, c[i % 3], 64);
        if (i > 0) {
            SCALE(i - 1);
        }
        if (i + 1 == total) {
            break;
        }
        if (i + 1 + AMX_AHEAD < total) {
            UNPACK(i + 1 + AMX_AHEAD);
        }
        if (i + 2 < total) {
            MUL(i + 2, 0, 1, 2);
        }
        _tile_stored(3, c[(i + 1) % 3], 64);
        SCALE(i);
    }
    SCALE(total - 1);
#undef UNPACK
#undef MUL
#undef SCALE
}

/* Pairs of 8-row groups per stream when the tokens take more than one pass: four pairs (64
 * rows: 80 KB of Q4_x for n = 2048, 544 KB of Q8_0 at the longest rows) stay in L2 while every
 * chunk of tokens passes. */
#define AMX_PAIRS_PER_PASS 4

#define STREAM_TT(TT_)                                                                             \
    case TT_:                                                                                      \
        rows16_stream(f, TT_, yc, ldy, P0, ng, group, bb, nb, xq, rb, xs, bv, accumulate, pend);   \
        break;

SD_AMX SD_INLINE void amx_tile(const int f, float *y, int64_t ldy, const void *packed,
                               int64_t nrows, const sd_acts *a, int T, int64_t n, const float *bias,
                               int accumulate) {
    const int bb = f == A_Q8_0 ? 272 : 160;
    const int64_t nb = n / 32;
    const size_t rb = SD_Q8_ROW_BYTES(n), group = (size_t)nb * (size_t)bb;
    const int64_t n16 = nrows / 16 * 16, pairs = n16 / 16;
    /* one stream over all rows when one chunk holds every token */
    const int64_t per_pass = T <= AMX_TOKENS ? pairs : AMX_PAIRS_PER_PASS;
    int configured = 0; /* loaded on every call: other code on this thread may use AMX too */
    for (int64_t g0 = 0; g0 < pairs; g0 += per_pass) {
        const int64_t ng = pairs - g0 < per_pass ? pairs - g0 : per_pass;
        const uint8_t *P0 = (const uint8_t *)packed + (size_t)(2 * g0) * group;
        for (int t0 = 0; t0 < T; t0 += AMX_TOKENS) {
            const int tt = T - t0 < AMX_TOKENS ? T - t0 : AMX_TOKENS;
            if (configured != tt) { /* the tile shapes follow the number of tokens */
                amx_configure(tt);
                configured = tt;
            }
            const int8_t *xq = (const int8_t *)(a->xq + (size_t)t0 * rb);
            /* this chunk's gathered scalars */
            const float *xs = a->xt + (size_t)(t0 / AMX_TOKENS) * (size_t)nb * 64;
            float *yc = y + (size_t)t0 * (size_t)ldy + (size_t)(16 * g0);
            const float *bv = bias != NULL ? bias + 16 * g0 : NULL;
            /* the next pairs are fetched while the first chunk of tokens passes over these */
            const uint8_t *pend = t0 == 0 ? (const uint8_t *)packed + (size_t)(2 * pairs) * group
                                          : (const uint8_t *)packed;
            switch (tt) {
                STREAM_TT(16)
                STREAM_TT(15)
                STREAM_TT(14)
                STREAM_TT(13)
                STREAM_TT(12)
                STREAM_TT(11)
                STREAM_TT(10)
                STREAM_TT(9)
                STREAM_TT(8)
                STREAM_TT(7)
                STREAM_TT(6)
                STREAM_TT(5)
                STREAM_TT(4)
                STREAM_TT(3)
                STREAM_TT(2)
                STREAM_TT(1)
            }
        }
    }
    if (n16 < nrows) { /* a last group of 8 rows: the VNNI tile, with the same bits */
        const uint8_t *P = (const uint8_t *)packed + (size_t)(n16 / 8) * group;
        sd_tile_packed_vnni(f == A_Q4_0   ? 2
                            : f == A_Q4_1 ? 3
                                          : 8,
                            y + n16, ldy, P, nrows - n16, a, T, n, bias != NULL ? bias + n16 : NULL,
                            accumulate);
    }
}

SD_AMX void sd_tile_packed_amx(int type, float *y, int64_t ldy, const void *packed, int64_t nrows,
                               const sd_acts *a, int T, int64_t n, const float *bias,
                               int accumulate) {
    if (T < SD_AMX_MIN_TOKENS || a->xt == NULL) {
        sd_tile_packed_vnni(type, y, ldy, packed, nrows, a, T, n, bias, accumulate);
        return;
    }
    switch (type) {
    case 2: amx_tile(A_Q4_0, y, ldy, packed, nrows, a, T, n, bias, accumulate); break;
    case 3: amx_tile(A_Q4_1, y, ldy, packed, nrows, a, T, n, bias, accumulate); break;
    default: amx_tile(A_Q8_0, y, ldy, packed, nrows, a, T, n, bias, accumulate); break;
    }
}

#else /* a compiler without AMX intrinsics */

int sd_cpu_has_amx_int8(void) {
    return 0;
}

void sd_tile_packed_amx(int type, float *y, int64_t ldy, const void *packed, int64_t nrows,
                        const sd_acts *a, int T, int64_t n, const float *bias, int accumulate) {
    sd_tile_packed_vnni(type, y, ldy, packed, nrows, a, T, n, bias, accumulate);
}

#endif
#endif /* SD_HAVE_X86_SIMD */
