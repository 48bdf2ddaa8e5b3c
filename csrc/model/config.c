/* config.c — hyper-parameters from GGUF metadata (config_hf.c: from a Hugging Face
 * config.json). Every key that changes the arithmetic is either read into sd_config or, when the
 * forward does not implement it, refused with a message naming it: a model never loads and then
 * computes something else. Also the range checks, and RoPE's inverse frequencies under the
 * supported scalings (none, linear, llama3, per-frequency divisors, LongRoPE, YaRN). */
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
        {"smollm3", SD_ARCH_SMOLLM3},
        {"granite", SD_ARCH_GRANITE},
    };
    static const char *const canonical[] = {"llama",  "qwen2", "qwen3",   "gemma3",
                                            "gemma2", "phi3",  "smollm3", "granite"};
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        if (strlen(known[i].name) == len && memcmp(name, known[i].name, len) == 0) {
            c->arch = known[i].arch;
            snprintf(c->arch_name, sizeof(c->arch_name), "%s", canonical[c->arch]);
            c->has_qkv_bias = c->arch == SD_ARCH_QWEN2;
            c->has_qk_norm = c->arch == SD_ARCH_QWEN3 || c->arch == SD_ARCH_GEMMA3;
            c->no_rope_interval =
                c->arch == SD_ARCH_SMOLLM3 ? 4 : 0; /* llama.cpp's, HF's default */
            return SD_OK;
        }
    }
    return sd_set_error(SD_ERR_UNSUPPORTED,
                        "unknown architecture '%.*s' (supported: llama, mistral, qwen2, qwen3, "
                        "gemma2, gemma3, phi3, smollm3, granite)",
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
    if (c->rope_scaling < SD_ROPE_DEFAULT || c->rope_scaling > SD_ROPE_YARN) {
        return sd_set_error(SD_ERR_INVALID_ARG, "unknown RoPE scaling %d", c->rope_scaling);
    }
    if (c->rope_dim < 0 || c->rope_dim > c->head_dim || c->rope_dim % 2 != 0) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%d rotary dimensions of a head of %d: they must be even and at most "
                            "the head's",
                            c->rope_dim, c->head_dim);
    }
    if (c->rope_attn_factor < 0.0f || !isfinite(c->rope_attn_factor)) {
        return sd_set_error(SD_ERR_FORMAT, "RoPE attention factor %g must be finite and > 0",
                            (double)c->rope_attn_factor);
    }
    /* both as transformers and llama.cpp compute them, for Phi-3 only (transformers' other
     * architectures would not apply partial rotary embeddings the same way) */
    if (c->arch != SD_ARCH_PHI3 &&
        ((c->rope_dim != 0 && c->rope_dim != c->head_dim) || c->rope_scaling == SD_ROPE_LONGROPE ||
         (c->rope_attn_factor != 0.0f && c->rope_attn_factor != 1.0f &&
          c->rope_scaling != SD_ROPE_YARN))) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "partial rotary embeddings, LongRoPE and a RoPE attention factor are "
                            "supported in phi3 models only, not in %s",
                            c->arch_name);
    }
    if (c->rope_scaling == SD_ROPE_YARN && (c->arch == SD_ARCH_PHI3 || sd_config_is_gemma(c))) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "YaRN RoPE scaling is supported in llama, qwen2, qwen3 and smollm3 "
                            "models, not in %s",
                            c->arch_name);
    }
    if (c->rope_scaling == SD_ROPE_YARN &&
        (!positive(c->rope_factor) || c->rope_original_context <= 0 ||
         !positive(c->rope_beta_fast) || !positive(c->rope_beta_slow))) {
        return sd_set_error(SD_ERR_FORMAT,
                            "YaRN needs factor > 0, beta_fast > 0, beta_slow > 0 and "
                            "original_max_position_embeddings > 0 (got %g, %g, %g, %d)",
                            (double)c->rope_factor, (double)c->rope_beta_fast,
                            (double)c->rope_beta_slow, c->rope_original_context);
    }
    if (!(c->embed_scale >= 0.0f) || !isfinite(c->embed_scale) || !(c->residual_scale >= 0.0f) ||
        !isfinite(c->residual_scale) || !(c->logit_scale >= 0.0f) || !isfinite(c->logit_scale)) {
        return sd_set_error(SD_ERR_FORMAT,
                            "embedding scale %g, residual scale %g or logit scale %g is not "
                            "finite and > 0",
                            (double)c->embed_scale, (double)c->residual_scale,
                            (double)c->logit_scale);
    }
    if (c->arch != SD_ARCH_GRANITE &&
        (c->embed_scale > 0.0f || c->residual_scale > 0.0f || c->logit_scale > 0.0f)) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "embedding, residual and logit scales in a %s model (granite only)",
                            c->arch_name);
    }
    if (c->no_rope_interval < 0 || (c->no_rope_interval > 0 && c->arch != SD_ARCH_SMOLLM3)) {
        return sd_set_error(SD_ERR_FORMAT, "layers without RoPE (every %d) in a %s model",
                            c->no_rope_interval, c->arch_name);
    }
    if (c->rope_scaling == SD_ROPE_LONGROPE && c->rope_original_context <= 0) {
        return sd_set_error(SD_ERR_FORMAT, "LongRoPE needs its original context length > 0");
    }
    return SD_OK;
}

