/* specdec.h — the public C API of specdec's core.
 *
 * specdec loads a decoder-only transformer (GGUF file or Hugging Face safetensors directory),
 * runs exact forward passes over a slot-addressed KV cache and decodes from it. This header is
 * the manual: every call says what it does, who owns what, and what its status means.
 *
 * Conventions
 *   - Every fallible call returns sd_status. On failure a message naming the problem is
 *     recorded for the calling thread; read it with sd_last_error(). Nothing here prints,
 *     exits or aborts.
 *   - Objects are opaque handles made by sd_X_load/create and released by the matching
 *     sd_X_free (which accepts NULL).
 *   - Output arguments come first; array shapes are given in comments, row-major.
 *   - A model is not safe for concurrent calls from several threads; distinct models are.
 */
#ifndef SPECDEC_H
#define SPECDEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ---------------------------------------------------------------------------------- */

typedef enum {
    SD_OK = 0,
    SD_ERR_INVALID_ARG = 1, /* an argument is out of its domain (token id, length, mask...)   */
    SD_ERR_FORMAT = 2,      /* a file is malformed or inconsistent (truncated, bad magic...)   */
    SD_ERR_UNSUPPORTED = 3, /* valid input we do not handle (architecture, tensor type...)     */
    SD_ERR_IO = 4,          /* the operating system refused (open, stat, mmap, read)           */
    SD_ERR_NOMEM = 5,       /* an allocation failed                                            */
    SD_ERR_INTERNAL = 6,    /* a broken invariant inside specdec: a bug, please report it      */
    SD_ERR_CUDA = 7,        /* the CUDA runtime or cuBLAS reported an error                    */
    SD_ERR_NUMERIC = 8      /* the model's numbers left the finite range (a NaN or infinity)   */
} sd_status;

/* Message of the last failure on this thread ("" if none). Valid until the next failing call. */
const char *sd_last_error(void);
/* Short constant name of a status, e.g. "SD_ERR_FORMAT". */
const char *sd_status_name(sd_status st);
/* Forget the recorded message of this thread. */
void sd_clear_error(void);

/* ---- tensor element types (values are ggml's type ids, as stored in GGUF) -------------------- */

typedef enum {
    SD_TYPE_F32 = 0,
    SD_TYPE_F16 = 1,
    SD_TYPE_Q4_0 = 2,
    SD_TYPE_Q4_1 = 3,
    SD_TYPE_Q5_0 = 6,
    SD_TYPE_Q5_1 = 7,
    SD_TYPE_Q8_0 = 8,
    SD_TYPE_Q4_K = 12,
    SD_TYPE_Q5_K = 13,
    SD_TYPE_Q6_K = 14,
    SD_TYPE_BF16 = 30
} sd_type;

/* Human-readable name of a ggml type id ("F16", "Q4_K", ... or "type#N" when unknown). */
const char *sd_type_name(int type);

/* ---- model ----------------------------------------------------------------------------------- */

/* GEMMA2 and GEMMA3: embeddings scaled by sqrt(D), norms after attention and after the MLP as
 * well as before, GeGLU with the tanh GELU in place of SwiGLU; GEMMA3 adds qwen3's q/k norms. */
typedef enum {
    SD_ARCH_LLAMA = 0,
    SD_ARCH_QWEN2 = 1,
    SD_ARCH_QWEN3 = 2,
    SD_ARCH_GEMMA3 = 3,
    SD_ARCH_GEMMA2 = 4,
    SD_ARCH_PHI3 = 5,    /* the llama graph; q/k/v and gate/up fused in the file, split at load */
    SD_ARCH_SMOLLM3 = 6, /* the llama graph without RoPE on every no_rope_interval-th layer */
    SD_ARCH_GRANITE = 7  /* the llama graph with scaled embeddings, residuals, attention, logits */
} sd_arch;

/* How RoPE's inverse frequencies inv[i] = theta^(-2i/Dh) are scaled for longer contexts. */
typedef enum {
    SD_ROPE_DEFAULT = 0,  /* unscaled */
    SD_ROPE_LINEAR = 1,   /* position interpolation: inv[i] / factor */
    SD_ROPE_LLAMA3 = 2,   /* Llama 3.1: wavelengths 2pi/inv[i] above original_context /
                           * low_freq_factor are divided by factor, those below original_context /
                           * high_freq_factor are kept, a linear blend in 1/wavelength between */
    SD_ROPE_FACTORS = 3,  /* inv[i] / f[i], the per-frequency divisors a GGUF file stores in
                           * rope_freqs.weight (llama.cpp's form of llama3 scaling) */
    SD_ROPE_LONGROPE = 4, /* Phi-3's LongRoPE: inv[i] / f[i] with f the short factors, or
                           * (rope_long) the long ones; cos and sin times rope_attn_factor */
    SD_ROPE_YARN = 5      /* YaRN: inv[i] blended from inv[i] / factor (interpolated) to inv[i]
                           * (extrapolated) over the frequencies that turn between beta_slow and
                           * beta_fast times in the original context; cos and sin times
                           * rope_attn_factor */
} sd_rope_scaling;

/* Most RoPE frequencies a model has (a head of up to 512 dimensions). */
#define SD_ROPE_MAX_FREQS 256

