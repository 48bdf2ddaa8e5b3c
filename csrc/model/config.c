/* config.c — hyper-parameters from GGUF metadata or a Hugging Face config.json. Every key that
 * changes the arithmetic is either read into sd_config or, when the forward does not implement
 * it, refused with a message naming it: a model never loads and then computes something else.
 * Also RoPE's inverse frequencies under the supported scalings (none, linear, llama3). */
#include "model/config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu/ops_cpu.h" /* SD_MAX_HEAD_DIM */
#include "util/status.h"

#define SD_TWO_PI 6.283185307179586476925286766559

/* ---- architecture and range checks ------------------------------------------------------------
 */

sd_status sd_config_set_arch(sd_config *c, const char *name, size_t len) {
    static const struct {
        const char *name;
        sd_arch arch;
    } known[] = {
        {"llama", SD_ARCH_LLAMA},
        {"mistral", SD_ARCH_LLAMA}, /* the llama graph; its sliding window is read apart */
        {"qwen2", SD_ARCH_QWEN2},
        {"qwen3", SD_ARCH_QWEN3},
        {"gemma3", SD_ARCH_GEMMA3},      /* GGUF */
        {"gemma3_text", SD_ARCH_GEMMA3}, /* Hugging Face's text-only model */
        {"gemma2", SD_ARCH_GEMMA2},
        {"phi3", SD_ARCH_PHI3},
    };
    static const char *const canonical[] = {"llama", "qwen2", "qwen3", "gemma3", "gemma2", "phi3"};
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        if (strlen(known[i].name) == len && memcmp(name, known[i].name, len) == 0) {
            c->arch = known[i].arch;
            snprintf(c->arch_name, sizeof(c->arch_name), "%s", canonical[c->arch]);
            c->has_qkv_bias = c->arch == SD_ARCH_QWEN2;
            c->has_qk_norm = c->arch == SD_ARCH_QWEN3 || c->arch == SD_ARCH_GEMMA3;
            return SD_OK;
        }
    }
    return sd_set_error(SD_ERR_UNSUPPORTED,
                        "unknown architecture '%.*s' (supported: llama, mistral, qwen2, qwen3, "
                        "gemma2, gemma3, phi3)",
                        (int)(len > 64 ? 64 : len), name);
}

static int positive(float v) {
    return v > 0.0f && isfinite(v);
}

int sd_config_is_gemma(const sd_config *c) {
    return c->arch == SD_ARCH_GEMMA2 || c->arch == SD_ARCH_GEMMA3;
}

int sd_config_layer_slides(const sd_config *c, int l) {
    return c->sliding_window > 0 &&
           (c->swa_pattern == 0 || l % c->swa_pattern < c->swa_pattern - 1);
}

sd_status sd_config_check(const sd_config *c) {
    if (c->hidden_size <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->ffn_size <= 0 || c->head_dim <= 0 || c->context_length <= 0 || c->vocab_size <= 0) {
        return sd_set_error(SD_ERR_FORMAT,
                            "invalid hyper-parameters: hidden %d, layers %d, heads %d, kv heads "
                            "%d, ffn %d, head_dim %d, context length %d, vocab %d",
                            c->hidden_size, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_size,
                            c->head_dim, c->context_length, c->vocab_size);
    }
    if (c->n_heads % c->n_kv_heads != 0) {
        return sd_set_error(SD_ERR_FORMAT, "%d attention heads are not a multiple of %d kv heads",
                            c->n_heads, c->n_kv_heads);
    }
    if (c->head_dim % 2 != 0) {
        return sd_set_error(SD_ERR_FORMAT, "head dimension %d is odd; RoPE needs pairs",
                            c->head_dim);
    }
    if (c->head_dim > SD_MAX_HEAD_DIM) {
        return sd_set_error(SD_ERR_UNSUPPORTED, "head dimension %d is larger than the %d supported",
                            c->head_dim, SD_MAX_HEAD_DIM);
    }
    if (!(c->rms_eps > 0.0f && c->rms_eps < 1.0f)) { /* models use 1e-6 to 1e-5 */
        return sd_set_error(SD_ERR_FORMAT, "invalid RMS norm epsilon %g (it must be in (0, 1))",
                            (double)c->rms_eps);
    }
    if (!positive(c->rope_theta)) {
        return sd_set_error(SD_ERR_FORMAT, "invalid RoPE theta %g (it must be finite and > 0)",
                            (double)c->rope_theta);
    }
    if (c->sliding_window < 0 || c->swa_pattern < 0 || c->swa_pattern == 1) {
        return sd_set_error(SD_ERR_FORMAT, "sliding window %d or its layer pattern %d is invalid",
                            c->sliding_window, c->swa_pattern);
    }
    if ((c->swa_pattern > 0 && !positive(c->rope_theta_local)) || c->attn_scale < 0.0f ||
        !isfinite(c->attn_scale) || c->final_softcap < 0.0f || !isfinite(c->final_softcap) ||
        c->attn_softcap < 0.0f || !isfinite(c->attn_softcap)) {
        return sd_set_error(SD_ERR_FORMAT,
                            "invalid local RoPE base %g, attention scale %g, final soft-cap %g or "
                            "attention soft-cap %g",
                            (double)c->rope_theta_local, (double)c->attn_scale,
                            (double)c->final_softcap, (double)c->attn_softcap);
    }
    if ((c->rope_scaling == SD_ROPE_LINEAR || c->rope_scaling == SD_ROPE_LLAMA3) &&
        !positive(c->rope_factor)) {
        return sd_set_error(SD_ERR_FORMAT, "RoPE scaling factor %g must be > 0",
                            (double)c->rope_factor);
    }
    if (c->rope_scaling == SD_ROPE_LLAMA3 &&
        (!positive(c->rope_low_freq_factor) ||
         !(c->rope_high_freq_factor > c->rope_low_freq_factor) ||
         !isfinite(c->rope_high_freq_factor) || c->rope_original_context <= 0)) {
        return sd_set_error(SD_ERR_FORMAT,
                            "llama3 RoPE scaling needs low_freq_factor > 0, high_freq_factor > "
                            "low_freq_factor and original_max_position_embeddings > 0 (got %g, "
                            "%g, %d)",
                            (double)c->rope_low_freq_factor, (double)c->rope_high_freq_factor,
                            c->rope_original_context);
    }
    if (c->rope_scaling < SD_ROPE_DEFAULT || c->rope_scaling > SD_ROPE_FACTORS) {
        return sd_set_error(SD_ERR_INVALID_ARG, "unknown RoPE scaling %d", c->rope_scaling);
    }
    return SD_OK;
}

