/* config_hf.c — hyper-parameters from a Hugging Face config.json (transformers' names, before
 * and since transformers 5), with config.c's rule: every key that changes the arithmetic is read
 * into sd_config or refused by name, and a value of the wrong type is an error, never a
 * default. */
#include "model/config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "util/status.h"

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
static int json_neutral(const sd_json *v, sd_neutral ok) {
    if (is_null(v)) {
        return 1;
    }
    switch (ok) {
    case SD_NEUTRAL_ABSENT: return 0;
    case SD_NEUTRAL_ZERO:
        return (v->type == SD_JSON_BOOL && !v->boolean) ||
               (v->type == SD_JSON_NUMBER && v->number == 0.0);
    case SD_NEUTRAL_ONE: return v->type == SD_JSON_NUMBER && v->number == 1.0;
    case SD_NEUTRAL_TRUE: return v->type == SD_JSON_BOOL && v->boolean;
    }
    return 0;
}

static const sd_cfg_refused g_hf_refused[] = {
    {"mlp_bias", SD_NEUTRAL_ZERO, "MLP biases", 0},
    {"partial_rotary_factor", SD_NEUTRAL_ONE, "partial rotary embeddings", SD_CFG_PHI3},
    {"attn_logit_softcapping", SD_NEUTRAL_ABSENT, "attention logit soft-capping", SD_CFG_GEMMA2},
    {"final_logit_softcapping", SD_NEUTRAL_ABSENT, "final logit soft-capping",
     SD_CFG_GEMMA2 | SD_CFG_GEMMA3},
    {"query_pre_attn_scalar", SD_NEUTRAL_ABSENT, "a custom attention scale",
     SD_CFG_GEMMA2 | SD_CFG_GEMMA3},
    {"attention_multiplier", SD_NEUTRAL_ABSENT, "a custom attention scale", SD_CFG_GRANITE},
    {"embedding_multiplier", SD_NEUTRAL_ONE, "embedding scaling", SD_CFG_GRANITE},
    {"logits_scaling", SD_NEUTRAL_ONE, "logit scaling", SD_CFG_GRANITE},
    {"residual_multiplier", SD_NEUTRAL_ONE, "residual scaling", SD_CFG_GRANITE},
    {"num_local_experts", SD_NEUTRAL_ZERO, "mixture of experts", 0},
    {"num_experts", SD_NEUTRAL_ZERO, "mixture of experts", 0},
    {"quantization_config", SD_NEUTRAL_ABSENT, "quantized Hugging Face weights", 0},
    {"is_causal", SD_NEUTRAL_TRUE, "non-causal attention", 0},
    {"use_qk_norm", SD_NEUTRAL_ZERO, "q/k norms in this architecture", 0},
    {"rope_local_base_freq", SD_NEUTRAL_ABSENT, "a separate RoPE base for local layers",
     SD_CFG_GEMMA3},
    {"use_bidirectional_attention", SD_NEUTRAL_ZERO, "bidirectional attention", 0},
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
        !json_neutral(sd_json_get(cfg, "attention_bias"), SD_NEUTRAL_ZERO)) {
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

/* c->rope_dim from a partial_rotary_factor p (`where` names it): the first int(Dh * p)
 * dimensions of each head, as transformers and llama.cpp's converter count them; one stated
 * before (c->rope_dim > 0) must agree. */
static sd_status partial_rotary(sd_config *c, const sd_json *v, const char *where,
                                const char *path) {
    if (v->type != SD_JSON_NUMBER || !(v->number > 0.0) || !(v->number <= 1.0)) {
        return sd_set_error(SD_ERR_FORMAT, "%s: %s must be a number in (0, 1]", path, where);
    }
    const int dims = (int)((double)c->head_dim * v->number);
    if (dims < 2 || dims % 2 != 0) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "%s: %s = %g rotates %d of the head's %d dimensions; an even number "
                            "of at least 2 is needed",
                            path, where, v->number, dims, c->head_dim);
    }
    if (c->rope_dim > 0 && c->rope_dim != dims) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: %s = %g (%d rotary dimensions) disagrees with the %d stated "
                            "elsewhere",
                            path, where, v->number, dims, c->rope_dim);
    }
    c->rope_dim = dims;
    return SD_OK;
}