/* Hyper-parameters, read from the file. */
typedef struct {
    sd_arch arch;
    char arch_name[32];     /* "llama", "qwen2", ..., "phi3" (a GGUF file's own name) */
    int vocab_size;         /* V */
    int hidden_size;        /* D */
    int n_layers;           /* L */
    int n_heads;            /* H: query heads */
    int n_kv_heads;         /* Hkv: key/value heads, H % Hkv == 0 (grouped-query attention) */
    int head_dim;           /* Dh: usually D / H; qwen3 and others set it apart (H * Dh != D) */
    int ffn_size;           /* F: SwiGLU inner width */
    int context_length;     /* longest sequence the model takes: the file's, or less
                             * (sd_model_params.context_length; a LongRoPE model's original) */
    int context_file;       /* the file's context length (set at load) */
    float rope_theta;       /* RoPE base frequency */
    float rms_eps;          /* RMSNorm epsilon */
    int tied_embeddings;    /* 1: the output head is the token embedding matrix */
    int rope_neox;          /* 1: rotate-half pairs (i, i + Dh/2); 0: adjacent pairs (2i, 2i + 1) */
    int has_qkv_bias;       /* 1: q/k/v projections carry biases (qwen2) */
    int has_qk_norm;        /* 1: per-head RMSNorm (weights of Dh) of q and k before RoPE (qwen3) */
    int sliding_window;     /* > 0: the token at position p attends only to positions in
                             * (p - sliding_window, p] (Mistral); 0: to every earlier position */
    int swa_pattern;        /* with a window: 0 = on every layer; n = on layer l iff
                             * l % n < n - 1 (Gemma 3: five local layers, then a global one;
                             * Gemma 2: 2, every other layer) */
    float rope_theta_local; /* swa_pattern > 0: the local layers' RoPE base (never scaled) */
    float attn_scale;       /* > 0: the softmax scale of q.k; 0 = 1/sqrt(Dh) */
    float final_softcap;    /* > 0: logits = c * tanh(logits / c) */
    float attn_softcap;     /* > 0: scaled q.k scores = c * tanh(scores / c) before the mask and
                             * softmax (Gemma 2) */
    int rope_scaling;       /* sd_rope_scaling */
    float rope_factor;      /* LINEAR and LLAMA3: how many times the original context */
    float rope_low_freq_factor;  /* LLAMA3 */
    float rope_high_freq_factor; /* LLAMA3 */
    int rope_original_context;   /* LLAMA3, LONGROPE, YARN: original_max_position_embeddings */
    float rope_beta_fast;        /* YARN: rotations in the original context below which a
                                  * frequency is interpolated (32) */
    float rope_beta_slow;        /* YARN: above which it is kept (1) */
    float embed_scale;           /* > 0: the token embeddings times it (granite; gemma's sqrt(D) is
                                  * applied apart) */
    float residual_scale;   /* > 0: each block's output times it before it is added (granite) */
    float logit_scale;      /* > 0: the logits divided by it (granite) */
    int no_rope_interval;   /* > 0: layer l applies no RoPE when (l + 1) % it == 0 (SmolLM3's
                             * NoPE layers, every 4th); 0: every layer does */
    int rope_dim;           /* rotated dimensions of each head, the first rope_dim (even; 0 = all
                             * Dh): Phi-4-mini's partial rotary embeddings */
    float rope_attn_factor; /* LONGROPE, YARN: cos and sin are multiplied by it (0 = 1) */
    int rope_long;          /* LONGROPE: 1 = the long factors (a context above the original) */
    float rope_short_factors[SD_ROPE_MAX_FREQS]; /* LONGROPE: (rope_dim / 2) divisors */
    float rope_long_factors[SD_ROPE_MAX_FREQS];  /* LONGROPE: (rope_dim / 2) divisors */
    int weight_type; /* sd_type of the attention/MLP matrices (the first layer's wq) */
    /* A drafter's head (sd_head_kind; 0 = a model of its own): its rows read vectors (the
     * batch's embd) besides tokens, and its layer and output differ (model/head.h) */
    int head;
    int head_norm_residual; /* EAGLE-3 as vLLM's speculators write it: the residual is the
                             * normed feature (norm_before_residual) */
} sd_config;

typedef struct sd_model sd_model;

/* Where a model's weights live and its forward passes run. */
typedef enum { SD_DEVICE_CPU = 0, SD_DEVICE_CUDA = 1 } sd_device;

typedef struct {
    int n_threads; /* worker threads for the forward pass; 0 = the cores this process may use */
    int repack;    /* 1 (default): on CPUs with AVX2 keep an interleaved copy of the
                    * Q4_0/Q4_1/Q8_0 matrices (as large as they are) that the fastest kernels
                    * read directly; 0: compute from the file's rows only */
    int device;    /* sd_device (default CPU). CUDA: the weights are copied once into one
                    * allocation on the GPU, caches live there, forwards and decoding loops
                    * run there; SD_ERR_UNSUPPORTED in a build without the CUDA backend, and
                    * SD_ERR_CUDA naming the failed call when no usable GPU is found */
    int gpu;       /* CUDA device index (default 0) */
    int context_length; /* 0 (default): the file's (for LongRoPE its original context); else the
                         * longest sequence the model takes, at most the file's, and for
                         * LongRoPE above the original context its long factors */
} sd_model_params;

sd_model_params sd_model_default_params(void);

/* Load a model. `path` is a .gguf file (GGUF v2/v3) or a Hugging Face model directory holding
 * config.json and model.safetensors (or a sharded model.safetensors.index.json). Weights stay
 * in the read-only file mappings; the model owns them. Every header field and tensor extent is
 * validated before use, so a corrupt file yields SD_ERR_FORMAT, never a crash. */
sd_status sd_model_load(sd_model **out, const char *path, const sd_model_params *params);
void sd_model_free(sd_model *model);

/* A model of the shape cfg describes, with random weights and no file, for benchmarks (the
 * idea of vLLM's load_format="dummy"): cfg->arch and the sizes (vocab_size, hidden_size,
 * n_layers, n_heads, n_kv_heads, head_dim, ffn_size, context_length), rope_theta, rms_eps and
 * tied_embeddings are read, the rest follows from them. Matrices (the embedding included) are
 * of `weight_type` with values in about [-1/sqrt(cols), 1/sqrt(cols)], norms are ones; byte i
 * of each tensor is a function of (seed, tensor, i) alone, so the CPU and CUDA backends build
 * the same model (on CUDA the matrices are generated on the device, never on the host).
 * SD_ERR_INVALID_ARG names a shape the type's blocks do not divide. */
sd_status sd_model_create_dummy(sd_model **out, const sd_config *cfg, int weight_type,
                                uint64_t seed, const sd_model_params *params);
/* The device the model runs on (sd_device). */
int sd_model_device(const sd_model *model);
const sd_config *sd_model_config(const sd_model *model);
/* Change the number of worker threads (>= 1). */
sd_status sd_model_set_threads(sd_model *model, int n_threads);
int sd_model_threads(const sd_model *model);
/* Whether KV caches created from now on keep keys and values as IEEE halves: the CPU default
 * (half the memory and half the bytes attention reads per token; llama.cpp's default cache type
 * too). Values beyond the half range saturate. 0 keeps f32; a CUDA model keeps f32 only
 * (SD_ERR_UNSUPPORTED). A cache keeps the type it was created with. */
