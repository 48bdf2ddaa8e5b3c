/* config.h — a model's hyper-parameters from GGUF metadata or a Hugging Face config.json, with
 * every setting that changes the arithmetic either taken into sd_config or refused by name, and
 * the RoPE frequencies those settings give. */
#ifndef SD_CONFIG_H
#define SD_CONFIG_H

#include <stddef.h>

#include "format/gguf.h"
#include "format/safetensors.h"
#include "specdec.h"

/* The tables of keys each reader refuses (config.c: GGUF, config_hf.c: config.json) name the
 * architectures that read a key themselves, as bits, and which value of it is neutral (what the
 * model computes anyway). */
#define SD_CFG_GEMMA2 (1u << SD_ARCH_GEMMA2)
#define SD_CFG_GEMMA3 (1u << SD_ARCH_GEMMA3)
#define SD_CFG_PHI3 (1u << SD_ARCH_PHI3)
#define SD_CFG_GRANITE (1u << SD_ARCH_GRANITE)
typedef enum { SD_NEUTRAL_ABSENT, SD_NEUTRAL_ZERO, SD_NEUTRAL_ONE, SD_NEUTRAL_TRUE } sd_neutral;

/* One key of such a table: its name (GGUF: after "<arch>."), its neutral value, what it means
 * (for the message), and the architectures that read it themselves (SD_CFG_* bits). */
typedef struct {
    const char *key;
    sd_neutral ok;
    const char *what;
    unsigned reads;
} sd_cfg_refused;

/* Set c->arch, arch_name and the flags that follow from the architecture named name[0..len)
 * ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gemma3_text"); SD_ERR_UNSUPPORTED
 * names any other. */
sd_status sd_config_set_arch(sd_config *c, const char *name, size_t len);

/* Range checks of the sizes and the RoPE/norm constants. */
sd_status sd_config_check(const sd_config *c);

/* From GGUF metadata (keys "<arch>.<suffix>"). A rope_freqs.weight tensor sets SD_ROPE_FACTORS
 * (the divisors are read with the weights). */
sd_status sd_config_from_gguf(sd_config *c, const sd_gguf *g);

/* From a parsed config.json (`path` names it in messages); `st` tells whether lm_head.weight
 * exists when tie_word_embeddings is not given. */
sd_status sd_config_from_hf(sd_config *c, const sd_json *cfg, const char *path,
                            const sd_st_set *st);

/* A setting of a config.json object: absent or null leaves *dst as it is and *found = 0; a
 * number (sd_config_json_number) or true/false (sd_config_json_bool) goes into *dst with
 * *found = 1; a value of another type is an error naming `key` and `path` (never read as
 * absent, which would silently put a default in its place). */
sd_status sd_config_json_number(const sd_json *obj, const char *key, double *dst, int *found,
                                const char *path);
sd_status sd_config_json_bool(const sd_json *obj, const char *key, int *dst, int *found,
                              const char *path);

/* Whether c is a Gemma (2 or 3): embeddings x sqrt(D), sandwich norms, GeGLU. */
int sd_config_is_gemma(const sd_config *c);

/* Whether layer l attends through the sliding window (Mistral: every layer; Gemma: the local
 * ones, l % swa_pattern < swa_pattern - 1). */
int sd_config_layer_slides(const sd_config *c, int l);

/* What an error about the context length adds for c, into buf (n bytes): how a LongRoPE model
 * running with its short factors takes a longer context; "" otherwise. Returns buf. */
const char *sd_config_context_note(const sd_config *c, char *buf, size_t n);

/* YaRN's ramp for c: frequencies i <= lo are interpolated, i >= hi kept, a linear blend between
 * (the correction range of the frequencies that turn beta_fast and beta_slow times in the
 * original context, floor and ceiling, within [0, R - 1]; hi > lo). */
void sd_config_yarn_ramp(const sd_config *c, double *lo, double *hi);

/* YaRN's attention factor for a context `factor` times the original: 0.1 mscale ln(factor) + 1
 * (1 for factor <= 1). */
double sd_config_yarn_mscale(double factor, double mscale);

/* The rotated dimensions of each head: the first sd_config_rope_dim(c) (c->rope_dim, or Dh). */
int sd_config_rope_dim(const sd_config *c);

/* inv (R/2, R = sd_config_rope_dim(c)): RoPE's inverse frequencies theta^(-2i/R) after c's
 * scaling; `factors` (R/2, each > 0) are the file's divisors for SD_ROPE_FACTORS and unused
 * otherwise (LongRoPE's are in c). */
void sd_config_rope_freq(double *inv, const sd_config *c, const float *factors);

#endif /* SD_CONFIG_H */