void sd_config_rope_freq(double *inv, const sd_config *c, const float *factors) {
    const double factor = c->rope_factor, low = c->rope_low_freq_factor;
    const double high = c->rope_high_freq_factor, old = c->rope_original_context;
    for (int i = 0; i < c->head_dim / 2; i++) {
        double f = pow((double)c->rope_theta, -2.0 * i / c->head_dim);
        if (c->rope_scaling == SD_ROPE_LINEAR) {
            f /= factor;
        } else if (c->rope_scaling == SD_ROPE_FACTORS) {
            f /= (double)factors[i];
        } else if (c->rope_scaling == SD_ROPE_LLAMA3) {
            /* long wavelengths (low frequencies) are interpolated, short ones kept, the band
             * between blended linearly in old / wavelength */
            const double wavelen = SD_TWO_PI / f;
            if (wavelen > old / low) {
                f /= factor;
            } else if (wavelen >= old / high) {
                const double smooth = (old / wavelen - low) / (high - low);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
        }
        inv[i] = f;
    }
}

/* ---- GGUF ------------------------------------------------------------------------------------ */

static int gguf_int(const sd_gguf *g, const sd_config *c, const char *suffix, int64_t *v) {
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", c->arch_name, suffix);
    return sd_gguf_get_int(g, key, v);
}

static int gguf_float(const sd_gguf *g, const sd_config *c, const char *suffix, double *v) {
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", c->arch_name, suffix);
    return sd_gguf_get_float(g, key, v);
}

/* The "<arch>." keys read as integers and as numbers: one stored with another type (a string,
 * a boolean, an array; a float where an integer belongs) is refused by name, where the readers
 * above would take it for absent and put a default in its place. */
static sd_status check_gguf_key_types(const sd_gguf *g, const sd_config *c) {
    static const char *const ints[] = {"embedding_length",
                                       "block_count",
                                       "feed_forward_length",
                                       "attention.head_count",
                                       "context_length",
                                       "attention.head_count_kv",
                                       "attention.key_length",
                                       "attention.value_length",
                                       "rope.dimension_count",
                                       "attention.sliding_window",
                                       "attention.sliding_window_pattern",
                                       "vocab_size"};
    static const char *const floats[] = {
        "rope.freq_base",        "rope.freq_base_swa", "attention.layer_norm_rms_epsilon",
        "rope.scaling.factor",   "rope.scale_linear",  "final_logit_softcapping",
        "attn_logit_softcapping"};
    const size_t n_ints = sizeof(ints) / sizeof(ints[0]);
    for (size_t i = 0; i < n_ints + sizeof(floats) / sizeof(floats[0]); i++) {
        const int integer = i < n_ints;
        char key[128];
        snprintf(key, sizeof(key), "%s.%s", c->arch_name, integer ? ints[i] : floats[i - n_ints]);
        const sd_gguf_kv *kv = sd_gguf_find(g, key);
        if (kv == NULL) {
            continue;
        }
        const sd_gguf_kind kind = sd_gguf_scalar_size(kv->type) > 0
                                      ? sd_gguf_scalar_at(kv->type, kv->value).kind
                                      : SD_GGUF_KIND_NONE;
        const int ok = kind == SD_GGUF_KIND_INT || kind == SD_GGUF_KIND_UINT ||
                       (!integer && kind == SD_GGUF_KIND_FLOAT);
        if (!ok) {
            static const char *const names[] = {"u8",  "i8",  "u16",  "i16",    "u32",
                                                "i32", "f32", "bool", "string", "array",
                                                "u64", "i64", "f64"};
            return sd_set_error(SD_ERR_FORMAT, "metadata '%s' must be %s, got type %s", key,
                                integer ? "an integer" : "a number",
                                kv->type < sizeof(names) / sizeof(names[0]) ? names[kv->type]
                                                                            : "unknown");
        }
    }
    return SD_OK;
}

/* Keys whose presence (with other than the neutral value) changes the arithmetic in ways the
 * forward does not implement, unless the architecture reads them. */
#define GEMMA2 (1u << SD_ARCH_GEMMA2)
#define GEMMA3 (1u << SD_ARCH_GEMMA3)
typedef enum { NEUTRAL_ABSENT, NEUTRAL_ZERO, NEUTRAL_ONE, NEUTRAL_TRUE } neutral;

static const struct {
    const char *suffix;
    neutral ok;
    const char *what;
    unsigned reads; /* the architectures that read this key themselves (GEMMA2 | GEMMA3) */
} g_gguf_refused[] = {
    {"attn_logit_softcapping", NEUTRAL_ZERO, "attention logit soft-capping", GEMMA2},
    {"final_logit_softcapping", NEUTRAL_ZERO, "final logit soft-capping", GEMMA2 | GEMMA3},
    {"attention.scale", NEUTRAL_ABSENT, "a custom attention scale", 0},
    {"embedding_scale", NEUTRAL_ONE, "embedding scaling", 0},
    {"logit_scale", NEUTRAL_ONE, "logit scaling", 0},
    {"residual_scale", NEUTRAL_ONE, "residual scaling", 0},
    {"expert_count", NEUTRAL_ZERO, "mixture of experts", 0},
    {"attention.clamp_kqv", NEUTRAL_ZERO, "clamping of q/k/v", 0},
    {"attention.causal", NEUTRAL_TRUE, "non-causal attention", 0},
    {"attention.layer_norm_epsilon", NEUTRAL_ABSENT, "LayerNorm (specdec has RMSNorm only)", 0},
    {"rope.dimension_sections", NEUTRAL_ABSENT, "multimodal RoPE sections", 0},
    {"rope.freq_base_swa", NEUTRAL_ABSENT, "a separate RoPE base for sliding-window layers",
     GEMMA2 | GEMMA3},
    {"attention.sliding_window_pattern", NEUTRAL_ABSENT, "sliding windows on some layers only",
     GEMMA2 | GEMMA3},
    {"rope.scaling.attn_factor", NEUTRAL_ONE, "RoPE attention factor", 0},
    {"rope.scaling.alpha", NEUTRAL_ZERO, "NTK-alpha RoPE scaling", 0},
};

static sd_status refuse_gguf_keys(const sd_gguf *g, const sd_config *c) {
    for (size_t i = 0; i < sizeof(g_gguf_refused) / sizeof(g_gguf_refused[0]); i++) {
        char key[128];
        snprintf(key, sizeof(key), "%s.%s", c->arch_name, g_gguf_refused[i].suffix);
        const sd_gguf_kv *kv = sd_gguf_find(g, key);
        if (kv == NULL || (g_gguf_refused[i].reads & (1u << c->arch))) {
            continue;
        }
        double v = 0.0;
        const int num = sd_gguf_get_float(g, key, &v); /* numbers and booleans */
        int fine = 0;
        switch (g_gguf_refused[i].ok) {
        case NEUTRAL_ABSENT: fine = 0; break;
        case NEUTRAL_ZERO: fine = num && v == 0.0; break;
        case NEUTRAL_ONE: fine = num && v == 1.0; break;
        case NEUTRAL_TRUE: fine = num && v != 0.0; break;
        }
        if (!fine) {
            return sd_set_error(SD_ERR_UNSUPPORTED, "metadata '%s' (%s) is not supported", key,
                                g_gguf_refused[i].what);
        }
    }
    return SD_OK;
}

/* RoPE scaling as llama.cpp reads it: rope.scaling.type (default linear when a factor is
 * given), rope.scaling.factor (or the older rope.scale_linear), and rope_freqs.weight. */
static sd_status rope_from_gguf(sd_config *c, const sd_gguf *g) {
    char key[128];
    size_t len = 0;
    snprintf(key, sizeof(key), "%s.rope.scaling.type", c->arch_name);
    const char *type = sd_gguf_get_str(g, key, &len);
    double factor = 0.0;
    if (!gguf_float(g, c, "rope.scaling.factor", &factor)) {
        gguf_float(g, c, "rope.scale_linear", &factor);
    }
    const int is_none = type != NULL && len == 4 && memcmp(type, "none", 4) == 0;
    const int is_linear = type == NULL || (len == 6 && memcmp(type, "linear", 6) == 0);
    if (type != NULL && !is_none && !is_linear) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "metadata '%s' = '%.*s' is not supported (supported: none, linear)",
                            key, (int)(len > 32 ? 32 : len), type);
    }
    if (is_none && factor != 0.0 && factor != 1.0) { /* llama.cpp would still scale by it */
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "metadata '%s.rope.scaling.factor' = %g with scaling type none is "
                            "ambiguous and not supported",
                            c->arch_name, factor);
    }
    if (is_linear && factor != 0.0 && factor != 1.0) { /* llama.cpp: freq_scale = 1 / factor */
        c->rope_scaling = SD_ROPE_LINEAR;
        c->rope_factor = (float)factor;
    } else if (type != NULL && is_linear && factor == 0.0) {
        return sd_set_error(SD_ERR_FORMAT,
                            "metadata '%s' is linear but '%s.rope.scaling.factor' "
                            "is missing or 0",
                            key, c->arch_name);
    }
    if (sd_gguf_find_tensor(g, "rope_freqs.weight") != NULL) {
        if (c->rope_scaling != SD_ROPE_DEFAULT) {
            return sd_set_error(SD_ERR_UNSUPPORTED,
                                "rope_freqs.weight together with linear RoPE scaling (factor %g) "
                                "is not supported",
                                factor);
        }
        c->rope_scaling = SD_ROPE_FACTORS;
    }
    return SD_OK;
}