sd_status sd_model_set_kv_f16(sd_model *model, int f16);
int sd_model_kv_f16(const sd_model *model);
/* Prefix reuse (CPU models): the model keeps the KV caches of its last n finished requests
 * (sequences) with the tokens they hold; a new request whose prompt starts with some of those
 * tokens (a chat's next turn, a shared system prompt) starts from their keys and values instead
 * of computing them again, with the same output bits. n in [0, SD_PREFIX_CACHE_MAX]; 0 frees
 * what is kept and turns it off; default SD_PREFIX_CACHE_DEFAULT on the CPU, 0 on CUDA. */
#define SD_PREFIX_CACHE_MAX 64
#define SD_PREFIX_CACHE_DEFAULT 4
sd_status sd_model_set_prefix_cache(sd_model *model, int n);
int sd_model_prefix_cache(const sd_model *model);
/* The sequence steps run on the model so far, and the forwards they took: the steps of
 * requests running at once in several threads share forwards (sd_sequence_step). */
void sd_model_sched_counts(sd_model *model, long long *forwards, long long *steps);
/* Bytes of weights one forward reads per token: every matrix and norm and the output head; not
 * the embedding table, of which a forward reads only its tokens' rows. */
size_t sd_model_weight_bytes(const sd_model *model);

/* GGUF metadata value types, as stored in the file. */
typedef enum {
    SD_GGUF_U8 = 0,
    SD_GGUF_I8 = 1,
    SD_GGUF_U16 = 2,
    SD_GGUF_I16 = 3,
    SD_GGUF_U32 = 4,
    SD_GGUF_I32 = 5,
    SD_GGUF_F32 = 6,
    SD_GGUF_BOOL = 7,
    SD_GGUF_STRING = 8, /* u64 length + UTF-8 bytes, no NUL */
    SD_GGUF_ARRAY = 9,  /* u32 element type + u64 count + elements */
    SD_GGUF_U64 = 10,
    SD_GGUF_I64 = 11,
    SD_GGUF_F64 = 12
} sd_gguf_type;

/* The key/value metadata of a model loaded from GGUF (none for a Hugging Face directory, whose
 * config.json and tokenizer files are read directly): the tokenizer, the chat template, ...
 * Entry i (0 <= i < count) gives its key (NUL-terminated), its sd_gguf_type and a view of its
 * value bytes exactly as stored, little-endian. Every entry was validated at load time, so a
 * reader that follows the layout above stays inside the file. Views live as long as the model. */
int sd_model_metadata_count(const sd_model *model);
sd_status sd_model_metadata_entry(const sd_model *model, int i, const char **key, int *type,
                                  const unsigned char **value);

/* ---- KV cache -------------------------------------------------------------------------------- */

/* Keys and values of every layer, addressed by slot: slot s of layer l holds the post-RoPE key
 * and the value of one token, and the RoPE position it was written at. Slots [0, length) are
 * live. Rolling back is setting the length; speculative verify writes draft tokens into the
 * slots after the accepted prefix and the accepted ones are kept by moving the length. */
typedef struct sd_kv_cache sd_kv_cache;

/* A cache of `n_slots` slots (1 <= n_slots <= context length) for `model`'s shape. */
sd_status sd_kv_cache_create(sd_kv_cache **out, const sd_model *model, int n_slots);
void sd_kv_cache_free(sd_kv_cache *kv);
int sd_kv_cache_length(const sd_kv_cache *kv);
int sd_kv_cache_capacity(const sd_kv_cache *kv);
/* Keep slots [0, n) and forget the rest; 0 <= n <= length. */
sd_status sd_kv_cache_set_length(sd_kv_cache *kv, int n);
/* Copy slot `src` onto slot `dst` (all layers, K, V and position): compacts an accepted tree
 * path into consecutive slots. Both must be < capacity. */
sd_status sd_kv_cache_copy_slot(sd_kv_cache *kv, int dst, int src);

/* ---- forward --------------------------------------------------------------------------------- */

/* One forward pass over T tokens. The tokens' keys/values are written into the given slots and
 * every token attends to the cache slots its mask row allows (its own slot included). */
typedef struct {
    int n_tokens;          /* T >= 1 */
    const int32_t *tokens; /* (T) token ids, 0 <= id < V */
    const int32_t *pos;    /* (T) RoPE positions; NULL = length + t */
    const int32_t *slots;  /* (T) slots to write, distinct, < capacity; NULL = length + t */
    /* (T, n_mask_cols): nonzero = query t may attend slot s. Slots >= n_mask_cols are not
     * attended. NULL = causal by position: slot s is attended iff s < new length and the
     * position stored in s is <= pos[t]. */
    const uint8_t *mask;
    int n_mask_cols; /* 1 <= n_mask_cols <= new length, when mask != NULL */
    int n_logits;    /* logits are produced for the last n_logits tokens, 0 <= . <= T */
    /* run only the first n_layers layers, then the final norm and the head (the early-exit
     * draft of self-speculation); 0 = all. Keys/values are written for those layers only. */
    int n_layers;
    /* Features for drafters that read the target's hidden states (EAGLE, Medusa), from CPU and
     * CUDA models (copied to the host there):
     * hidden, when not NULL, (T, D) receives every token's final-normed hidden state (what the
     * head multiplies, for the rows that get logits); aux, when n_aux > 0, (n_aux, T, D)
     * receives the residual stream entering each of the layers aux_layers[0 .. n_aux) (before
     * its norm); 0 <= n_aux <= SD_MAX_AUX_LAYERS, layers < the layers run. */
    float *hidden;
    const int32_t *aux_layers;
    int n_aux;
    float *aux;
    /* A drafter head's batch (sd_config.head): (T, D) the rows entering its layer (its input
     * projection's output, or its own earlier output), in place of the tokens' embeddings; the
     * tokens are still read (EAGLE-3's layer reads their embeddings too). An aux layer equal to
     * the layers run means the residual stream after the last layer, before the final norm. */
    const float *embd;
} sd_batch;
#define SD_MAX_AUX_LAYERS 8