/* LongRoPE's per-frequency divisors: `key` of rp, an array of n positive numbers. */
static sd_status longrope_factors(float *dst, const sd_json *rp, const char *key, int n,
                                  const char *field, const char *path) {
    const sd_json *a = sd_json_get(rp, key);
    if (a == NULL || a->type != SD_JSON_ARRAY || a->n != (size_t)n) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: \"%s\".\"%s\" must be an array of %d numbers (one per "
                            "frequency of the %d rotary dimensions), got %s%s",
                            path, field, key, n, 2 * n, a == NULL ? "none" : json_type_name(a),
                            a != NULL && a->type == SD_JSON_ARRAY ? " of another length" : "");
    }
    for (size_t i = 0; i < a->n; i++) {
        const sd_json *e = &a->items[i];
        if (e->type != SD_JSON_NUMBER || !(e->number > 0.0) || !isfinite(e->number) ||
            !((float)e->number > 0.0f) || !isfinite((float)e->number)) {
            return sd_set_error(SD_ERR_FORMAT, "%s: \"%s\".\"%s\"[%zu] must be a number > 0", path,
                                field, key, i);
        }
        dst[i] = (float)e->number;
    }
    return SD_OK;
}

/* Phi-3's LongRoPE (type "longrope", or "su" as older checkpoints name it) as transformers
 * computes it: the short and long factors; the original context from the object or (before
 * transformers 5) config.json's top level, already in c->rope_original_context; cos and sin
 * times attention_factor, by default sqrt(1 + ln(s) / ln(original)) for s = factor, or the
 * context length over the original one, > 1 (else 1). */
static sd_status longrope_from_json(sd_config *c, const sd_json *rp, const char *field,
                                    const char *path) {
    if (c->arch != SD_ARCH_PHI3) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "%s: \"%s\" of type longrope (LongRoPE) is supported in phi3 "
                            "models only, not in %s",
                            path, field, c->arch_name);
    }
    const int n = sd_config_rope_dim(c) / 2;
    SD_TRY(longrope_factors(c->rope_short_factors, rp, "short_factor", n, field, path));
    SD_TRY(longrope_factors(c->rope_long_factors, rp, "long_factor", n, field, path));
    /* transformers takes config.json's top-level value (Phi3Config's default 4096 when
     * absent, already in c) over this object's: one that disagrees is refused */
    const int64_t orig = c->rope_original_context;
    int64_t stated = orig;
    if (!is_null(sd_json_get(rp, "original_max_position_embeddings")) &&
        (!sd_json_get_int(rp, "original_max_position_embeddings", &stated) || stated != orig)) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: \"%s\".\"original_max_position_embeddings\" must be the "
                            "integer %lld of the top level (transformers reads that one; "
                            "Phi3Config's default 4096 when absent)",
                            path, field, (long long)orig);
    }
    if (orig <= 0 || orig > c->context_length) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: LongRoPE's original_max_position_embeddings %lld is not in [1, "
                            "max_position_embeddings %d]",
                            path, (long long)orig, c->context_length);
    }
    const double old = c->rope_original_context;
    double factor = (double)c->context_length / old, af = 0.0;
    int has_factor = 0, has_af = 0;
    SD_TRY(sd_config_json_number(rp, "factor", &factor, &has_factor, path));
    SD_TRY(sd_config_json_number(rp, "attention_factor", &af, &has_af, path));
    if (!(factor > 0.0) || !isfinite(factor) || (has_af && (!(af > 0.0) || !isfinite(af)))) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: \"%s\": LongRoPE's factor %g and attention_factor %g must be "
                            "finite and > 0",
                            path, field, factor, af);
    }
    if (!has_af) {
        af = factor <= 1.0 || old <= 1.0 ? 1.0 : sqrt(1.0 + log(factor) / log(old));
    }
    c->rope_scaling = SD_ROPE_LONGROPE;
    c->rope_attn_factor = (float)af;
    return SD_OK;
}