/* Gemma 2 and 3 as llama.cpp reads them: a window on layers l % pattern < pattern - 1 (pattern
 * 6 for Gemma 3, 2 for Gemma 2, unless the file says; Gemma 2's window 4096 unless the file
 * says), those layers' own unscaled RoPE base (Gemma 3: 10000, Gemma 2: the global one, unless
 * the file says), the final soft-cap (optional in Gemma 3, Gemma 2: 30 unless the file says),
 * Gemma 2's attention soft-cap (50 unless the file says), and the attention scale 1/sqrt(Dh), or
 * 1/sqrt(D/H) for the largest models (Gemma 3 with 62 layers, Gemma 2 with 46; llama.cpp ignores
 * query_pre_attn_scalar, which equals one of the two in every released model). */
static sd_status gemma_from_gguf(sd_config *c, const sd_gguf *g) {
    const int g2 = c->arch == SD_ARCH_GEMMA2;
    int64_t v = g2 ? 4096 : 0;
    double f = 0.0;
    gguf_int(g, c, "attention.sliding_window", &v);
    if (g2 && v <= 0) { /* llama.cpp would still slide its local layers */
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "metadata '%s.attention.sliding_window' = %lld: a gemma2 model "
                            "without a window is not supported",
                            c->arch_name, (long long)v);
    }
    if (v > 0) {
        c->sliding_window = v < (1 << 30) ? (int)v : (1 << 30);
        c->swa_pattern = g2 ? 2 : 6;
        char key[128];
        snprintf(key, sizeof(key), "%s.attention.sliding_window_pattern", c->arch_name);
        const sd_gguf_kv *kv = sd_gguf_find(g, key);
        if (kv != NULL && !(gguf_int(g, c, "attention.sliding_window_pattern", &v) && v > 1 &&
                            v <= c->n_layers + 1)) {
            return sd_set_error(SD_ERR_UNSUPPORTED,
                                "metadata '%s' is supported as one layer period > 1 only", key);
        }
        c->swa_pattern = kv != NULL ? (int)v : c->swa_pattern;
        c->rope_theta_local = gguf_float(g, c, "rope.freq_base_swa", &f) ? (float)f
                              : g2                                       ? c->rope_theta
                                                                         : 10000.0f;
    }
    c->final_softcap = gguf_float(g, c, "final_logit_softcapping", &f) ? (float)f
                       : g2                                            ? 30.0f
                                                                       : 0.0f;
    if (g2) {
        c->attn_softcap = gguf_float(g, c, "attn_logit_softcapping", &f) ? (float)f : 50.0f;
    }
    const int largest = c->n_layers == (g2 ? 46 : 62);
    c->attn_scale = 1.0f / sqrtf((float)(largest ? c->hidden_size / c->n_heads : c->head_dim));
    return SD_OK;
}

