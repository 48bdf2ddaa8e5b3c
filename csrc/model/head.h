/* head.h — drafter heads that read the target's own features: EAGLE-1/2 (Li et al. 2024) and
 * EAGLE-3 (Li et al. 2025), loaded from their published files, and run as one-layer models over
 * the target's embedding (and, for EAGLE-1/2, its output head); and Medusa-1's heads (Cai et
 * al. 2024), residual blocks over the target's last hidden state.
 *
 * A head row at position t reads a vector x_t and the token text[t + 1], and predicts
 * text[t + 2]; its keys and values sit in its own small cache at position t.
 *   EAGLE-1/2: x_t = fc(cat(embedding(text[t + 1]), f_t)) (+ fc.bias unless config.json says
 *              "bias": false), f_t = the target's final-normed hidden state at t (or, for a
 *              drafted row, the head's own output at its parent); one decoder layer without an
 *              input norm; its output goes into the target's output head with no norm.
 *   EAGLE-3:   x_t = fc(cat(a_t at the target's layers l0, l1, l2)) for the text's rows (a_t:
 *              the residual stream entering that layer; layers 2, L / 2, L - 3 unless the
 *              config names them), the head's own pre-norm output at its parent for a drafted
 *              row; the layer's attention reads cat(rmsnorm(embedding) * input_layernorm,
 *              rmsnorm(x) * hidden_norm) (2D), the residual is x (or the normed x with
 *              norm_before_residual); then `norm` and its own lm_head over a draft vocabulary
 *              whose id d is the target's d + d2t[d].
 * Layouts read: SafeAILab's (EAGLE: fc, layers.0.*; EAGLE-3: fc, midlayer.*, norm, lm_head, d2t,
 * t2d) and vLLM speculators' EAGLE-3 (layers.0.* for midlayer.*, its config nesting the layer's
 * in transformer_layer_config), from model.safetensors or pytorch_model.bin (read without
 * torch). */
#ifndef SD_HEAD_H
#define SD_HEAD_H

#include "model/model.h"
#include "specdec.h"

/* The aux layers an EAGLE-3 head reads from `target` (3 of them) into aux; the count. */
int sd_head_aux_layers(const sd_head *h, const sd_model *target, int32_t *aux);

/* The width of the feature row a head reads at each text position, in floats: D (EAGLE-1/2:
 * the final-normed hidden state) or 3D (EAGLE-3: its three layers' inputs, in order). */
int sd_head_feature_width(const sd_head *h, const sd_model *target);

/* The head as a one-layer model over `target` (views of the head's file and of the target's
 * embedding and output head; the target's thread pool), for one request. The target must
 * outlive it; sd_model_free frees it. */
sd_status sd_head_bind(sd_model **out, const sd_head *h, sd_model *target);

/* x (T, D): the rows entering the head's layer for tokens[0 .. T) (text[t + 1] of each row) and
 * their features f (T, W): from_target 1: the target's (W = sd_head_feature_width), 0: the
 * head's own outputs at their parents (W = D). */
sd_status sd_head_rows(const sd_head *h, sd_model *hm, int T, const int32_t *tokens, const float *f,
                       int from_target, float *x);

/* The draft vocabulary's size (the rows of the head's logits) and, for EAGLE-3, the target id
 * of each draft id (NULL when the head's rows are the target's ids). */
int sd_head_vocab(const sd_head *h, const sd_model *target);
const int32_t *sd_head_target_ids(const sd_head *h);

/* One draft row's cost relative to a target forward: the weights it reads (the head's, and the
 * target's output head for EAGLE-1/2) over the target's. */
double sd_head_cost(const sd_head *h, const sd_model *target);

/* A head's logits rows (n, Vd) as the target's (n, V): -inf where the draft vocabulary has no
 * entry. out is raw (in place) or does not overlap it. */
sd_status sd_head_map_logits(const sd_head *h, int V, const float *raw, int n, float *out);

/* Medusa: the logits of every head at T final-normed hidden states x (T, D):
 * out (heads, T, V), head i predicting the token i + 2 after the one x was computed at. */
sd_status sd_head_medusa_logits(const sd_head *h, sd_model *target, int T, const float *x,
                                float *out);

#endif /* SD_HEAD_H */