/* Run `batch` through `model`, updating `kv` (its length becomes max(length, max slot + 1)).
 * `logits` is (n_logits, V) or NULL when n_logits == 0. Positions past the context length,
 * token ids out of range and ill-formed masks are rejected with SD_ERR_INVALID_ARG before any
 * state changes. */
sd_status sd_forward(sd_model *model, sd_kv_cache *kv, const sd_batch *batch, float *logits);

/* ---- decoding -------------------------------------------------------------------------------- */

/* The bytes each token id stands for (its "piece"), so the decoding loop can watch the output
 * text for stop strings without leaving C. pieces[i] is lens[i] bytes; n must equal the vocab
 * size. The model keeps a copy. */
sd_status sd_model_set_token_pieces(sd_model *model, const char *const *pieces, const size_t *lens,
                                    int n);

typedef struct {
    int max_new_tokens;      /* >= 0 */
    float temperature;       /* 0 = greedy (argmax, lowest id on ties); > 0 = sample softmax(l/T) */
    int top_k;               /* sampling: keep the k most probable tokens; 0 = off */
    float top_p;             /* sampling: keep the smallest set with mass >= top_p; 1 = off */
    float min_p;             /* sampling: drop tokens below min_p * the largest; 0 = off */
    uint64_t seed;           /* sampling: the draw for output position i is a pure function of
                              * (seed, i), so a seed reproduces a run whatever the thread count */
    const int32_t *stop_ids; /* (n_stop_ids) tokens that end generation (emitted, then stop) */
    int n_stop_ids;
    /* (n_stop_strings) byte strings: generation stops after the token whose piece completes one
     * of them in the output (the caller trims the text); needs sd_model_set_token_pieces */
    const char *const *stop_strings;
    const size_t *stop_lens;
    int n_stop_strings;
    /* Called from the generating thread with each token as it is emitted (stop token included),
     * in order; a nonzero return ends generation after that token (SD_FINISH_CANCELLED). Runs
     * inside the loop, so it should be quick. NULL = none. */
    int (*on_token)(void *user, int32_t token);
    void *on_token_user;
    /* A self-check for tests (slow): after every speculative step, the target's cache (and a
     * draft model's) must hold exactly the keys, values and positions a fresh forward over the
     * tokens it stands for writes, bit for bit; any difference ends the call with
     * SD_ERR_INTERNAL naming the step, layer and slot. 0 = off. */
    int check_cache;
    /* Log-probabilities (CPU models only): 1 = record each emitted token's log-probability under
     * the target's own distribution, log softmax(logits) at temperature 1 (after the logit bias
     * and penalties below) before any sampling filter, whatever the sampling settings and the
     * drafter (a token's logits do not depend on
     * its batch, so a speculative run records the bits plain decoding records for the same
     * tokens), and the top_logprobs (0 .. SD_MAX_TOP_LOGPROBS) most probable tokens' at that
     * position, best first, ties to the lower id; read with sd_sequence_logprobs. 0 = off. */
    int logprobs;
    int top_logprobs;
    /* Logit bias and penalties (CPU models only), applied to the target's logits of every
     * position before anything reads them, in this order: bias_values[i] (finite, in
     * [-100, 100]) added to the logit of bias_ids[i] (distinct ids, n_bias of them); then, for
     * a token in the prompt or the output before that position, the repetition penalty (> 0; 1
     * = off: a positive logit divided by it, a negative one multiplied); then, for a token the
     * output holds c > 0 times, frequency_penalty * c + presence_penalty subtracted (both in
     * [-2, 2]; 0 = off). In a verify forward each row counts the drafted tokens on its own path,
     * so speculative output stays exactly plain decoding's. Greedy picks and sampling (and the
     * logprobs) read the penalised logits. */
    const int32_t *bias_ids;
    const float *bias_values;
    int n_bias;
    float repetition_penalty; /* 1 (the default): off */
    float frequency_penalty;
    float presence_penalty;
    /* >= 0: the stop tokens (stop_ids) cannot end generation before this many tokens are out:
     * their logits are -inf at earlier positions (a verify row counts its path); 0 = off. */
    int min_tokens;
} sd_generate_params;
#define SD_MAX_TOP_LOGPROBS 20

sd_generate_params sd_generate_default_params(void);

typedef enum {
    SD_FINISH_LENGTH = 0,      /* max_new_tokens reached */
    SD_FINISH_STOP_TOKEN = 1,  /* the last token is one of stop_ids */
    SD_FINISH_STOP_STRING = 2, /* the output text now contains a stop string */
    SD_FINISH_CANCELLED = 3    /* on_token asked to stop */
} sd_finish_reason;

/* Autoregressive decoding: prefill `prompt` (n_prompt >= 1 tokens) into a fresh cache, then
 * emit up to max_new_tokens tokens into `out` ((max_new_tokens)); *n_out receives the count and
 * *reason (may be NULL) why it stopped. n_prompt + max_new_tokens must not exceed the context
 * length. */
sd_status sd_generate(int32_t *out, int *n_out, sd_finish_reason *reason, sd_model *model,
                      const int32_t *prompt, int n_prompt, const sd_generate_params *params);

/* ---- speculative decoding -----------------------------------------------------------------------
 */

#define SD_MAX_DRAFT 32
/* The most nodes a draft tree may have. */
#define SD_MAX_TREE_NODES 64

/* Prompt lookup (n-gram) drafting: match the last n tokens of prompt + output (n from max_ngram
 * down to min_ngram) at the earlier occurrence whose preceding tokens agree longest with the
 * text's (the latest among equals) and propose the k tokens that followed it, continued
 * periodically past the end of the text (sd_lookup_draft in lookup.h). Deterministic drafts:
 * verified as one-hot draft distributions. */