sd_status sd_config_from_gguf(sd_config *c, const sd_gguf *g) {
    size_t len = 0;
    const char *arch = sd_gguf_get_str(g, "general.architecture", &len);
    if (arch == NULL) {
        return sd_set_error(SD_ERR_FORMAT, "missing metadata 'general.architecture'");
    }
    if (memchr(arch, '\0', len) != NULL) { /* a message would show only its part before */
        return sd_set_error(SD_ERR_FORMAT, "metadata 'general.architecture' holds a NUL byte");
    }
    SD_TRY(sd_config_set_arch(c, arch, len));
    /* GGUF keys use the architecture's own name */
    snprintf(c->arch_name, sizeof(c->arch_name), "%.*s", (int)len, arch);
    SD_TRY(check_gguf_key_types(g, c));
    struct {
        const char *suffix;
        int *dst;
    } req[] = {
        {"embedding_length", &c->hidden_size},  {"block_count", &c->n_layers},
        {"feed_forward_length", &c->ffn_size},  {"attention.head_count", &c->n_heads},
        {"context_length", &c->context_length},
    };
    for (size_t i = 0; i < sizeof(req) / sizeof(req[0]); i++) {
        int64_t v = 0;
        if (!gguf_int(g, c, req[i].suffix, &v)) {
            return sd_set_error(SD_ERR_FORMAT, "missing metadata '%s.%s'", c->arch_name,
                                req[i].suffix);
        }
        if (v <= 0 || v > (1 << 30)) {
            return sd_set_error(SD_ERR_FORMAT, "metadata '%s.%s' = %lld is out of range",
                                c->arch_name, req[i].suffix, (long long)v);
        }
        *req[i].dst = (int)v;
    }
    int64_t v = 0;
    c->n_kv_heads = gguf_int(g, c, "attention.head_count_kv", &v) ? (int)v : c->n_heads;
    c->head_dim = gguf_int(g, c, "attention.key_length", &v) ? (int)v : c->hidden_size / c->n_heads;
    if (gguf_int(g, c, "attention.value_length", &v) && v != c->head_dim) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "metadata '%s.attention.value_length' = %lld differs from the key "
                            "length %d, which is not supported",
                            c->arch_name, (long long)v, c->head_dim);
    }
    if (gguf_int(g, c, "rope.dimension_count", &v) && v != c->head_dim) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "partial rotary embeddings (rope.dimension_count %lld of head "
                            "dimension %d) are not supported",
                            (long long)v, c->head_dim);
    }
    double f = 0.0;
    c->rope_theta = gguf_float(g, c, "rope.freq_base", &f) ? (float)f : 10000.0f;
    c->rms_eps = gguf_float(g, c, "attention.layer_norm_rms_epsilon", &f) ? (float)f : 1e-5f;
    /* llama.cpp's llama graph ignores this key (its converter does not write Mistral's window),
     * and llama.cpp turns Phi-3's off (its converter writes it); where a file states one, specdec
     * computes the model it describes, as transformers does. For qwen2/qwen3 HF applies a window
     * only on some layers, which the file cannot say: refused. */
    if (sd_config_is_gemma(c)) {
        SD_TRY(gemma_from_gguf(c, g));
    } else if (gguf_int(g, c, "attention.sliding_window", &v) && v > 0) {
        if (c->arch != SD_ARCH_LLAMA && c->arch != SD_ARCH_PHI3 && v < c->context_length) {
            return sd_set_error(SD_ERR_UNSUPPORTED,
                                "metadata '%s.attention.sliding_window' = %lld (a window in a %s "
                                "model) is not supported",
                                c->arch_name, (long long)v, c->arch_name);
        }
        c->sliding_window = v < (1 << 30) ? (int)v : (1 << 30);
    }
    SD_TRY(refuse_gguf_keys(g, c));
    SD_TRY(rope_from_gguf(c, g));
    if (sd_gguf_find_tensor(g, "rope_factors_long.weight") != NULL ||
        sd_gguf_find_tensor(g, "rope_factors_short.weight") != NULL) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "tensors rope_factors_long/rope_factors_short (LongRoPE, the "
                            "128k-context Phi-3 models) are not supported");
    }
    const sd_tensor_info *emb = sd_gguf_find_tensor(g, "token_embd.weight");
    if (emb == NULL) {
        return sd_set_error(SD_ERR_FORMAT, "missing tensor 'token_embd.weight'");
    }
    c->vocab_size = emb->n_dims == 2 && emb->shape[0] < (1 << 30) ? (int)emb->shape[0] : 0;
    int64_t stated = 0;
    if (gguf_int(g, c, "vocab_size", &stated) && stated != c->vocab_size) {
        return sd_set_error(SD_ERR_FORMAT,
                            "metadata '%s.vocab_size' = %lld disagrees with token_embd.weight's %d "
                            "rows",
                            c->arch_name, (long long)stated, c->vocab_size);
    }
    /* llama.cpp's converter permutes llama q/k rows for adjacent-pair rotation; other
     * architectures keep rotate-half (NeoX) pairing. */
    c->rope_neox = c->arch != SD_ARCH_LLAMA;
    c->tied_embeddings = sd_gguf_find_tensor(g, "output.weight") == NULL;
    return sd_config_check(c);
}