/* YaRN as transformers computes it (llama, qwen2, qwen3, smollm3): factor (when null, the
 * context length over the original one); the original context from config.json's top level
 * (which transformers prefers; one in the object must agree), the object, or the context
 * length; beta_fast and beta_slow (32 and 1 when absent, null or 0); cos and sin times
 * attention_factor, by default mscale(factor, mscale) / mscale(factor, mscale_all_dim) when
 * both are given and non-zero, else 0.1 ln(factor) + 1. Only the rounded correction range
 * ("truncate" true, the default). */
static sd_status yarn_from_json(sd_config *c, const sd_json *rp, const char *field,
                                const char *path) {
    int64_t orig = c->rope_original_context, stated = 0;
    const int in_object = !is_null(sd_json_get(rp, "original_max_position_embeddings"));
    if (in_object && !sd_json_get_int(rp, "original_max_position_embeddings", &stated)) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: \"%s\".\"original_max_position_embeddings\" must be an integer",
                            path, field);
    }
    if (in_object && orig > 0 && stated != orig) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: \"%s\".\"original_max_position_embeddings\" %lld disagrees with "
                            "the top level's %lld (transformers reads that one)",
                            path, field, (long long)stated, (long long)orig);
    }
    orig = orig > 0 ? orig : in_object ? stated : c->context_length;
    if (orig <= 0 || orig > (1 << 30)) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: YaRN's original_max_position_embeddings %lld is out of range",
                            path, (long long)orig);
    }
    double factor = (double)c->context_length / (double)orig, af = 0.0, ms = 0.0, ms_all = 0.0;
    double fast = 0.0, slow = 0.0;
    int has = 0, has_af = 0, truncate = 1, said = 0;
    SD_TRY(sd_config_json_number(rp, "factor", &factor, &has, path));
    SD_TRY(sd_config_json_number(rp, "attention_factor", &af, &has_af, path));
    SD_TRY(sd_config_json_number(rp, "mscale", &ms, &has, path));
    SD_TRY(sd_config_json_number(rp, "mscale_all_dim", &ms_all, &has, path));
    SD_TRY(sd_config_json_number(rp, "beta_fast", &fast, &has, path));
    SD_TRY(sd_config_json_number(rp, "beta_slow", &slow, &has, path));
    SD_TRY(sd_config_json_bool(rp, "truncate", &truncate, &said, path));
    if (!truncate) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "%s: \"%s\".\"truncate\" = false (YaRN without a rounded correction "
                            "range) is not supported",
                            path, field);
    }
    fast = fast != 0.0 ? fast : 32.0; /* transformers: `or 32` */
    slow = slow != 0.0 ? slow : 1.0;
    if (!(factor > 0.0) || !isfinite(factor) || !(fast > 0.0) || !isfinite(fast) || !(slow > 0.0) ||
        !isfinite(slow) || (has_af && (!(af > 0.0) || !isfinite(af))) || !isfinite(ms) ||
        !isfinite(ms_all)) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: \"%s\": YaRN's factor %g, beta_fast %g, beta_slow %g and "
                            "attention_factor %g must be finite and > 0",
                            path, field, factor, fast, slow, af);
    }
    if (!has_af) {
        af = ms != 0.0 && ms_all != 0.0
                 ? sd_config_yarn_mscale(factor, ms) / sd_config_yarn_mscale(factor, ms_all)
                 : sd_config_yarn_mscale(factor, 1.0);
    }
    c->rope_scaling = SD_ROPE_YARN;
    c->rope_factor = (float)factor;
    c->rope_original_context = (int)orig;
    c->rope_beta_fast = (float)fast;
    c->rope_beta_slow = (float)slow;
    c->rope_attn_factor = (float)af;
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
    const sd_json *pr = sd_json_get(rp, "partial_rotary_factor");
    if (c->arch == SD_ARCH_PHI3 && !is_null(pr)) { /* transformers 5 repeats it here */
        char where[64];
        snprintf(where, sizeof(where), "\"%s\".\"partial_rotary_factor\"", field);
        SD_TRY(partial_rotary(c, pr, where, path));
    }
    if (strcmp(type, "default") == 0) {
        c->rope_scaling = SD_ROPE_DEFAULT;
    } else if (strcmp(type, "linear") == 0) {
        c->rope_scaling = SD_ROPE_LINEAR;
        n_keys = 1;
    } else if (strcmp(type, "llama3") == 0) {
        c->rope_scaling = SD_ROPE_LLAMA3;
        n_keys = 4;
    } else if (strcmp(type, "longrope") == 0 || strcmp(type, "su") == 0) {
        SD_TRY(longrope_from_json(c, rp, field, path));
    } else if (strcmp(type, "yarn") == 0) {
        SD_TRY(yarn_from_json(c, rp, field, path));
    } else {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "%s: \"%s\" of type \"%s\" is not supported (supported: default, "
                            "linear, llama3, yarn; longrope in phi3)",
                            path, field, type);
    }
    double v[4] = {0, 0, 0, 0};
    for (int i = 0; i < n_keys; i++) {
        if (!sd_json_get_double(rp, llama3_keys[i], &v[i])) {
            return sd_set_error(SD_ERR_FORMAT, "%s: \"%s\" of type \"%s\" has no number \"%s\"",
                                path, field, type, llama3_keys[i]);
        }
    }
    if (n_keys > 0) {
        c->rope_factor = (float)v[0];
        c->rope_low_freq_factor = (float)v[1];
        c->rope_high_freq_factor = (float)v[2];
        c->rope_original_context = v[3] >= 1.0 && v[3] < (double)(1 << 30) ? (int)v[3] : 0;
    }
    double theta = 0.0;
    int has_theta = 0;
    SD_TRY(sd_config_json_number(rp, "rope_theta", &theta, &has_theta, path));
    if (has_theta) {
        c->rope_theta = (float)theta;
    }
    for (size_t k = 0; k < rp->n; k++) {
        const char *key = rp->keys[k];
        static const char *const longrope_keys[] = {"short_factor", "long_factor", "factor",
                                                    "attention_factor",
                                                    "original_max_position_embeddings"};
        int known = strcmp(key, "rope_type") == 0 || strcmp(key, "type") == 0 ||
                    strcmp(key, "rope_theta") == 0 ||
                    (strcmp(key, "partial_rotary_factor") == 0 &&
                     (c->arch == SD_ARCH_PHI3 || json_neutral(&rp->items[k], SD_NEUTRAL_ONE)));
        static const char *const yarn_keys[] = {
            "factor",    "attention_factor", "mscale",   "mscale_all_dim",
            "beta_fast", "beta_slow",        "truncate", "original_max_position_embeddings"};
        for (int i = 0; i < 5 && !known && c->rope_scaling == SD_ROPE_LONGROPE; i++) {
            known = strcmp(key, longrope_keys[i]) == 0;
        }
        for (int i = 0; i < 8 && !known && c->rope_scaling == SD_ROPE_YARN; i++) {
            known = strcmp(key, yarn_keys[i]) == 0;
        }
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
             t.rope_original_context != c->rope_original_context || t.rope_dim != c->rope_dim ||
             t.rope_attn_factor != c->rope_attn_factor || t.rope_beta_fast != c->rope_beta_fast ||
             t.rope_beta_slow != c->rope_beta_slow ||
             memcmp(t.rope_short_factors, c->rope_short_factors, sizeof(c->rope_short_factors)) !=
                 0 ||
             memcmp(t.rope_long_factors, c->rope_long_factors, sizeof(c->rope_long_factors)) !=
                 0)) {
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

/* SmolLM3's layers without RoPE: "no_rope_layers" (per layer 1 = RoPE, 0 = none), else every
 * "no_rope_layer_interval"-th (default 4) as SmolLM3Config builds the list. A list must follow
 * such a period, the one llama.cpp hard-codes as 4 (its GGUF cannot state the list). */
static sd_status nope_from_hf(sd_config *c, const sd_json *cfg, const char *path) {
    int64_t n = 4;
    const sd_json *iv = sd_json_get(cfg, "no_rope_layer_interval");
    if (!is_null(iv) &&
        (!sd_json_get_int(cfg, "no_rope_layer_interval", &n) || n < 1 || n > (1 << 20))) {
        return sd_set_error(SD_ERR_FORMAT,
                            "%s: \"no_rope_layer_interval\" must be an integer >= 1, got %s", path,
                            json_type_name(iv));
    }
    const sd_json *list = sd_json_get(cfg, "no_rope_layers");
    if (!is_null(list)) {
        if (list->type != SD_JSON_ARRAY || list->n != (size_t)c->n_layers) {
            return sd_set_error(SD_ERR_FORMAT, "%s: \"no_rope_layers\" is not an array of %d", path,
                                c->n_layers);
        }
        n = 0; /* the period its first layer without RoPE gives, or none */
        for (size_t i = 0; i < list->n; i++) {
            const sd_json *e = &list->items[i];
            const int ok = (e->type == SD_JSON_NUMBER && e->is_integer &&
                            (e->number == 0.0 || e->number == 1.0)) ||
                           e->type == SD_JSON_BOOL;
            if (!ok) {
                return sd_set_error(SD_ERR_FORMAT,
                                    "%s: \"no_rope_layers\"[%zu] must be 0 or 1, got %s", path, i,
                                    json_type_name(e));
            }
            const int rope = e->type == SD_JSON_BOOL ? e->boolean : e->number != 0.0;
            if (n == 0 && !rope) {
                n = (int64_t)i + 1;
            }
            if (n > 0 && rope != ((int64_t)(i + 1) % n != 0)) {
                return sd_set_error(SD_ERR_UNSUPPORTED,
                                    "%s: \"no_rope_layers\"[%zu] = %d breaks the pattern of "
                                    "every %lld-th layer without RoPE (only periodic NoPE layers "
                                    "are supported)",
                                    path, i, rope, (long long)n);
            }
        }
    }
    c->no_rope_interval = (int)n;
    return SD_OK;
}

/* Granite's multipliers as GraniteConfig reads them, each 1 when absent: embeddings times
 * embedding_multiplier, each block's output times residual_multiplier, the attention scale
 * attention_multiplier (in place of 1/sqrt(Dh)), the logits divided by logits_scaling. */
static sd_status granite_from_hf(sd_config *c, const sd_json *cfg, const char *path) {
    static const char *const keys[] = {"embedding_multiplier", "residual_multiplier",
                                       "attention_multiplier", "logits_scaling"};
    float *dst[] = {&c->embed_scale, &c->residual_scale, &c->attn_scale, &c->logit_scale};
    for (int i = 0; i < 4; i++) {
        double v = 1.0;
        int has = 0;
        SD_TRY(sd_config_json_number(cfg, keys[i], &v, &has, path));
        if (!(v > 0.0) || !isfinite(v)) {
            return sd_set_error(SD_ERR_FORMAT, "%s: \"%s\" = %g must be finite and > 0", path,
                                keys[i], v);
        }
        *dst[i] = (float)v;
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
    if (c->arch == SD_ARCH_PHI3) { /* Phi-4-mini's partial rotary, Phi-3.5's LongRoPE context */
        const sd_json *pr = sd_json_get(cfg, "partial_rotary_factor");
        if (!is_null(pr)) {
            SD_TRY(partial_rotary(c, pr, "\"partial_rotary_factor\"", path));
        }
        c->rope_original_context = 4096; /* Phi3Config's default */
    }
    /* the top-level original context transformers prefers for LongRoPE and YaRN */
    SD_TRY(json_int(cfg, "original_max_position_embeddings", &c->rope_original_context, 0, path));
    if (c->arch == SD_ARCH_SMOLLM3) {
        SD_TRY(nope_from_hf(c, cfg, path));
    }
    if (c->arch == SD_ARCH_GRANITE) {
        SD_TRY(granite_from_hf(c, cfg, path));
    }
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