typedef struct {
    int k;         /* 1 <= k <= SD_MAX_DRAFT: the most drafts per step */
    int max_ngram; /* >= min_ngram */
    int min_ngram; /* >= 1 */
    /* Adaptive draft length: 0 = always draft up to k; > 0 = draft the k that maximises the
     * expected tokens per unit of verify cost, (1 - a^(k+1)) / ((1 - a)(1 + verify_slope k)),
     * with a the acceptance rate measured so far in this request after matches of the same
     * n-gram size, or reaching as far back (accepted tokens over accepted tokens plus rejected
     * drafts; starting at 0.5, or near 1 for matches reaching 16 or more tokens back) and
     * verify_slope the cost of one more token in a verify batch relative to one token. */
    float verify_slope;
    /* 1: one chain. b > 1: a tree whose sibling branches are the continuations of up to b
     * occurrences whose first tokens differ (the best one the chain's; then by n-gram size, by
     * how far back they agree, the latest), each of the chain's length; verified in one forward
     * by the tree rule. 1 <= b <= SD_LOOKUP_MAX_BRANCHES, k * b <= SD_MAX_TREE_NODES. */
    int branching;
    /* 0: as above. 1: each step keeps only the drafts that pay on the verify costs measured on
     * the target at the first request (sd_tree_size; or those given, sd_drafter_set_costs),
     * in place of verify_slope: a chain's node j (0-based) is accepted with a^(j+1), a the
     * acceptance rate above, and a sibling branch's first token with the rate at which
     * branches of its rank were taken so far in the request (smoothed towards 0.1), times
     * a^j deeper; where nothing pays, one draft every fourth step keeps measuring. */
    int size_by_cost;
} sd_prompt_lookup;
#define SD_LOOKUP_MAX_BRANCHES 8

/* What a speculative run did, for users and for the benchmarks. */
typedef struct {
    int steps;                     /* target forwards after the prefill */
    int drafted;                   /* draft tokens proposed */
    int accepted;                  /* draft tokens accepted */
    int drafted_at[SD_MAX_DRAFT];  /* drafts proposed at draft position i */
    int accepted_at[SD_MAX_DRAFT]; /* ... and accepted there */
    /* steps by the nodes they proposed (a chain's drafts, a tree's nodes), and by the drafts they
     * accepted (the accepted path's length) */
    int steps_by_nodes[SD_MAX_TREE_NODES + 1];
    int steps_by_accepted[SD_MAX_TREE_NODES + 1];
    double time_draft_s, time_verify_s, time_total_s;
} sd_spec_stats;

/* How a model drafter (a draft model, or the target's first layers) sizes its drafts. */
typedef struct {
    int k;       /* 1 <= k <= SD_MAX_DRAFT: the most drafts per step */
    float p_min; /* in [0, 1]: a step's drafting stops after a token the draft gave probability
                  * below p_min (its processed probability when sampling, its softmax
                  * probability when greedy); 0 = off */
    /* Adaptive draft length, as sd_prompt_lookup's, with the drafting cost counted: each step
     * drafts the k that maximises (1 - a^(k+1)) / ((1 - a)(1 + (verify_slope + c) k)), a the
     * acceptance rate measured so far in the request, c one draft token's cost relative to a
     * target forward (weights read: the draft's over the target's, or n_layers over the
     * layer count); where no k pays, one token is still drafted every fourth step to keep
     * measuring. 0 = off (always draft up to k, or until p_min). A chain's only (b = 1). */
    float verify_slope;
    /* 1: a chain of up to k drafts, as above. b > 1: a tree up to k deep (EAGLE-2's dynamic
     * tree, Li et al. 2024): a node gets the draft's b most probable tokens as children at
     * temperature 0, b tokens drawn without replacement from its processed distribution q when
     * sampling; the most probable nodes are expanded, a depth's nodes drafted in one tree-masked
     * draft forward, and the tree keeps at most `nodes` nodes: at temperature 0 the most
     * probable paths (a parent before its child); when sampling, each node is kept or dropped
     * before its token is drawn (from how probable its parent's path and its undrawn tokens
     * are), which keeps the tree rule exact (a node kept for the token it drew would bias it).
     * p_min: a node the draft gave less than p_min is not expanded. 1 <= b <=
     * SD_MODEL_MAX_BRANCHING; CPU targets only for b > 1 (tree verification). */
    int branching;
    int nodes; /* 1 <= nodes <= SD_MAX_TREE_NODES: a tree's most nodes (b > 1) */
    /* 1 = keep only as many nodes as pay on this machine: the count that maximises (1 + the
     * sum of their chances to be on the accepted path) over the measured cost of a verify
     * forward of that many tokens (sd_cost_curve, measured on the target at the first request),
     * at least one every fourth step; at temperature 0 the most probable nodes, their chances
     * their path probabilities; when sampling, a count fixed before the step's draws, the
     * chances those of reaching each depth measured over the request's steps, a depth not
     * drafted yet judged by the rate of those before it (model_tree.c);
     * 0 = always `nodes` (a chain's k). */
    int size_by_cost;
} sd_draft_params;
#define SD_MODEL_MAX_BRANCHING 8

/* A drafter proposes the draft tokens of speculative decoding; the one speculative loop
 * (sd_generate_speculative) verifies them. A drafter holds only its parameters: one drafter may
 * serve any number of calls, also at once, each keeping its own state. */
typedef struct sd_drafter sd_drafter;

/* Prompt lookup (sd_prompt_lookup). SD_ERR_INVALID_ARG names a parameter out of its range. */
sd_status sd_drafter_prompt_lookup(sd_drafter **out, const sd_prompt_lookup *lookup);

/* A draft model (Leviathan et al. 2023; Chen et al. 2023): `draft`, a smaller model with the
 * same vocabulary and its own KV cache, proposes up to dp->k tokens one at a time (greedily at
 * temperature 0, else sampled from its processed distribution q); the verify step accepts a
 * prefix with the probabilities min(1, p/q), correcting from norm(max(0, p - q)). Both caches
 * roll back to the accepted prefix; when all k are accepted the draft catches up on dk (a tree
 * with dp->branching > 1: the draft's cache keeps the accepted path, compacted). The
 * drafter does not own `draft`, which must outlive it and must not run another call while a
 * generation uses it. At generation: SD_ERR_INVALID_ARG when the draft's vocabulary, device or
 * context length does not fit the target's. */
sd_status sd_drafter_draft_model(sd_drafter **out, sd_model *draft, const sd_draft_params *dp);

/* Self-speculation (early exit, as in LayerSkip, Elhoushi et al. 2024, without its training):
 * the draft is the target's own first n_layers layers followed by its final norm and head, so
 * it needs no weights or cache of its own: its keys/values for those layers are exactly the
 * target's, and the verify forward rewrites them. 1 <= n_layers < the target's layer count (the
 * upper bound checked at generation). */