/* ---- Hugging Face config.json ------------------------------------------------------------------
 */

/* The name of a JSON value's type, for messages. */
static const char *json_type_name(const sd_json *v) {
    switch (v->type) {
    case SD_JSON_NULL: return "null";
    case SD_JSON_BOOL: return "a boolean";
    case SD_JSON_NUMBER: return v->is_integer ? "an integer" : "a number";
    case SD_JSON_STRING: return "a string";
    case SD_JSON_ARRAY: return "an array";
    case SD_JSON_OBJECT: return "an object";
    }
    return "a value";
}

static int is_null(const sd_json *v) {
    return v == NULL || v->type == SD_JSON_NULL;
}

sd_status sd_config_json_number(const sd_json *obj, const char *key, double *dst, int *found,
                                const char *path) {
    const sd_json *v = sd_json_get(obj, key);
    *found = 0;
    if (is_null(v)) {
        return SD_OK;
    }
    if (v->type != SD_JSON_NUMBER || !sd_json_get_double(obj, key, dst)) {
        return sd_set_error(SD_ERR_FORMAT, "%s: \"%s\" must be a number, got %s", path, key,
                            json_type_name(v));
    }
    *found = 1;
    return SD_OK;
}

sd_status sd_config_json_bool(const sd_json *obj, const char *key, int *dst, int *found,
                              const char *path) {
    const sd_json *v = sd_json_get(obj, key);
    *found = 0;
    if (is_null(v)) {
        return SD_OK;
    }
    if (v->type != SD_JSON_BOOL) {
        return sd_set_error(SD_ERR_FORMAT, "%s: \"%s\" must be true or false, got %s", path, key,
                            json_type_name(v));
    }
    *dst = v->boolean;
    *found = 1;
    return SD_OK;
}

/* A number of config.json into *dst (a float), or `dflt` when absent or null. */
static sd_status json_float(const sd_json *cfg, const char *key, float *dst, float dflt,
                            const char *path) {
    double f = 0.0;
    int found = 0;
    SD_TRY(sd_config_json_number(cfg, key, &f, &found, path));
    *dst = found ? (float)f : dflt;
    return SD_OK;
}

static sd_status json_int(const sd_json *cfg, const char *key, int *dst, int required,
                          const char *path) {
    int64_t v = 0;
    if (!sd_json_get_int(cfg, key, &v)) {
        const sd_json *given = sd_json_get(cfg, key);
        if (given != NULL && (required || !is_null(given))) {
            return sd_set_error(SD_ERR_FORMAT, "%s: \"%s\" must be an integer, got %s", path, key,
                                json_type_name(given));
        }
        if (required) {
            return sd_set_error(SD_ERR_FORMAT, "%s: missing integer \"%s\"", path, key);
        }
        return SD_OK;
    }
    if (v <= 0 || v > (1 << 30)) {
        return sd_set_error(SD_ERR_FORMAT, "%s: \"%s\" = %lld is out of range", path, key,
                            (long long)v);
    }
    *dst = (int)v;
    return SD_OK;
}

/* Whether v is the neutral value of a setting: absent/null, false, 0 or 1 as `ok` says. */
static int json_neutral(const sd_json *v, neutral ok) {
    if (is_null(v)) {
        return 1;
    }
    switch (ok) {
    case NEUTRAL_ABSENT: return 0;
    case NEUTRAL_ZERO:
        return (v->type == SD_JSON_BOOL && !v->boolean) ||
               (v->type == SD_JSON_NUMBER && v->number == 0.0);
    case NEUTRAL_ONE: return v->type == SD_JSON_NUMBER && v->number == 1.0;
    case NEUTRAL_TRUE: return v->type == SD_JSON_BOOL && v->boolean;
    }
    return 0;
}

static const struct {
    const char *key;
    neutral ok;
    const char *what;
    unsigned reads; /* the architectures that read this key themselves */
} g_hf_refused[] = {
    {"mlp_bias", NEUTRAL_ZERO, "MLP biases", 0},
    {"partial_rotary_factor", NEUTRAL_ONE, "partial rotary embeddings", 0},
    {"attn_logit_softcapping", NEUTRAL_ABSENT, "attention logit soft-capping", GEMMA2},
    {"final_logit_softcapping", NEUTRAL_ABSENT, "final logit soft-capping", GEMMA2 | GEMMA3},
    {"query_pre_attn_scalar", NEUTRAL_ABSENT, "a custom attention scale", GEMMA2 | GEMMA3},
    {"attention_multiplier", NEUTRAL_ABSENT, "a custom attention scale", 0},
    {"embedding_multiplier", NEUTRAL_ONE, "embedding scaling", 0},
    {"logits_scaling", NEUTRAL_ONE, "logit scaling", 0},
    {"residual_multiplier", NEUTRAL_ONE, "residual scaling", 0},
    {"num_local_experts", NEUTRAL_ZERO, "mixture of experts", 0},
    {"num_experts", NEUTRAL_ZERO, "mixture of experts", 0},
    {"quantization_config", NEUTRAL_ABSENT, "quantized Hugging Face weights", 0},
    {"is_causal", NEUTRAL_TRUE, "non-causal attention", 0},
    {"use_qk_norm", NEUTRAL_ZERO, "q/k norms in this architecture", 0},
    {"rope_local_base_freq", NEUTRAL_ABSENT, "a separate RoPE base for local layers", GEMMA3},
    {"use_bidirectional_attention", NEUTRAL_ZERO, "bidirectional attention", 0},
};