const char *sd_config_context_note(const sd_config *c, char *buf, size_t n) {
    buf[0] = '\0';
    if (c->rope_scaling == SD_ROPE_LONGROPE && !c->rope_long &&
        c->context_file > c->context_length) {
        snprintf(buf, n,
                 "; this LongRoPE model's short factors end there, its long ones take up to %d "
                 "(specdec.load(..., context_length=N))",
                 c->context_file);
    }
    return buf;
}

/* The frequency index where a wavelength turns `rotations` times in the original context. */
static double yarn_dim(const sd_config *c, double rotations) {
    const double R = sd_config_rope_dim(c);
    return R * log((double)c->rope_original_context / (rotations * SD_TWO_PI)) /
           (2.0 * log((double)c->rope_theta));
}

void sd_config_yarn_ramp(const sd_config *c, double *lo, double *hi) {
    const int R = sd_config_rope_dim(c);
    *lo = floor(yarn_dim(c, c->rope_beta_fast));
    *hi = ceil(yarn_dim(c, c->rope_beta_slow));
    *lo = *lo > 0.0 ? *lo : 0.0;
    *hi = *hi < R - 1 ? *hi : R - 1;
    *hi = *hi == *lo ? *hi + 0.001 : *hi;
}

double sd_config_yarn_mscale(double factor, double mscale) {
    return factor <= 1.0 ? 1.0 : 0.1 * mscale * log(factor) + 1.0;
}

int sd_config_rope_dim(const sd_config *c) {
    return c->rope_dim > 0 ? c->rope_dim : c->head_dim;
}

