/* simd_avxvnni_q.c — the tile over the repacked copies (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K,
 * Q5_K, Q6_K) for CPUs with AVX-VNNI: all of them where AVX-512 is absent (Intel's client cores
 * from Alder Lake on), the formats the AVX-512 tiles do not take where it is present (Zen 5,
 * Intel's servers from Sapphire Rapids on). AVX-VNNI is vpdpbusd in the VEX encoding: 256-bit
 * registers, sixteen of them, four unsigned weight bytes times four signed activation bytes
 * added into each i32 lane in one instruction, where AVX2 alone needs maddubs, an add and a
 * widening madd (simd_avx2_packed.c).
 *
 * Layouts, the activations' interleaving and the tile driver are simd_packed.h's. Per block the
 * integer sums are exact in i32 whatever their order (at most 8 x 4 x 255 x 127 < 2^31 before a
 * K-quant's scale, below 2^24 after it, as simd_avx2_packed.c bounds them), and the float step
 * is that of both other tiles: the offset times the activation value it multiplies, then the
 * converted sum times d_w d_x, both fused. Q4_0, Q4_1 and Q8_0 (as unsigned bytes, +128, with
 * the offset -128 d_w) get the bits of the AVX512-VNNI tiles; the other formats, whose sums are
 * the AVX2 tile's integers, get its bits (tests/test_quant.py, tests/test_kquant_repack.py).
 *
 * With sixteen registers a pass over an 8-row group serves CHUNK tokens: their integer sums and
 * float accumulators, the nibble mask and one unpacked vector pair at a time (the weights are
 * unpacked per pass, a few instructions; larger batches pass over the group again from L1).
 * The AVX512-VNNI tile keeps all eight unpacked vectors and sixteen accumulators in its 32
 * registers instead; here that layout spilled the accumulators and was slower up to 8 tokens. */
#include "cpu/x86/simd.h"

#ifdef SD_HAVE_X86_SIMD

#include <cpuid.h>
#include <immintrin.h>

#include "cpu/x86/simd_packed.h"
#include "cpu/x86/simd_q_common.h"

#define SD_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

/* Tokens per pass: 2 x 6 accumulators, the mask, a packed vector and its unpacked pair make the
 * 16 registers (on Zen 5 with SPECDEC_SIMD=avxvnni, 4, 5, 6 and 8 timed alike at 8 and 16 tokens;
 * 6 takes a batch of 6 in one pass). */
#define CHUNK 6
/* Q5 formats: the fifth bits and their mask take two more. */
#define CHUNK_FIVE 5
/* Q6_K: the sums of a half block apart from the block's, 3 x 4. */
#define CHUNK_SPLIT 4

int sd_cpu_has_avxvnni(void) {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    /* CPUID.(EAX=7, ECX=1):EAX bit 4; the OS's saving of YMM state is what AVX2 needs too */
    if (!sd_cpu_has_avx2_fma_f16c() || !__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) {
        return 0;
    }
    return (eax >> 4) & 1;
}

/* The rows' integer scales of a K-quant block as i32 lanes (lane k = row k's; simd_packed.h
 * stores each twice, at bytes 2k and 2k + 1): u8 for Q4_K and Q5_K, i8 for Q6_K. */
SD_AVXVNNI SD_INLINE __m256i row_scales(const int f, const uint8_t *p) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    const __m256i w16 = f == V_Q6_K ? _mm256_cvtepi8_epi16(b) : _mm256_cvtepu8_epi16(b);
    return _mm256_srai_epi32(_mm256_slli_epi32(w16, 16), 16);
}

/* s[t] = the exact integer sums of one block of 8 packed rows (P) of format f and tokens
 * t0 .. t0 + C - 1 (X), times the rows' integer scales where the format has them: the integers
 * simd_avx2_packed.c's sums give (and for Q8_0, as unsigned bytes, the AVX512-VNNI tile's). */