/* Every key of the table, the activation, the attention bias and the layer types. */
static sd_status refuse_hf_keys(const sd_config *c, const sd_json *cfg, const char *path) {
    const int gemma = sd_config_is_gemma(c);
    for (size_t i = 0; i < sizeof(g_hf_refused) / sizeof(g_hf_refused[0]); i++) {
        const sd_json *v = sd_json_get(cfg, g_hf_refused[i].key);
        if (!(g_hf_refused[i].reads & (1u << c->arch)) && !json_neutral(v, g_hf_refused[i].ok)) {
            return sd_set_error(SD_ERR_UNSUPPORTED, "%s: \"%s\" (%s) is not supported", path,
                                g_hf_refused[i].key, g_hf_refused[i].what);
        }
    }
    static const char *const act_keys[] = {"hidden_act", "hidden_activation"};
    const char *act = gemma ? "gelu_pytorch_tanh" : "silu"; /* GeGLU (tanh GELU) or SwiGLU */
    for (int i = 0; i < 2; i++) {
        const sd_json *v = sd_json_get(cfg, act_keys[i]);
        if (!is_null(v) && (v->type != SD_JSON_STRING || strcmp(v->string, act) != 0)) {
            return sd_set_error(SD_ERR_UNSUPPORTED,
                                "%s: \"%s\" = %s%s%s is not supported (a %s model's MLP needs "
                                "\"%s\")",
                                path, act_keys[i], v->type == SD_JSON_STRING ? "\"" : "",
                                v->type == SD_JSON_STRING ? v->string : "(not a string)",
                                v->type == SD_JSON_STRING ? "\"" : "", c->arch_name, act);
        }
    }
    /* qwen2's q/k/v biases are part of the architecture (HF reads no such key for it) */
    if (c->arch != SD_ARCH_QWEN2 &&
        !json_neutral(sd_json_get(cfg, "attention_bias"), NEUTRAL_ZERO)) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "%s: \"attention_bias\" (biases of q/k/v/o in a %s model) is not "
                            "supported",
                            path, c->arch_name);
    }
    const sd_json *lt = sd_json_get(cfg, "layer_types");
    if (!is_null(lt) && !gemma) { /* gemma's are read by gemma_from_hf */
        if (lt->type != SD_JSON_ARRAY || lt->n != (size_t)c->n_layers) {
            return sd_set_error(SD_ERR_FORMAT, "%s: \"layer_types\" is not an array of %d", path,
                                c->n_layers);
        }
        for (size_t i = 0; i < lt->n; i++) {
            const sd_json *e = &lt->items[i];
            if (e->type != SD_JSON_STRING || strcmp(e->string, "full_attention") != 0) {
                return sd_set_error(SD_ERR_UNSUPPORTED,
                                    "%s: \"layer_types\"[%zu] = %s is not supported (only "
                                    "\"full_attention\" layers)",
                                    path, i, e->type == SD_JSON_STRING ? e->string : "?");
            }
        }
    }
    return SD_OK;
}

/* RoPE settings of one object (rope_parameters or rope_scaling) into c. Keys other than the
 * ones its type reads are refused, so nothing in it goes unread. */
static sd_status rope_from_json(sd_config *c, const sd_json *rp, const char *field,
                                const char *path) {
    if (rp->type != SD_JSON_OBJECT) {
        return sd_set_error(SD_ERR_FORMAT, "%s: \"%s\" is not an object", path, field);
    }
    const char *type = sd_json_get_string(rp, "rope_type");
    type = type != NULL ? type : sd_json_get_string(rp, "type");
    type = type != NULL ? type : "default";
    static const char *const llama3_keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                              "original_max_position_embeddings"};
    int n_keys = 0; /* how many of llama3_keys this type reads */
    if (strcmp(type, "default") == 0) {
        c->rope_scaling = SD_ROPE_DEFAULT;
    } else if (strcmp(type, "linear") == 0) {
        c->rope_scaling = SD_ROPE_LINEAR;
        n_keys = 1;
    } else if (strcmp(type, "llama3") == 0) {
        c->rope_scaling = SD_ROPE_LLAMA3;
        n_keys = 4;
    } else {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "%s: \"%s\" of type \"%s\" is not supported (supported: default, "
                            "linear, llama3)",
                            path, field, type);
    }
    double v[4] = {0, 0, 0, 0};
    for (int i = 0; i < n_keys; i++) {
        if (!sd_json_get_double(rp, llama3_keys[i], &v[i])) {
            return sd_set_error(SD_ERR_FORMAT, "%s: \"%s\" of type \"%s\" has no number \"%s\"",
                                path, field, type, llama3_keys[i]);
        }
    }
    c->rope_factor = (float)v[0];
    c->rope_low_freq_factor = (float)v[1];
    c->rope_high_freq_factor = (float)v[2];
    c->rope_original_context = v[3] >= 1.0 && v[3] < (double)(1 << 30) ? (int)v[3] : 0;
    double theta = 0.0;
    int has_theta = 0;
    SD_TRY(sd_config_json_number(rp, "rope_theta", &theta, &has_theta, path));
    if (has_theta) {
        c->rope_theta = (float)theta;
    }
    for (size_t k = 0; k < rp->n; k++) {
        const char *key = rp->keys[k];
        int known =
            strcmp(key, "rope_type") == 0 || strcmp(key, "type") == 0 ||
            strcmp(key, "rope_theta") == 0 ||
            (strcmp(key, "partial_rotary_factor") == 0 && json_neutral(&rp->items[k], NEUTRAL_ONE));
        for (int i = 0; i < n_keys && !known; i++) {
            known = strcmp(key, llama3_keys[i]) == 0;
        }
        if (!known) {
            return sd_set_error(SD_ERR_UNSUPPORTED,
                                "%s: \"%s\".\"%s\" is not supported for RoPE type \"%s\"", path,
                                field, key, type);
        }
    }
    return SD_OK;
}

/* RoPE from rope_parameters (transformers >= 5) or rope_scaling (before 5); when both are
 * given they must say the same. */