void sd_config_rope_freq(double *inv, const sd_config *c, const float *factors) {
    const double factor = c->rope_factor, low = c->rope_low_freq_factor;
    const double high = c->rope_high_freq_factor, old = c->rope_original_context;
    const int dims = sd_config_rope_dim(c);
    const float *longrope = c->rope_long ? c->rope_long_factors : c->rope_short_factors;
    double ramp_lo = 0.0, ramp_hi = 1.0;
    if (c->rope_scaling == SD_ROPE_YARN) {
        sd_config_yarn_ramp(c, &ramp_lo, &ramp_hi);
    }
    for (int i = 0; i < dims / 2; i++) {
        double f = pow((double)c->rope_theta, -2.0 * i / dims);
        if (c->rope_scaling == SD_ROPE_LINEAR) {
            f /= factor;
        } else if (c->rope_scaling == SD_ROPE_FACTORS) {
            f /= (double)factors[i];
        } else if (c->rope_scaling == SD_ROPE_LONGROPE) {
            f /= (double)longrope[i];
        } else if (c->rope_scaling == SD_ROPE_YARN) {
            /* extrapolated (kept) below the ramp, interpolated above it, blended linearly */
            double r = ((double)i - ramp_lo) / (ramp_hi - ramp_lo);
            r = r < 0.0 ? 0.0 : r > 1.0 ? 1.0 : r;
            f = f / factor * r + f * (1.0 - r);
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

static const sd_cfg_refused g_gguf_refused[] = {
    {"attn_logit_softcapping", SD_NEUTRAL_ZERO, "attention logit soft-capping", SD_CFG_GEMMA2},
    {"final_logit_softcapping", SD_NEUTRAL_ZERO, "final logit soft-capping",
     SD_CFG_GEMMA2 | SD_CFG_GEMMA3},
    {"attention.scale", SD_NEUTRAL_ABSENT, "a custom attention scale", SD_CFG_GRANITE},
    {"embedding_scale", SD_NEUTRAL_ONE, "embedding scaling", SD_CFG_GRANITE},
    {"logit_scale", SD_NEUTRAL_ONE, "logit scaling", SD_CFG_GRANITE},
    {"residual_scale", SD_NEUTRAL_ONE, "residual scaling", SD_CFG_GRANITE},
    {"expert_count", SD_NEUTRAL_ZERO, "mixture of experts", 0},
    {"attention.clamp_kqv", SD_NEUTRAL_ZERO, "clamping of q/k/v", 0},
    {"attention.causal", SD_NEUTRAL_TRUE, "non-causal attention", 0},
    {"attention.layer_norm_epsilon", SD_NEUTRAL_ABSENT, "LayerNorm (specdec has RMSNorm only)", 0},
    {"rope.dimension_sections", SD_NEUTRAL_ABSENT, "multimodal RoPE sections", 0},
    {"rope.freq_base_swa", SD_NEUTRAL_ABSENT, "a separate RoPE base for sliding-window layers",
     SD_CFG_GEMMA2 | SD_CFG_GEMMA3},
    {"attention.sliding_window_pattern", SD_NEUTRAL_ABSENT, "sliding windows on some layers only",
     SD_CFG_GEMMA2 | SD_CFG_GEMMA3},
    {"rope.scaling.attn_factor", SD_NEUTRAL_ONE, "RoPE attention factor", SD_CFG_PHI3},
    {"rope.scaling.alpha", SD_NEUTRAL_ZERO, "NTK-alpha RoPE scaling", 0},
};

static sd_status refuse_gguf_keys(const sd_gguf *g, const sd_config *c) {
    for (size_t i = 0; i < sizeof(g_gguf_refused) / sizeof(g_gguf_refused[0]); i++) {
        char key[128];
        snprintf(key, sizeof(key), "%s.%s", c->arch_name, g_gguf_refused[i].key);
        const sd_gguf_kv *kv = sd_gguf_find(g, key);
        if (kv == NULL || (g_gguf_refused[i].reads & (1u << c->arch))) {
            continue;
        }
        double v = 0.0;
        const int num = sd_gguf_get_float(g, key, &v); /* numbers and booleans */
        int fine = 0;
        switch (g_gguf_refused[i].ok) {
        case SD_NEUTRAL_ABSENT: fine = 0; break;
        case SD_NEUTRAL_ZERO: fine = num && v == 0.0; break;
        case SD_NEUTRAL_ONE: fine = num && v == 1.0; break;
        case SD_NEUTRAL_TRUE: fine = num && v != 0.0; break;
        }
        if (!fine) {
            return sd_set_error(SD_ERR_UNSUPPORTED, "metadata '%s' (%s) is not supported", key,
                                g_gguf_refused[i].what);
        }
    }
    return SD_OK;
}

/* YaRN as llama.cpp reads it for the llama graphs: rope.scaling.factor, the original context
 * (rope.scaling.original_context_length, else the context length), beta_fast 32 and beta_slow 1,
 * cos and sin times 0.1 ln(factor) + 1. llama.cpp reads no rope.scaling.yarn_* key for these
 * architectures, while the checkpoint's transformers config that set one would compute with
 * it: a file stating another value than llama.cpp's is refused. */
static sd_status yarn_from_gguf(sd_config *c, const sd_gguf *g, double factor) {
    if (!(factor > 0.0) || !isfinite(factor)) {
        return sd_set_error(SD_ERR_FORMAT,
                            "metadata '%s.rope.scaling.factor' = %g: YaRN needs a factor > 0",
                            c->arch_name, factor);
    }
    int64_t v = c->context_length;
    if (gguf_int(g, c, "rope.scaling.original_context_length", &v) && (v <= 0 || v > (1 << 30))) {
        return sd_set_error(SD_ERR_FORMAT,
                            "metadata '%s.rope.scaling.original_context_length' = %lld is out of "
                            "range",
                            c->arch_name, (long long)v);
    }
    const double mscale = sd_config_yarn_mscale(factor, 1.0);
    const struct {
        const char *suffix;
        double llamacpp; /* the value llama.cpp computes with */
    } keys[] = {
        {"rope.scaling.yarn_beta_fast", 32.0},     {"rope.scaling.yarn_beta_slow", 1.0},
        {"rope.scaling.yarn_ext_factor", 1.0},     {"rope.scaling.yarn_attn_factor", mscale},
        {"rope.scaling.yarn_log_multiplier", 0.0},
    };
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        double x = 0.0;
        if (gguf_float(g, c, keys[i].suffix, &x) &&
            !(fabs(x - keys[i].llamacpp) <= 1e-6 * fabs(keys[i].llamacpp))) {
            return sd_set_error(SD_ERR_UNSUPPORTED,
                                "metadata '%s.%s' = %g is not supported (llama.cpp computes a "
                                "%s model with %g)",
                                c->arch_name, keys[i].suffix, x, c->arch_name, keys[i].llamacpp);
        }
    }
    c->rope_scaling = SD_ROPE_YARN;
    c->rope_factor = (float)factor;
    c->rope_original_context = (int)v;
    c->rope_beta_fast = 32.0f;
    c->rope_beta_slow = 1.0f;
    c->rope_attn_factor = (float)mscale;
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
    const int is_yarn = type != NULL && len == 4 && memcmp(type, "yarn", 4) == 0;
    /* phi3's factors come as tensors (longrope_from_gguf); the type may be stated as well */
    const int is_longrope =
        type != NULL && len == 8 && memcmp(type, "longrope", 8) == 0 && c->arch == SD_ARCH_PHI3;
    if (type != NULL && !is_none && !is_linear && !is_yarn && !is_longrope) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "metadata '%s' = '%.*s' is not supported (supported: none, linear, "
                            "yarn; longrope in phi3)",
                            key, (int)(len > 32 ? 32 : len), type);
    }
    if (is_longrope && sd_gguf_find_tensor(g, "rope_factors_long.weight") == NULL) {
        return sd_set_error(SD_ERR_FORMAT,
                            "metadata '%s' is longrope but the tensors rope_factors_long and "
                            "rope_factors_short are missing",
                            key);
    }
    if (is_yarn) {
        return yarn_from_gguf(c, g, factor);
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

/* Granite's scales as llama.cpp reads them: logit_scale (required), and embedding_scale,
 * residual_scale (0 or absent: none) and attention.scale (0 or absent: 1/sqrt(Dh)). */
static sd_status granite_from_gguf(sd_config *c, const sd_gguf *g) {
    static const char *const keys[] = {"logit_scale", "embedding_scale", "residual_scale",
                                       "attention.scale"};
    float *dst[] = {&c->logit_scale, &c->embed_scale, &c->residual_scale, &c->attn_scale};
    for (int i = 0; i < 4; i++) {
        double v = 0.0;
        const int has = gguf_float(g, c, keys[i], &v);
        if ((i == 0 && !has) || !(v >= 0.0) || !isfinite(v) || (i == 0 && v == 0.0)) {
            return sd_set_error(SD_ERR_FORMAT, "metadata '%s.%s' is %s", c->arch_name, keys[i],
                                has ? "not finite and > 0" : "missing");
        }
        *dst[i] = (float)v;
    }
    return SD_OK;
}

/* Phi-3's LongRoPE as llama.cpp reads it: the tensors rope_factors_long and rope_factors_short
 * (both; their values are read with the weights), rope.scaling.original_context_length (the
 * context length when absent, as llama.cpp) and rope.scaling.attn_factor (any phi3 model). */
static sd_status longrope_from_gguf(sd_config *c, const sd_gguf *g) {
    const int has_long = sd_gguf_find_tensor(g, "rope_factors_long.weight") != NULL;
    const int has_short = sd_gguf_find_tensor(g, "rope_factors_short.weight") != NULL;
    double f = 0.0;
    if (c->arch == SD_ARCH_PHI3 && gguf_float(g, c, "rope.scaling.attn_factor", &f)) {
        if (!(f > 0.0) || !isfinite(f)) {
            return sd_set_error(SD_ERR_FORMAT,
                                "metadata '%s.rope.scaling.attn_factor' = %g must be finite and "
                                "> 0",
                                c->arch_name, f);
        }
        c->rope_attn_factor = (float)f;
    }
    if (!has_long && !has_short) {
        return SD_OK;
    }
    if (c->arch != SD_ARCH_PHI3) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "tensors rope_factors_long/rope_factors_short (LongRoPE) are "
                            "supported in phi3 models only, not in %s",
                            c->arch_name);
    }
    if (!has_long || !has_short) {
        return sd_set_error(SD_ERR_FORMAT, "tensor '%s' without '%s' (LongRoPE needs both)",
                            has_long ? "rope_factors_long.weight" : "rope_factors_short.weight",
                            has_long ? "rope_factors_short.weight" : "rope_factors_long.weight");
    }
    if (c->rope_scaling != SD_ROPE_DEFAULT) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "LongRoPE factors together with another RoPE scaling are not "
                            "supported");
    }
    int64_t v = c->context_length;
    if (gguf_int(g, c, "rope.scaling.original_context_length", &v) &&
        (v <= 0 || v > c->context_length)) {
        return sd_set_error(SD_ERR_FORMAT,
                            "metadata '%s.rope.scaling.original_context_length' = %lld is not in "
                            "[1, context length %d]",
                            c->arch_name, (long long)v, c->context_length);
    }
    c->rope_scaling = SD_ROPE_LONGROPE;
    c->rope_original_context = (int)v;
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
    if (gguf_int(g, c, "rope.dimension_count", &v) && v != c->head_dim &&
        c->arch == SD_ARCH_PHI3) { /* Phi-4-mini: the first v dimensions of each head */
        if (v <= 0 || v > c->head_dim || v % 2 != 0) {
            return sd_set_error(SD_ERR_FORMAT,
                                "metadata '%s.rope.dimension_count' = %lld: rotary dimensions "
                                "must be even and at most the head's %d",
                                c->arch_name, (long long)v, c->head_dim);
        }
        c->rope_dim = (int)v;
    } else if (gguf_int(g, c, "rope.dimension_count", &v) && v != c->head_dim) {
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
    if (c->arch == SD_ARCH_GRANITE) {
        SD_TRY(granite_from_gguf(c, g));
    }
    SD_TRY(rope_from_gguf(c, g));
    SD_TRY(longrope_from_gguf(c, g));
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
    /* llama.cpp's converter permutes q/k rows for llama's adjacent pairs (smollm3's, granite's) */
    c->rope_neox =
        c->arch != SD_ARCH_LLAMA && c->arch != SD_ARCH_SMOLLM3 && c->arch != SD_ARCH_GRANITE;
    c->tied_embeddings = sd_gguf_find_tensor(g, "output.weight") == NULL;
    return sd_config_check(c);
}