sd_status sd_drafter_layerskip(sd_drafter **out, int n_layers, const sd_draft_params *dp);

/* Token Recycling (Luo et al. 2024): no draft model and no training. For every token id the
 * drafter keeps the `top` most probable next tokens the target gave after it in the verify
 * steps so far (its logits, whatever the sampling), and each step drafts a tree from that
 * table: the text's last token is the root, a node at depth d (the root at 0) gets the first
 * widths[d] successors of its token as children, breadth first, up to `nodes` nodes and `depth`
 * levels. The children are deterministic (verify.h's tree rule). The table lives as long as the
 * drafter and serves every request on one model, also at once. */
#define SD_RECYCLE_MAX_DEPTH 8
#define SD_RECYCLE_MAX_TOP 16
typedef struct {
    int nodes;                        /* 1 <= nodes <= SD_MAX_TREE_NODES */
    int depth;                        /* 1 <= depth <= SD_RECYCLE_MAX_DEPTH */
    int widths[SD_RECYCLE_MAX_DEPTH]; /* children per node at depth d < depth: 1 .. top */
    int top;                          /* successors kept per token: 1 .. SD_RECYCLE_MAX_TOP */
    /* 1: each step drafts only the template's nodes that pay: those most often accepted so far,
     * while the expected tokens per unit of verify time grow, with the time of a forward of
     * each size measured on the target once (sd_cost_curve, at the first request); where no
     * node pays, one every fourth step. 0: the whole template every step. */
    int adaptive;
    /* 0 .. SD_MAX_DRAFT: prompt lookup's draft of up to this many tokens joins each step's tree
     * as one more branch (sharing the nodes whose tokens the table also proposes); 0: none */
    int lookup;
} sd_token_recycling;

sd_status sd_drafter_token_recycling(sd_drafter **out, const sd_token_recycling *params);

/* Learned heads that draft from the target's own features (model/head.h has their arithmetic):
 * EAGLE-1/2 (Li et al. 2024) and EAGLE-3 (Li et al. 2025), read from a directory holding
 * config.json and model.safetensors or pytorch_model.bin (a PyTorch file is read without torch
 * and without running its pickle), as their authors and vLLM's speculators publish them. */
typedef enum {
    SD_HEAD_EAGLE = 1,  /* EAGLE-1/2: fc [D, 2D], one layer, the target's output head */
    SD_HEAD_EAGLE3 = 3, /* EAGLE-3: fc [D, 3D], the 2D-input midlayer, its own draft vocabulary */
    SD_HEAD_MEDUSA = 4, /* Medusa-1: medusa_lm_head.safetensors or .pt */
} sd_head_kind;
typedef struct sd_head sd_head;

/* Read a head: SD_ERR_IO for a missing file, SD_ERR_FORMAT for a file that is not a head of a
 * known layout (a tensor missing, of the wrong shape, or unknown to it), SD_ERR_UNSUPPORTED for
 * a setting specdec does not compute (each message names the file and the field). */
sd_status sd_head_load(sd_head **out, const char *path);
void sd_head_free(sd_head *head);
/* Replace the head's matrices by Q8_0 copies (ggml's 8-bit blocks, repacked for this CPU's
 * integer tiles): about a quarter of the bytes of F32 and the integer kernels, for a draft
 * that runs several times a step; their logits move by the 8-bit rounding (the output stays
 * exactly the target's whatever the head computes). Matrices whose rows are not whole blocks
 * stay as they are. */
sd_status sd_head_quantize(sd_head *head);
int sd_head_kind_of(const sd_head *head);
/* SD_ERR_INVALID_ARG naming the mismatch when the head was not made for a target of this shape
 * (hidden size, vocabulary, the layers EAGLE-3 reads); SD_ERR_UNSUPPORTED for a CUDA target
 * without a host copy of its embeddings (a dummy model made on the device). */
sd_status sd_head_check(const sd_head *head, const sd_model *target);
/* The head's teacher-forced logits over tokens[0 .. n) (n >= 2): for EAGLE, row t of out
 * (n - 1, V) holds its logits for token t + 2 from the target's features at positions <= t and
 * token t + 1, -inf where a reduced draft vocabulary has no entry; for Medusa, out (heads, n, V)
 * holds head i's logits for token t + 2 + i at row t. window > 0: an EAGLE head attends to
 * its last `window` positions only, as sd_drafter_eagle's window has it draft. Runs the
 * target over the tokens once. */
sd_status sd_head_draft_logits(const sd_head *head, sd_model *target, const int32_t *tokens, int n,
                               int window, float *out);
/* EAGLE drafting: at each step the head extends the text with what the target's last verify
 * gave (its features of the accepted tokens), then grows a tree from the text's last token as
 * dp says (EAGLE-2's dynamic tree for branching > 1, a chain for 1; dp->k is the depth; the
 * nodes are kept as sd_draft_params documents, so sampling stays exact), one head forward per
 * depth. lookup > 0 (at most SD_MAX_DRAFT): prompt lookup beside the head; at a step where the
 * text's last n-gram occurred before (n <= 4), the continuation (up to `lookup` tokens, as
 * deterministic drafts, sized on the measured verify costs by its kind of match's acceptance
 * rate, sd_lookup_rate) is drafted instead of the head's tree when it promises more tokens per
 * unit of time than the head's steps have given so far (their accepted drafts, verify sizes
 * and drafting time); the choice rests on earlier steps alone, so sampling stays exact. 0:
 * off. window > 0: the head attends to its last `window` positions only (a sliding window),
 * so of a longer prompt only the last `window` rows go through the head at the first step; 0:
 * the whole text. The drafter owns `head` from now on (also on failure). Beside a CUDA target
 * the head's layer runs on the target's GPU (SPECDEC_CUDA_HEAD=0: on the CPU), at temperature 0
 * only so far. */
sd_status sd_drafter_eagle(sd_drafter **out, sd_head *head, const sd_draft_params *dp, int lookup,
                           int window);