static sd_status rope_from_hf(sd_config *c, const sd_json *cfg, const char *path) {
    static const char *const fields[] = {"rope_parameters", "rope_scaling"};
    int done = 0;
    for (int i = 0; i < 2; i++) {
        const sd_json *rp = sd_json_get(cfg, fields[i]);
        if (is_null(rp)) {
            continue;
        }
        sd_config t = *c;
        SD_TRY(rope_from_json(&t, rp, fields[i], path));
        if (done &&
            (t.rope_scaling != c->rope_scaling || t.rope_factor != c->rope_factor ||
             t.rope_theta != c->rope_theta || t.rope_low_freq_factor != c->rope_low_freq_factor ||
             t.rope_high_freq_factor != c->rope_high_freq_factor ||
             t.rope_original_context != c->rope_original_context)) {
            return sd_set_error(SD_ERR_FORMAT,
                                "%s: \"rope_parameters\" and \"rope_scaling\" disagree", path);
        }
        *c = t;
        done = 1;
    }
    return SD_OK;
}

/* The sliding window: Mistral's and Phi-3's "sliding_window" hold on every layer; qwen2/qwen3 apply
 * one only with "use_sliding_window" (and then on some layers: refused). Llama has none. */
static sd_status window_from_hf(sd_config *c, const sd_json *cfg, const char *path,
                                const char *mt) {
    int64_t window = 0;
    const int has_window = sd_json_get_int(cfg, "sliding_window", &window) && window > 0;
    const sd_json *sw = sd_json_get(cfg, "sliding_window");
    if (!is_null(sw) && !has_window) {
        return sd_set_error(SD_ERR_FORMAT, "%s: \"sliding_window\" is not a positive integer",
                            path);
    }
    if (strcmp(mt, "mistral") == 0 || strcmp(mt, "phi3") == 0) { /* on every layer */
        c->sliding_window = has_window ? (window < (1 << 30) ? (int)window : 1 << 30) : 0;
        return SD_OK;
    }
    int use = 0, said = 0;
    SD_TRY(sd_config_json_bool(cfg, "use_sliding_window", &use, &said, path));
    if (use && has_window && window < c->context_length) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "%s: \"use_sliding_window\" (a window of %lld on some layers of a %s "
                            "model) is not supported",
                            path, (long long)window, mt);
    }
    return SD_OK;
}

/* The period n of layer types that slide on l % n < n - 1: from "layer_types" when given (it
 * must follow such a period, or have no full layer: n = 0), else "sliding_window_pattern". */
static sd_status gemma_pattern(sd_config *c, const sd_json *cfg, const char *path) {
    const sd_json *lt = sd_json_get(cfg, "layer_types");
    int64_t n = c->arch == SD_ARCH_GEMMA2 ? 2 : 6; /* Gemma2Config's, Gemma3TextConfig's */
    static const char *const pattern_keys[] = {"sliding_window_pattern", "_sliding_window_pattern"};
    for (int i = 1; i >= 0; i--) { /* the first when both are given */
        const sd_json *v = sd_json_get(cfg, pattern_keys[i]);
        if (!is_null(v) && !sd_json_get_int(cfg, pattern_keys[i], &n)) {
            return sd_set_error(SD_ERR_FORMAT, "%s: \"%s\" must be an integer, got %s", path,
                                pattern_keys[i], json_type_name(v));
        }
    }
    if (!is_null(lt)) {
        if (lt->type != SD_JSON_ARRAY || lt->n != (size_t)c->n_layers) {
            return sd_set_error(SD_ERR_FORMAT, "%s: \"layer_types\" is not an array of %d", path,
                                c->n_layers);
        }
        n = 0;
        for (size_t i = 0; i < lt->n && n == 0; i++) {
            const char *t = lt->items[i].type == SD_JSON_STRING ? lt->items[i].string : "";
            n = strcmp(t, "full_attention") == 0 ? (int64_t)i + 1 : 0;
        }
        for (size_t i = 0; i < lt->n; i++) {
            const char *t = lt->items[i].type == SD_JSON_STRING ? lt->items[i].string : "";
            const int slides = n == 0 || (int64_t)i % n < n - 1;
            if (strcmp(t, slides ? "sliding_attention" : "full_attention") != 0) {
                return sd_set_error(SD_ERR_UNSUPPORTED,
                                    "%s: \"layer_types\"[%zu] = \"%s\" breaks the pattern of "
                                    "%lld (only periodic local/global layers are supported)",
                                    path, i, t, (long long)n);
            }
        }
    }
    if (n < 0 || n == 1 || n > (1 << 20)) {
        return sd_set_error(SD_ERR_UNSUPPORTED, "%s: sliding window pattern %lld is not supported",
                            path, (long long)n);
    }
    c->swa_pattern = (int)n;
    return SD_OK;
}

/* A soft-cap of config.json: `dflt` (the config class's default) when the key is absent, none
 * (0) when null. */
static sd_status softcap_from_hf(float *cap, const sd_json *cfg, const char *key, float dflt,
                                 const char *path) {
    const sd_json *v = sd_json_get(cfg, key);
    double f = 0.0;
    *cap = v == NULL ? dflt : 0.0f;
    if (!is_null(v)) {
        if (!sd_json_get_double(cfg, key, &f) || !(f > 0.0)) {
            return sd_set_error(SD_ERR_FORMAT, "%s: \"%s\" must be a number > 0 or null", path,
                                key);
        }
        *cap = (float)f;
    }
    return SD_OK;
}

/* Gemma 2 and Gemma 3 (transformers' gemma2, gemma3_text): RoPE per layer type (Gemma 3:
 * rope_parameters' full_attention and sliding_attention, or rope_theta, rope_scaling for the
 * global layers and rope_local_base_freq; Gemma 2: one RoPE for all), the window and its layer
 * pattern, query_pre_attn_scalar, the soft-caps (Gemma 2: attention 50 and final 30 when
 * absent, as Gemma2Config; Gemma 3: final only, none when absent). */
