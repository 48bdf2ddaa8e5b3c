/* hd.h — arithmetic the C core and the CUDA kernels share, written once: scalar conversions
 * between f32, f16 and bf16, and the counter-based random numbers. SD_HD functions compile for
 * the host (C99 or C++) and, under nvcc, for the device too, so a CUDA kernel and its CPU twin
 * run the very same code for these steps. */
#ifndef SD_HD_H
#define SD_HD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SD_HD static __host__ __device__ __forceinline__
#else
#define SD_HD static inline
#endif

SD_HD float sd_hd_from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof(f));
    return f;
}

SD_HD uint32_t sd_hd_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof(b));
    return b;
}

/* IEEE half -> float, exactly (subnormals, infinities and NaNs included). */
SD_HD float sd_hd_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) {
            return sd_hd_from_bits(sign);
        }
        int e = -1; /* subnormal: normalise */
        do {
            e++;
            man <<= 1;
        } while ((man & 0x400u) == 0);
        return sd_hd_from_bits(sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13));
    }
    if (exp == 0x1f) {
        return sd_hd_from_bits(sign | 0x7f800000u | (man << 13));
    }
    return sd_hd_from_bits(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

/* float -> IEEE half, rounding to nearest even; overflow gives infinity. */
SD_HD uint16_t sd_hd_f32_to_f16(float f) {
    const uint32_t x = sd_hd_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) { /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
    }
    if (absx >= 0x477ff000u) { /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        /* 2^-24 is the subnormal step; the product is exact and rint rounds half to even */
        return (uint16_t)(sign | (uint32_t)rintf(sd_hd_from_bits(absx) * 16777216.0f));
    }
    const uint32_t mant = absx & 0x7fffffu;
    const uint32_t exp = (absx >> 23) - 127 + 15;
    uint32_t h = (exp << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) {
        h++;
    }
    return (uint16_t)(sign | h);
}

SD_HD float sd_hd_bf16_to_f32(uint16_t h) {
    return sd_hd_from_bits((uint32_t)h << 16);
}

/* float -> bfloat16, rounding to nearest even; NaNs stay NaN. */
SD_HD uint16_t sd_hd_f32_to_bf16(float f) {
    const uint32_t x = sd_hd_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((x >> 16) | 0x40u);
    }
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* The counter-based RNG: the SplitMix64 finaliser over the key (Steele et al., "Fast
 * splittable pseudorandom number generators", OOPSLA 2014). */
SD_HD uint64_t sd_hd_mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* 64 random bits keyed by (seed, stream, index). */
SD_HD uint64_t sd_hd_random64(uint64_t seed, uint64_t stream, uint64_t index) {
    return sd_hd_mix64(sd_hd_mix64(sd_hd_mix64(seed) ^ stream) ^ index);
}

/* exp(x) in float, lane for lane the arithmetic of the CPU's vector exp (cpu/x86/simd_exp.h,
 * SD_EXP_CORE): x = n ln 2 + r with n = round(x / ln 2) and ln 2 in two parts, e^r by its Taylor
 * series to degree 7 in fused multiply-adds, then times 2^(n - 1) and 2. Within 2 ulp of expf;
 * below -87.33 it gives 0, above 88.72 infinity, and a NaN gives exp(-87.33) as the vector's
 * max/min clamp does. The softmax of sampling takes its exponentials from here or from that
 * vector code, on the CPU and the GPU alike. */
SD_HD float sd_hd_expf(float x) {
    if (x < -87.33f) {
        return 0.0f;
    }
    if (x > 88.72f) {
        return INFINITY;
    }
    const float xc = x != x ? -87.33f : x;
    const float n = rintf(xc * 1.44269504088896341f);
    float r = fmaf(-n, 0.693145751953125f, xc);
    r = fmaf(-n, 1.428606765330187e-06f, r);
    float y = 1.0f / 5040.0f;
    y = fmaf(y, r, 1.0f / 720.0f);
    y = fmaf(y, r, 1.0f / 120.0f);
    y = fmaf(y, r, 1.0f / 24.0f);
    y = fmaf(y, r, 1.0f / 6.0f);
    y = fmaf(y, r, 0.5f);
    y = fmaf(y, r, 1.0f);
    y = fmaf(y, r, 1.0f);
    const int e = (int)(n - 1.0f);
    return y * sd_hd_from_bits((uint32_t)(e + 127) << 23) * 2.0f;
}

/* The random streams of decoding: one per use, so a draw is a pure function of (seed, stream,
 * output position) on every backend. */
enum {
    SD_STREAM_PLAIN = 0,  /* plain sampling */
    SD_STREAM_ACCEPT = 1, /* acceptance tests of draft tokens */
    SD_STREAM_EMIT = 2,   /* the token emitted after the accepted drafts */
    SD_STREAM_DRAFT = 3,  /* a draft model's own sampling */
    SD_STREAM_SYNTH = 4,  /* the synthetic acceptance of benchmarks */
    SD_STREAM_TREE = 5    /* acceptance tests of the nodes of a draft tree */
};

/* Uniform in [0, 1) keyed by (seed, stream, index); 53 random bits. */
SD_HD double sd_hd_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return (double)(sd_hd_random64(seed, stream, index) >> 11) * (1.0 / 9007199254740992.0);
}

#endif /* SD_HD_H */