SD_AVXVNNI SD_INLINE void block_sums(const int f, const int t0, const int C, __m256i *s,
                                     const uint8_t *P, const uint8_t *X) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    for (int t = 0; t < C; t++) {
        s[t] = _mm256_setzero_si256();
    }
    if (f == V_Q8_0) {
        for (int g = 0; g < 8; g++) { /* stored + 128: unsigned as they are */
            const __m256i w = _mm256_loadu_si256((const __m256i *)(P + 32 * g));
            for (int t = 0; t < C; t++) {
                s[t] = _mm256_dpbusd_avx_epi32(s[t], w, XIB(X, t0 + t, g));
            }
        }
    } else if (f == V_Q6_K) { /* signed: |w| times x with w's sign, a scale per half block */
        const int so = pk_sc(V_Q6_K);
        for (int half = 0; half < 2; half++) {
            __m256i h[CHUNK_SPLIT];
            for (int t = 0; t < C; t++) {
                h[t] = _mm256_setzero_si256();
            }
            for (int j = 0; j < 4; j++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(P + 128 * half + 32 * j));
                const __m256i u = _mm256_sign_epi8(w, w);
                for (int t = 0; t < C; t++) {
                    const __m256i x = _mm256_sign_epi8(XIB(X, t0 + t, 4 * half + j), w);
                    h[t] = _mm256_dpbusd_avx_epi32(h[t], u, x);
                }
            }
            const __m256i k = row_scales(V_Q6_K, P + so + 16 * half);
            for (int t = 0; t < C; t++) {
                s[t] = _mm256_add_epi32(s[t], _mm256_mullo_epi32(h[t], k));
            }
        }
    } else {
        const int five = f == V_Q5_0 || f == V_Q5_1 || f == V_Q5_K;
        const __m256i bit4 = _mm256_set1_epi8(0x10);
        const __m256i H = five ? _mm256_loadu_si256((const __m256i *)(P + 128)) : lo4;
        for (int h = 0; h < 4; h++) { /* vector h: group h (low nibbles) and h + 4 (high) */
            const __m256i v = _mm256_loadu_si256((const __m256i *)(P + 32 * h));
            __m256i lo = _mm256_and_si256(v, lo4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
            if (five) { /* bit h of H to bit 4 of group h, bit h + 4 to bit 4 of group h + 4 */
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(H, 4 - h), bit4));
                hi = _mm256_or_si256(hi,
                                     _mm256_and_si256(h == 0 ? H : _mm256_srli_epi16(H, h), bit4));
            }
            for (int t = 0; t < C; t++) {
                s[t] = _mm256_dpbusd_avx_epi32(s[t], lo, XIB(X, t0 + t, h));
                s[t] = _mm256_dpbusd_avx_epi32(s[t], hi, XIB(X, t0 + t, h + 4));
            }
        }
        if (f == V_Q4_K || f == V_Q5_K) {
            const __m256i k = row_scales(f, P + pk_sc(f));
            for (int t = 0; t < C; t++) {
                s[t] = _mm256_mullo_epi32(s[t], k);
            }
        }
    }
}

/* Tokens t0 .. t0 + C - 1 against nb blocks of 8 packed rows of format f from P: out[t0 + t]
 * lane k = dot(row k, token t0 + t). Per block the exact integer sums, then the float step of
 * both other tiles: the offset times the activation value it multiplies (none for Q6_K), then
 * the converted sum times d_w d_x, both fused. */
SD_AVXVNNI SD_INLINE void pass_chunk(const int f, const int t0, const int C, __m256 *out,
                                     const uint8_t *P, int64_t nb, const uint8_t *X, int prefetch) {
    const int bb = packed_bb(f);
    __m256 acc[CHUNK];
    for (int t = 0; t < C; t++) {
        acc[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++, P += bb, X += XI_BYTES) {
        if (prefetch) {
            prefetch_next_group(P, nb, bb);
        }
        __m256i s[CHUNK];
        block_sums(f, t0, C, s, P, X);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + pk_d(f))));
        __m256 mw = _mm256_setzero_ps();
        if (f == V_Q8_0 || f == V_Q5_0) {
            mw = _mm256_mul_ps(dw, _mm256_set1_ps(f == V_Q8_0 ? -128.0f : -16.0f));
        } else if (f == V_Q4_K || f == V_Q5_K) {
            mw = _mm256_loadu_ps((const float *)(P + pk_m(f)));
        } else if (f != V_Q6_K) {
            mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + pk_m(f))));
        }
        for (int t = 0; t < C; t++) {
            if (f != V_Q6_K) {
                acc[t] = _mm256_fmadd_ps(mw, XIO(X, t0 + t), acc[t]);
            }
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_mul_ps(dw, XID(X, t0 + t)),
                                     acc[t]);
        }
    }
    for (int t = 0; t < C; t++) {
        out[t0 + t] = acc[t];
    }
}

/* Eight packed rows against TT <= 16 tokens, in chunks as even as can be of at most CHUNK
 * (Q5: CHUNK_FIVE, which holds the fifth bits too; Q6_K: CHUNK_SPLIT, its halves' sums apart),
 * each a pass over the group's blocks (the first from memory, prefetching the next group; the
 * rest from L1). */
SD_AVXVNNI SD_INLINE void packed8_dot_avxvnni(const int f, const int TT, __m256 *out,
                                              const uint8_t *P, int64_t nb, const uint8_t *X) {
    const int five = f == V_Q5_0 || f == V_Q5_1 || f == V_Q5_K;
    const int chunk = f == V_Q6_K ? CHUNK_SPLIT : five ? CHUNK_FIVE : CHUNK;
    const int nc = (TT + chunk - 1) / chunk;
#pragma GCC unroll 4 /* chunk sizes as compile-time constants */
    for (int c = 0; c < nc; c++) {
        const int t0 = c * TT / nc, C = (c + 1) * TT / nc - t0;
        pass_chunk(f, t0, C, out, P, nb, X, c == 0);
    }
}

PACKED_TILE(sd_tile_packed_avxvnni, SD_AVXVNNI, packed8_dot_avxvnni, 16, PACKED_NARROW,
            PACKED_DISPATCH_ALL)

#endif /* SD_HAVE_X86_SIMD */