/* Medusa (Cai et al. 2024): each step, the heads read the target's last hidden state (from the
 * verify forward) and a static tree is filled from their best tokens: node i of `paths` (n_paths
 * of them, path i = paths[start[i] .. start[i] + len[i]), 1 <= len[i] <= the head count) takes
 * rank paths[start[i] + len[i] - 1] of head len[i] - 1's tokens, its parent the path without its
 * last entry (listed before it). The children are deterministic, so the tree rule keeps the
 * output exactly the target's (Medusa's lossy "typical acceptance" is not offered). paths NULL:
 * a default tree of 3 + 3 + 2 per further head nodes (medusa.c). The drafter owns `head` (also on
 * failure). Beside a CUDA target the heads run on its GPU (SPECDEC_CUDA_HEAD=0: on the CPU). */
#define SD_MEDUSA_MAX_RANK 16
sd_status sd_drafter_medusa(sd_drafter **out, sd_head *head, const int32_t *paths,
                            const int32_t *start, const int32_t *len, int n_paths);
/* A learned drafter's head (its owner is the drafter), or NULL for other drafters; Medusa's head
 * count (0 for other heads). */
const sd_head *sd_drafter_head(const sd_drafter *drafter);
int sd_head_medusa_heads(const sd_head *head);

/* The most draft tokens the drafter proposes per step (the length of sd_spec_stats' per-position
 * counts it fills), and its name ("prompt_lookup", "draft_model", "layerskip"). */
int sd_drafter_max_draft(const sd_drafter *drafter);
const char *sd_drafter_name(const sd_drafter *drafter);
/* A tree drafter's verify costs: rel[T - 1] is what a verify forward of T tokens costs over one
 * of 1 token after a text of len tokens, for T = 1 .. the count returned (0 before they are
 * measured, at the first request of an adaptive drafter, or copied from the model's earlier
 * measurement for its present thread count and cache type; measured after texts of several
 * lengths, what a text adds fitted as linear in its length, since attention grows with it;
 * spec/drafter.c). Setting them (n entries, positive and non-decreasing, scaled so the first
 * is 1) replaces the measurement, after any text: for reproducible tree sizes, or a curve
 * measured elsewhere. Not while a request uses the drafter. */
int sd_drafter_costs(const sd_drafter *drafter, int len, float *rel, int cap);
sd_status sd_drafter_set_costs(sd_drafter *drafter, const float *rel, int n);
/* Prompt lookup's memory of earlier requests (the lookup drafter's, and the lookup beside Token
 * Recycling's table and an EAGLE head): tokens > 0 keeps the last `tokens` (at most 2^24) that
 * the drafter's requests generated, shared by its requests under a lock (36 bytes a token), and
 * a step whose text has no match of two or more tokens drafts what followed the text's last 4,
 * 3 or 2 tokens there, up to the end of the output it came from; 0 drops it. Drafters without a
 * lookup keep it and never read it. Not while a request uses the drafter. */
sd_status sd_drafter_set_history(sd_drafter *drafter, int tokens);
/* The fit the measured costs after a long text rest on: of n timings, the seconds add[i] that a
 * text of len[i] more tokens adds to a forward of T[i] tokens, fitted by least squares as
 * len * (b0 + b1 * (T - 1)), with b0 and b1 kept non-negative (b1 = 0 when one size only). */
void sd_verify_cost_fit(const double *len, const int *T, const double *add, int n, double *b0,
                        double *b1);
void sd_drafter_free(sd_drafter *drafter);

/* Speculative decoding: each step the drafter proposes draft tokens, the target scores
 * [last, d1 .. dK] in one forward, the chain rule of verify.h accepts a prefix (exact: at
 * temperature 0 the output is the greedy output token for token; when sampling it is distributed
 * as sampling the processed target distribution), the correction or bonus token is emitted, and
 * the KV cache rolls back to the accepted prefix. Same arguments and stopping rules as
 * sd_generate; stats may be NULL. */
sd_status sd_generate_speculative(int32_t *out, int *n_out, sd_finish_reason *reason,
                                  sd_spec_stats *stats, sd_model *target, const sd_drafter *drafter,
                                  const int32_t *prompt, int n_prompt,
                                  const sd_generate_params *params);

/* ---- sequences: one request decoded a step at a time ------------------------------------------
 *
 * sd_generate and sd_generate_speculative create a sequence and step it to its end. Stepping it
 * yourself gives the thread that owns a request control between steps: to stream the tokens, to
 * notice an interrupt or a cancellation. Sequences of one model may be stepped from several
 * threads at once: the model's scheduler puts the forwards of the steps that are ready together
 * into one forward (its weights read once for all of them) and runs the rest of every step one
 * at a time. The output, and every bit of it, is the same however the steps are driven. */
typedef struct sd_sequence sd_sequence;

/* Checks everything sd_generate(_speculative) checks (drafter NULL: plain decoding; else its
 * target checks too), copies the prompt and the parameters' arrays and allocates the caches;
 * computes nothing. A sequence with max_new_tokens == 0 is created done. While a step runs,
 * the model may run other sequences' steps (in other threads) and nothing else; a draft model
 * nothing else at all. Both must outlive the sequence; the drafter too. params->on_token is
 * called during steps, as in sd_generate, in the thread that runs the step: with sequences
 * stepped from several threads, that may be another of them. */
sd_status sd_sequence_create(sd_sequence **out, sd_model *model, const sd_drafter *drafter,
                             const int32_t *prompt, int n_prompt, const sd_generate_params *params);
/* One step: a part of a long prompt (about 50 ms of it on the CPU), or one
 * token of plain decoding, or one speculative step (draft, verify, accept: one or more tokens).
 * *n_new receives the tokens it appended to the output (possibly 0). After a failed step, or
 * once the sequence is done, a step is an error (SD_ERR_INVALID_ARG). */
sd_status sd_sequence_step(sd_sequence *seq, int *n_new);
/* 1 once generation has ended (a stop rule, or a failed step), else 0. */
int sd_sequence_done(const sd_sequence *seq);
sd_finish_reason sd_sequence_finish_reason(const sd_sequence *seq);
/* The output so far ((*n) tokens, valid until the next step or the free). */
const int32_t *sd_sequence_tokens(const sd_sequence *seq, int *n);
/* With params->logprobs: each output token's log-probability so far ((*n) values) and, with
 * top_logprobs > 0, the most probable ids at each position and their log-probabilities ((*n) x
 * top_logprobs each, row by row, best first; else NULL). Without logprobs all are NULL. Valid
 * until the next step or the free. */
