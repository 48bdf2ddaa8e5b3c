/* llamacpp_order.h — a forward pass that does every float operation in llama.cpp's order.
 *
 * specdec's own kernels (forward.c) are as exact as llama.cpp's but sum in another order; on a
 * model that quantizes its activations to 8 bits, that alone moves logits by tenths (see
 * benchmarks/RESULTS.md, "How far two correct implementations disagree"). This pass reproduces
 * the arithmetic of llama.cpp's CPU backend instead, bit for bit, so that specdec's reading of a
 * GGUF file (tensor layouts, RoPE, attention, tokenizer ids) can be checked against llama.cpp
 * exactly rather than within a tolerance. It is a reference, not a fast path: it keeps its own
 * f16 cache for the one call and runs the tokens of a call as llama.cpp would: the first
 * `n_batch` as one batch, the rest one at a time.
 *
 * What is reproduced (read from ggml's CPU backend as shipped with llama-cpp-python 0.3.36,
 * built for x86-64 with AVX-512, flash attention off, f16 KV cache, the Python binding's
 * defaults):
 *   - RMSNorm: squares rounded to float, summed in double in index order; mean = (float)(sum/D);
 *     scale = 1/sqrtf(mean + eps); y = (x * scale) * w.
 *   - Activations to 8 bits per block of 32: amax; d = amax/127 kept as a half; q = x*(127/amax)
 *     rounded half to even; for Q4_1 weights also s = half(d * sum q).
 *   - Q4_1 and Q8_0 dot products: eight lanes, lane j the integer sum of the four products
 *     4j..4j+3 of a block; lane = fma(d_w*d_x, lane sum, lane) block after block; Q4_1 adds
 *     m_w*s_x into a scalar by fma; the lanes are then added as ((l0+l4)+(l2+l6)) +
 *     ((l1+l5)+(l3+l7)), plus that scalar.
 *   - RoPE (adjacent pairs): angle_i = pos * r^i by repeated float products, r = powf(base,
 *     -2/Dh); cosf, sinf; x0' = fma(x0, c, -(x1*s)), x1' = fma(x0, s, x1*c).
 *   - Keys and values stored as halves; queries and attention weights rounded to halves.
 *     A batch's products (llamafile's tinyBLAS): one 16-lane accumulator, fma chunk after chunk
 *     of 16, then AVX-512's reduction (pairs i, i+8, then i, i+4, then (0+2) + (1+3)). One
 *     token's (ggml_vec_dot_f16): four such accumulators taking chunks in turn, added 0+2 and
 *     1+3, then 0+1, then the same reduction.
 *   - Softmax: score * scale, the row's max, exp by ggml's polynomial (lc_exp below), sums of
 *     16 values as above added in double, weights e * (float)(1/sum).
 *   - SwiGLU: gate / (1 + exp(-gate)) * up, with the same exp.
 * Both the batch and the one-token kernels give the head the same order, so the output rows of
 * a batch and of a single token differ only through attention.
 *
 * Supported: llama-architecture GGUF models on the CPU with Q4_1 attention/MLP matrices, a Q8_0
 * token embedding and output head (SmolLM2-135M-Instruct's layout), adjacent-pair RoPE, no
 * biases, head_dim a multiple of 64; anything else is SD_ERR_UNSUPPORTED, naming it. */
#ifndef SD_LLAMACPP_ORDER_H
#define SD_LLAMACPP_ORDER_H

#include "specdec.h"

/* Logits (n, V) of tokens[0..n) at positions 0..n-1 from an empty cache: tokens[0..n_batch) as
 * one batch, then each further token alone (1 <= n_batch <= n; n_batch == 1 is one token at a
 * time throughout). SD_ERR_UNSUPPORTED for a model this order is not known for;
 * SD_ERR_INVALID_ARG for bad ids or lengths; SD_ERR_NOMEM. */
sd_status sd_forward_llamacpp_order(sd_model *m, const int32_t *tokens, int n, int n_batch,
                                    float *logits);

#endif /* SD_LLAMACPP_ORDER_H */