static sd_status gemma_from_hf(sd_config *c, const sd_json *cfg, const char *path) {
    const int g2 = c->arch == SD_ARCH_GEMMA2;
    SD_TRY(json_float(cfg, "rope_local_base_freq", &c->rope_theta_local, 1e4f, path));
    const sd_json *rp = sd_json_get(cfg, "rope_parameters");
    if (g2) {
        SD_TRY(rope_from_hf(c, cfg, path));
        c->rope_theta_local = c->rope_theta;
        if (c->rope_scaling != SD_ROPE_DEFAULT) { /* HF scales every layer, llama.cpp not */
            return sd_set_error(SD_ERR_UNSUPPORTED,
                                "%s: RoPE scaling in a gemma2 model is not "
                                "supported",
                                path);
        }
    } else if (!is_null(rp) && sd_json_get(rp, "full_attention") != NULL) {
        if (!is_null(sd_json_get(cfg, "rope_scaling"))) {
            return sd_set_error(SD_ERR_UNSUPPORTED,
                                "%s: \"rope_scaling\" beside per-layer-type \"rope_parameters\" "
                                "is not supported",
                                path);
        }
        for (size_t k = 0; k < rp->n; k++) {
            const int full = strcmp(rp->keys[k], "full_attention") == 0;
            if (!full && strcmp(rp->keys[k], "sliding_attention") != 0) {
                return sd_set_error(SD_ERR_UNSUPPORTED,
                                    "%s: \"rope_parameters\".\"%s\" is not "
                                    "supported",
                                    path, rp->keys[k]);
            }
            sd_config t = *c;
            SD_TRY(rope_from_json(&t, &rp->items[k], rp->keys[k], path));
            if (full) {
                *c = t;
            } else if (t.rope_scaling != SD_ROPE_DEFAULT) {
                return sd_set_error(SD_ERR_UNSUPPORTED,
                                    "%s: RoPE scaling of the sliding_attention layers is not "
                                    "supported",
                                    path);
            } else {
                c->rope_theta_local = t.rope_theta;
            }
        }
    } else {
        SD_TRY(rope_from_hf(c, cfg, path)); /* the global layers' */
    }
    int64_t window = 0;
    if (sd_json_get_int(cfg, "sliding_window", &window) && window > 0) {
        c->sliding_window = window < (1 << 30) ? (int)window : 1 << 30;
        SD_TRY(gemma_pattern(c, cfg, path));
    } else {
        /* HF would still give the sliding_attention layers their local RoPE base, llama.cpp
         * not: no answer is right for both */
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "%s: a %s model without a positive \"sliding_window\" is not "
                            "supported",
                            path, c->arch_name);
    }
    double qpas = 256.0;
    int has_qpas = 0;
    SD_TRY(sd_config_json_number(cfg, "query_pre_attn_scalar", &qpas, &has_qpas, path));
    if (!(qpas > 0.0)) {
        return sd_set_error(SD_ERR_FORMAT, "%s: \"query_pre_attn_scalar\" must be > 0", path);
    }
    c->attn_scale = (float)(1.0 / sqrt(qpas));
    SD_TRY(softcap_from_hf(&c->final_softcap, cfg, "final_logit_softcapping", g2 ? 30.0f : 0.0f,
                           path));
    if (g2) {
        SD_TRY(softcap_from_hf(&c->attn_softcap, cfg, "attn_logit_softcapping", 50.0f, path));
    }
    return SD_OK;
}

sd_status sd_config_from_hf(sd_config *c, const sd_json *cfg, const char *path,
                            const sd_st_set *st) {
    const char *mt = sd_json_get_string(cfg, "model_type");
    if (mt == NULL) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: missing \"model_type\" (cannot tell the "
                            "architecture)",
                            path);
    }
    if (strcmp(mt, "gemma3") == 0) { /* the multimodal wrapper, its text model in text_config */
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "%s: \"model_type\" \"gemma3\" (image and text) is not supported; "
                            "the text-only \"gemma3_text\" is",
                            path);
    }
    SD_TRY(sd_config_set_arch(c, mt, strlen(mt)));
    SD_TRY(json_int(cfg, "hidden_size", &c->hidden_size, 1, path));
    SD_TRY(json_int(cfg, "intermediate_size", &c->ffn_size, 1, path));
    SD_TRY(json_int(cfg, "num_hidden_layers", &c->n_layers, 1, path));
    SD_TRY(json_int(cfg, "num_attention_heads", &c->n_heads, 1, path));
    SD_TRY(json_int(cfg, "vocab_size", &c->vocab_size, 1, path));
    SD_TRY(json_int(cfg, "max_position_embeddings", &c->context_length, 1, path));
    c->n_kv_heads = c->n_heads;
    SD_TRY(json_int(cfg, "num_key_value_heads", &c->n_kv_heads, 0, path));
    c->head_dim = c->hidden_size / c->n_heads;
    if (!is_null(sd_json_get(cfg, "head_dim"))) {
        SD_TRY(json_int(cfg, "head_dim", &c->head_dim, 1, path));
    }
    SD_TRY(json_float(cfg, "rms_norm_eps", &c->rms_eps, 1e-6f, path));
    SD_TRY(json_float(cfg, "rope_theta", &c->rope_theta, 10000.0f, path));
    SD_TRY(refuse_hf_keys(c, cfg, path));
    if (sd_config_is_gemma(c)) {
        SD_TRY(gemma_from_hf(c, cfg, path));
    } else {
        SD_TRY(rope_from_hf(c, cfg, path));
        SD_TRY(window_from_hf(c, cfg, path, mt));
    }
    double f = 0.0;
    if (sd_json_get_double(cfg, "rope_theta", &f) && (float)f != c->rope_theta) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: \"rope_theta\" %g disagrees with the one of \"rope_parameters\""
                            " %g",
                            path, f, (double)c->rope_theta);
    }
    int tied = 0, said = 0;
    SD_TRY(sd_config_json_bool(cfg, "tie_word_embeddings", &tied, &said, path));
    if (!said) {
        tied = sd_st_find(st, "lm_head.weight") == NULL;
    }
    c->tied_embeddings = tied;
    c->rope_neox = 1; /* HF checkpoints use rotate-half pairing */
    return sd_config_check(c);
}