const float *sd_sequence_logprobs(const sd_sequence *seq, int *n, const int32_t **top_ids,
                                  const float **top_lps);
/* How many prompt tokens the sequence took from a finished request's cache (prefix reuse). */
int sd_sequence_reused(const sd_sequence *seq);
/* A speculative sequence's statistics so far (time_total_s since its creation); NULL for plain
 * decoding. */
const sd_spec_stats *sd_sequence_stats(const sd_sequence *seq);
void sd_sequence_free(sd_sequence *seq);

/* ---- benchmarks ---------------------------------------------------------------------------- */

/* Benchmarks only, not a way to decode: the speed of speculative decoding with a drafter the
 * target would accept with probability `alpha` per draft, measured without a trained draft
 * (vLLM's synthetic rejection sampler). Each step drafts k copies of the last token (drafting
 * costs nothing), runs the real verify forward over k + 1 tokens, accepts drafts while the
 * uniforms (seed, synthetic stream, position) are below alpha, and emits them and the argmax
 * of the next row. The tokens in `out` are NOT the model's output: no generation entry point
 * reaches this code. Up to max_new_tokens are produced; stats as sd_generate_speculative's. */
sd_status sd_bench_synthetic(int32_t *out, int *n_out, sd_spec_stats *stats, sd_model *model,
                             const int32_t *prompt, int n_prompt, int max_new_tokens, int k,
                             double alpha, uint64_t seed);

/* Seconds per forward over T tokens (logits for all T, left on the device for a CUDA model)
 * after a `context`-token prefix, mean of iters calls after a warm-up: the verify-cost curve. */
sd_status sd_bench_forward(double *seconds, sd_model *model, int T, int context, int iters);
/* Seconds per pass of the CPU attention over n_layers layers of an f16 cache (each its own
 * keys and values, so a pass reads them from memory as a forward does): T queries per head, a
 * verify batch's mask after n_attn - T slots, on a pool of n_threads, mean of iters passes
 * after a warm-up. */
sd_status sd_bench_attention(double *seconds, int T, int n_attn, int n_heads, int n_kv_heads,
                             int head_dim, int n_layers, int n_threads, int iters);
/* Seconds per device-to-device copy of `bytes` on CUDA device `gpu` (the bandwidth ceiling);
 * SD_ERR_UNSUPPORTED without a CUDA backend. */
sd_status sd_bench_copy(double *seconds, int gpu, size_t bytes, int iters);

/* ---- kernel checks --------------------------------------------------------------------------- */

/* The row kernels, callable on their own so tests and benchmarks can compare them with
 * independent references. `type` is a ggml type id of a format specdec computes with. */

/* Convert n elements (a whole number of blocks) of `type` at `src` (src_bytes long) to f32. */
sd_status sd_dequantize(float *dst, int type, const void *src, size_t src_bytes, int64_t n);

/* Quantize n floats (n a positive multiple of 32) as the integer kernels' activations into
 * dst (dst_bytes long): n int8 quants, then n / 32 f32 scales d, n / 32 f16-rounded d * sum(q),
 * n / 32 unrounded d * sum(q). Ties round to even. */
sd_status sd_quantize_activations(unsigned char *dst, size_t dst_bytes, const float *x, int64_t n);
/* The bytes of n quantized activations (n a multiple of 32). */
size_t sd_quantized_activation_bytes(int64_t n);

/* Which kernel sd_matmul_rows runs. */
typedef enum {
    SD_KERNEL_FORWARD = 0,  /* what the forward pass uses on this CPU (repacked where it repacks) */
    SD_KERNEL_PORTABLE = 1, /* the portable C kernel */
    SD_KERNEL_ROWS = 2      /* this CPU's SIMD kernel over the rows as stored (no repacking) */
} sd_kernel;

/* y (T, nrows) = x (T, n) . W^T for W = nrows rows of n elements of `type` at `w` (w_bytes
 * long), with the kernel `kernel` (an sd_kernel). Quantized formats multiply with activations
 * quantized to 8 bits in blocks of 32, as the forward pass does. */
sd_status sd_matmul_rows(float *y, int type, const void *w, size_t w_bytes, int64_t nrows,
                         int64_t n, const float *x, int T, int kernel);

/* ---- build information ----------------------------------------------------------------------- */

/* SIMD level the kernels use on this machine: "avx2+fma+f16c+avx512vnni+amx" (AMX-INT8 tiles
 * for batches of tokens), "avx2+fma+f16c+avx512vnni", "avx2+fma+f16c" or "scalar". The
 * environment variable SPECDEC_SIMD, read once at the first model load, caps it: "scalar"
 * forces the portable C kernels, "avx2" stops at AVX2, "avx512vnni" before AMX (to compare the
 * kernels with each other, or to rule the wider ones out). */
const char *sd_simd_name(void);
/* One argument of a kernel check: an array (data, bytes; data NULL for None) or a scalar (i or
 * f). */
typedef struct {
    void *data;
    size_t bytes;
    int64_t i; /* integers; 64-bit seeds as their bits */
    double f;
} sd_karg;

/* Run kernel `name` (its CUDA launcher when device is SD_DEVICE_CUDA, else its CPU twin;
 * csrc/check/twins.h lists them with their arguments) on host arrays, which are all copied to the
 * device and back for the GPU. Array sizes are checked against the op's arguments first
 * (SD_ERR_INVALID_ARG); SD_ERR_UNSUPPORTED without a CUDA backend. */
sd_status sd_kernel_run(const char *name, int device, sd_karg *args, int n_args);
/* Name of kernel i (0, 1, ...), NULL past the last. */
const char *sd_kernel_names(int i);

/* 1 when this build was compiled with the CUDA backend sources, else 0. */
int sd_built_with_cuda(void);
/* Only in CUDA builds: the number of CUDA devices visible (0 without a driver or GPU; never
 * fails) and, in *cublas_version, the linked cuBLAS version as major * 1000 + minor. */
int sd_cuda_probe(int *cublas_version);

#ifdef __cplusplus
}
#endif

#endif /* SPECDEC_H */
