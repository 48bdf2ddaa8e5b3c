/* model_type.c — the Model type: a loaded model's configuration, threads and KV cache type, the
 * forward pass over a cache, llama.cpp-order logits, GGUF metadata and the benchmark hooks.
 * Decoding is in generate.c and sequence_type.c. */
#include "python/py_core.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check/llamacpp_order.h"
#include "format/gguf.h"
#include "model/config.h"

/* A new Model object owning m (freed on failure). */
PyObject *sd_py_model_wrap(sd_model *m) {
    sd_py_Model *self = PyObject_New(sd_py_Model, &sd_py_ModelType);
    if (self == NULL) {
        sd_model_free(m);
        return NULL;
    }
    self->model = m;
    self->owner = 0;
    self->waiting = 0;
    self->shared = 0;
    self->max_sequences = self->n_sequences = 0;
    self->first = self->last = NULL;
    if ((self->lock = PyThread_allocate_lock()) == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void model_dealloc(sd_py_Model *self) {
    sd_model_free(self->model);
    if (self->lock != NULL) {
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* {"type", "factor", ...} of c's RoPE scaling, or None when unscaled. */
static PyObject *rope_scaling_dict(const sd_config *c) {
    switch (c->rope_scaling) {
    case SD_ROPE_LINEAR:
        return Py_BuildValue("{s:s,s:d}", "type", "linear", "factor", (double)c->rope_factor);
    case SD_ROPE_LLAMA3:
        return Py_BuildValue(
            "{s:s,s:d,s:d,s:d,s:i}", "type", "llama3", "factor", (double)c->rope_factor,
            "low_freq_factor", (double)c->rope_low_freq_factor, "high_freq_factor",
            (double)c->rope_high_freq_factor, "original_context", c->rope_original_context);
    case SD_ROPE_FACTORS: /* the file's per-frequency divisors (GGUF rope_freqs.weight) */
        return Py_BuildValue("{s:s}", "type", "factors");
    case SD_ROPE_LONGROPE: /* Phi-3's: which factors the context chose */
        return Py_BuildValue("{s:s,s:s,s:i,s:d}", "type", "longrope", "factors",
                             c->rope_long ? "long" : "short", "original_context",
                             c->rope_original_context, "attention_factor",
                             (double)c->rope_attn_factor);
    case SD_ROPE_YARN:
        return Py_BuildValue("{s:s,s:d,s:i,s:d,s:d,s:d}", "type", "yarn", "factor",
                             (double)c->rope_factor, "original_context", c->rope_original_context,
                             "beta_fast", (double)c->rope_beta_fast, "beta_slow",
                             (double)c->rope_beta_slow, "attention_factor",
                             (double)c->rope_attn_factor);
    default: Py_RETURN_NONE;
    }
}

/* x, or None when x is 0 (a feature the model does not have). */
static PyObject *float_or_none(float x) {
    if (x == 0.0f) {
        Py_RETURN_NONE;
    }
    return PyFloat_FromDouble((double)x);
}

/* n, or None when n is 0 (a feature the model does not have). */
static PyObject *int_or_none(int n) {
    if (n <= 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLong(n);
}

/* The fields of specdec.model.ModelConfig. */
static PyObject *model_config(sd_py_Model *self, void *closure) {
    (void)closure;
    const sd_config *c = sd_model_config(self->model);
    PyObject *d = NULL, *rope = NULL, *types = NULL, *softcap = NULL, *local = NULL;
    PyObject *attn_softcap = NULL;
    PyObject *window = NULL, *nope = NULL, *escale = NULL, *rscale = NULL, *lscale = NULL;
    const double scale = c->attn_scale > 0.0f ? (double)c->attn_scale : 1.0 / sqrt(c->head_dim);
    if ((rope = rope_scaling_dict(c)) == NULL || (types = PyTuple_New(c->n_layers)) == NULL ||
        (softcap = float_or_none(c->final_softcap)) == NULL ||
        (attn_softcap = float_or_none(c->attn_softcap)) == NULL ||
        (local = float_or_none(c->swa_pattern > 0 ? c->rope_theta_local : 0.0f)) == NULL) {
        goto done;
    }
    for (int l = 0; l < c->n_layers; l++) {
        PyObject *t = PyUnicode_FromString(sd_config_layer_slides(c, l) ? "sliding_attention"
                                                                        : "full_attention");
        if (t == NULL) {
            goto done;
        }
        PyTuple_SET_ITEM(types, l, t);
    }
    if ((window = int_or_none(c->sliding_window)) == NULL ||
        (nope = int_or_none(c->no_rope_interval)) == NULL ||
        (escale = float_or_none(c->embed_scale)) == NULL ||
        (rscale = float_or_none(c->residual_scale)) == NULL ||
        (lscale = float_or_none(c->logit_scale)) == NULL) {
        goto done;
    }
    d = Py_BuildValue(
        "{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:d,s:d,s:O,s:O,s:O,s:O,s:s,s:O,s:O,"
        "s:O,s:O,s:d,s:O,s:O,s:i,s:O,s:O,s:O,s:O}",
        "arch", c->arch_name, "vocab_size", c->vocab_size, "hidden_size", c->hidden_size,
        "n_layers", c->n_layers, "n_heads", c->n_heads, "n_kv_heads", c->n_kv_heads, "head_dim",
        c->head_dim, "ffn_size", c->ffn_size, "context_length", c->context_length, "rope_theta",
        (double)c->rope_theta, "rms_eps", (double)c->rms_eps, "tied_embeddings",
        c->tied_embeddings ? Py_True : Py_False, "rope_neox", c->rope_neox ? Py_True : Py_False,
        "qkv_bias", c->has_qkv_bias ? Py_True : Py_False, "qk_norm",
        c->has_qk_norm ? Py_True : Py_False, "weight_type", sd_type_name(c->weight_type),
        "rope_scaling", rope, "rope_theta_local", local, "sliding_window", window, "layer_types",
        types, "attn_scale", scale, "final_softcap", softcap, "attn_softcap", attn_softcap,
        "rope_dim", sd_config_rope_dim(c), "no_rope_interval", nope, "embed_scale", escale,
        "residual_scale", rscale, "logit_scale", lscale);
done:
    Py_XDECREF(rope);
    Py_XDECREF(types);
    Py_XDECREF(softcap);
    Py_XDECREF(attn_softcap);
    Py_XDECREF(local);
    Py_XDECREF(window);
    Py_XDECREF(nope);
    Py_XDECREF(escale);
    Py_XDECREF(rscale);
    Py_XDECREF(lscale);
    return d;
}

static PyObject *model_get_threads(sd_py_Model *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(sd_model_threads(self->model));
}

static int model_set_threads(sd_py_Model *self, PyObject *value, void *closure) {
    (void)closure;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete threads");
        return -1;
    }
    long n = PyLong_AsLong(value);
    if (n == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (sd_py_model_enter(self) < 0) {
        return -1;
    }
    /* the core checks the range; a long beyond int saturates (and is out of it) */
    sd_status st = sd_model_set_threads(self->model, n > INT_MAX   ? INT_MAX
                                                     : n < INT_MIN ? INT_MIN
                                                                   : (int)n);
    sd_py_model_leave(self);
    if (st != SD_OK) {
        sd_py_raise(st);
        return -1;
    }
    return 0;
}

static PyObject *model_weight_bytes(sd_py_Model *self, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(sd_model_weight_bytes(self->model));
}

static PyObject *model_device(sd_py_Model *self, void *closure) {
    (void)closure;
    return PyUnicode_FromString(sd_model_device(self->model) == SD_DEVICE_CUDA ? "cuda" : "cpu");
}

/* bench_forward(T, context, iters) -> seconds per forward (sd_bench_forward). */
static PyObject *model_bench_forward(sd_py_Model *self, PyObject *args) {
    int T = 0, context = 0, iters = 0;
    if (!PyArg_ParseTuple(args, "iii:bench_forward", &T, &context, &iters)) {
        return NULL;
    }
    if (sd_py_model_enter(self) < 0) {
        return NULL;
    }
    double sec = 0.0;
    sd_status st;
    Py_BEGIN_ALLOW_THREADS st = sd_bench_forward(&sec, self->model, T, context, iters);
    Py_END_ALLOW_THREADS sd_py_model_leave(self);
    if (st != SD_OK) {
        return sd_py_raise(st);
    }
    return PyFloat_FromDouble(sec);
}

/* bench_synthetic(prompt, max_new_tokens, k, alpha, seed) -> (list[int], stats dict): the
 * benchmark-only loop of sd_bench_synthetic (its tokens are not the model's output). */
static PyObject *model_bench_synthetic(sd_py_Model *self, PyObject *args) {
    PyObject *prompt_obj = NULL;
    int max_new = 0, k = 0;
    double alpha = 0.0;
    unsigned long long seed = 0;
    if (!PyArg_ParseTuple(args, "OiidK:bench_synthetic", &prompt_obj, &max_new, &k, &alpha,
                          &seed)) {
        return NULL;
    }
    Py_ssize_t n_prompt = 0;
    int32_t *prompt = sd_py_tokens_from(prompt_obj, "prompt", &n_prompt);
    if (prompt == NULL) {
        return NULL;
    }
    int32_t *out = PyMem_Malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof(int32_t));
    PyObject *result = NULL, *list = NULL, *stats = NULL;
    if (out == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (n_prompt > INT32_MAX || sd_py_model_enter(self) < 0) {
        goto done;
    }
    sd_spec_stats ss;
    int n_out = 0;
    sd_status st;
    Py_BEGIN_ALLOW_THREADS st = sd_bench_synthetic(
        out, &n_out, &ss, self->model, prompt, (int)n_prompt, max_new, k, alpha, (uint64_t)seed);
    Py_END_ALLOW_THREADS sd_py_model_leave(self);
    if (st != SD_OK) {
        sd_py_raise(st);
        goto done;
    }
    list = sd_py_token_list(out, n_out);
    stats = sd_py_stats_dict(&ss, k);
    if (list != NULL && stats != NULL) {
        result = PyTuple_Pack(2, list, stats);
    }
done:
    Py_XDECREF(list);
    Py_XDECREF(stats);
    PyMem_Free(prompt);
    PyMem_Free(out);
    return result;
}

/* forward(cache, tokens, positions=None, slots=None, mask=None, n_logits=None) -> (n_logits, V);
 * n_logits None: all T rows. */
static PyObject *model_forward(sd_py_Model *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"cache",    "tokens", "positions",  "slots", "mask",
                             "n_logits", "hidden", "aux_layers", NULL};
    PyObject *cache_obj = NULL, *tok_obj = NULL, *pos_obj = Py_None, *slot_obj = Py_None;
    PyObject *mask_obj = Py_None, *n_logits_obj = Py_None, *aux_obj = Py_None;
    int want_hidden = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O|OOOO$pO:forward", kwlist, &sd_py_CacheType,
                                     &cache_obj, &tok_obj, &pos_obj, &slot_obj, &mask_obj,
                                     &n_logits_obj, &want_hidden, &aux_obj)) {
        return NULL;
    }
    const int features = want_hidden || aux_obj != Py_None;
    long n_logits = -1; /* None: all rows */
    if (n_logits_obj != Py_None) {
        if (PyBool_Check(n_logits_obj) || !PyLong_Check(n_logits_obj)) {
            PyErr_Format(PyExc_TypeError, "n_logits must be an integer or None, got %R",
                         n_logits_obj);
            return NULL;
        }
        int overflow = 0;
        const long long v = PyLong_AsLongLongAndOverflow(n_logits_obj, &overflow);
        if (v == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (overflow != 0 || v < INT_MIN || v > INT_MAX) { /* the core's check, unclamped */
            PyErr_Format(PyExc_ValueError, "n_logits %R is out of range [0, T]", n_logits_obj);
            return NULL;
        }
        n_logits = (long)v;
    }
    sd_py_Cache *cache = (sd_py_Cache *)cache_obj;
    if (cache->owner != (PyObject *)self) {
        PyErr_SetString(PyExc_ValueError, "cache was created by a different model");
        return NULL;
    }
    int32_t *tokens = NULL, *pos = NULL, *slots = NULL, *aux_layers = NULL;
    PyArrayObject *mask = NULL, *out = NULL, *hidden = NULL, *aux = NULL;
    Py_ssize_t T = 0, n = 0, n_aux = 0;
    const sd_config *c = sd_model_config(self->model);
    tokens = sd_py_tokens_from(tok_obj, "tokens", &T);
    if (tokens == NULL) {
        goto fail;
    }
    if (T < 1) {
        PyErr_SetString(PyExc_ValueError, "tokens must hold at least one token");
        goto fail;
    }
    if (pos_obj != Py_None) {
        if ((pos = sd_py_ints_from(pos_obj, "positions", &n)) == NULL) {
            goto fail;
        }
        if (n != T) {
            PyErr_Format(PyExc_ValueError, "positions has %zd entries, tokens has %zd", n, T);
            goto fail;
        }
    }
    if (slot_obj != Py_None) {
        if ((slots = sd_py_ints_from(slot_obj, "slots", &n)) == NULL) {
            goto fail;
        }
        if (n != T) {
            PyErr_Format(PyExc_ValueError, "slots has %zd entries, tokens has %zd", n, T);
            goto fail;
        }
    }
    if (mask_obj != Py_None) {
        mask = (PyArrayObject *)PyArray_FROMANY(mask_obj, NPY_UINT8, 2, 2, NPY_ARRAY_IN_ARRAY);
        if (mask == NULL) {
            goto fail;
        }
        if (PyArray_DIM(mask, 0) != T || PyArray_DIM(mask, 1) > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "mask must have shape (%zd, n_slots), got (%zd, %zd)", T,
                         (Py_ssize_t)PyArray_DIM(mask, 0), (Py_ssize_t)PyArray_DIM(mask, 1));
            goto fail;
        }
    }
    if (n_logits_obj == Py_None) {
        n_logits = (long)T;
    }
    /* the rows are allocated for a valid count; the forward checks the range (and fails) */
    npy_intp dims[2] = {n_logits < 0 ? 0 : n_logits > T ? T : n_logits, c->vocab_size};
    out = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_FLOAT32);
    if (out == NULL) {
        goto fail;
    }
    if (want_hidden) {
        npy_intp hd[2] = {T, c->hidden_size};
        if ((hidden = (PyArrayObject *)PyArray_SimpleNew(2, hd, NPY_FLOAT32)) == NULL) {
            goto fail;
        }
    }
    if (aux_obj != Py_None) {
        if ((aux_layers = sd_py_ints_from(aux_obj, "aux_layers", &n_aux)) == NULL) {
            goto fail;
        }
        /* the count is checked by the forward; the rows allocated for a valid one */
        npy_intp ad[3] = {n_aux <= SD_MAX_AUX_LAYERS ? n_aux : 0, T, c->hidden_size};
        if ((aux = (PyArrayObject *)PyArray_SimpleNew(3, ad, NPY_FLOAT32)) == NULL) {
            goto fail;
        }
    }
    if (sd_py_model_enter(self) < 0) {
        goto fail;
    }
    sd_batch b = {0};
    b.n_tokens = (int)T;
    b.tokens = tokens;
    b.pos = pos;
    b.slots = slots;
    b.mask = mask != NULL ? (const uint8_t *)PyArray_DATA(mask) : NULL;
    b.n_mask_cols = mask != NULL ? (int)PyArray_DIM(mask, 1) : 0;
    b.n_logits = n_logits > INT_MAX ? INT_MAX : n_logits < INT_MIN ? INT_MIN : (int)n_logits;
    b.hidden = hidden != NULL ? (float *)PyArray_DATA(hidden) : NULL;
    b.aux_layers = aux_layers;
    b.n_aux = n_aux > SD_MAX_AUX_LAYERS ? SD_MAX_AUX_LAYERS + 1 : (int)n_aux;
    b.aux = aux != NULL ? (float *)PyArray_DATA(aux) : NULL;
    sd_status st;
    float *dst = (float *)PyArray_DATA(out);
    Py_BEGIN_ALLOW_THREADS st = sd_forward(self->model, cache->kv, &b, dst);
    Py_END_ALLOW_THREADS sd_py_model_leave(self);
    if (st != SD_OK) {
        sd_py_raise(st);
        goto fail;
    }
    PyMem_Free(tokens);
    PyMem_Free(pos);
    PyMem_Free(slots);
    PyMem_Free(aux_layers);
    Py_XDECREF(mask);
    if (!features) {
        return (PyObject *)out;
    }
    /* (logits, hidden or None, aux or None) */
    return Py_BuildValue("(NNN)", out, hidden != NULL ? (PyObject *)hidden : Py_NewRef(Py_None),
                         aux != NULL ? (PyObject *)aux : Py_NewRef(Py_None));
fail:
    PyMem_Free(tokens);
    PyMem_Free(pos);
    PyMem_Free(slots);
    PyMem_Free(aux_layers);
    Py_XDECREF(mask);
    Py_XDECREF(out);
    Py_XDECREF(hidden);
    Py_XDECREF(aux);
    return NULL;
}

/* llamacpp_logits(tokens, n_batch) -> (T, V): the forward in llama.cpp's float order */
static PyObject *model_llamacpp_logits(sd_py_Model *self, PyObject *args) {
    PyObject *tok_obj = NULL;
    int n_batch = 0;
    if (!PyArg_ParseTuple(args, "Oi:llamacpp_logits", &tok_obj, &n_batch)) {
        return NULL;
    }
    Py_ssize_t T = 0;
    int32_t *tokens = sd_py_tokens_from(tok_obj, "tokens", &T);
    if (tokens == NULL) {
        return NULL;
    }
    PyArrayObject *out = NULL;
    if (T < 1 || T > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "tokens must hold at least one token");
        goto fail;
    }
    npy_intp dims[2] = {T, sd_model_config(self->model)->vocab_size};
    out = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_FLOAT32);
    if (out == NULL || sd_py_model_enter(self) < 0) {
        goto fail;
    }
    sd_status st;
    float *dst = (float *)PyArray_DATA(out);
    Py_BEGIN_ALLOW_THREADS st =
        sd_forward_llamacpp_order(self->model, tokens, (int)T, n_batch, dst);
    Py_END_ALLOW_THREADS sd_py_model_leave(self);
    if (st != SD_OK) {
        sd_py_raise(st);
        goto fail;
    }
    PyMem_Free(tokens);
    return (PyObject *)out;
fail:
    PyMem_Free(tokens);
    Py_XDECREF(out);
    return NULL;
}

static PyObject *model_new_cache(sd_py_Model *self, PyObject *args) {
    int n_slots = 0;
    if (!PyArg_ParseTuple(args, "i:new_cache", &n_slots)) {
        return NULL;
    }
    sd_kv_cache *kv = NULL;
    sd_status st = sd_kv_cache_create(&kv, self->model, n_slots);
    if (st != SD_OK) {
        return sd_py_raise(st);
    }
    sd_py_Cache *c = PyObject_New(sd_py_Cache, &sd_py_CacheType);
    if (c == NULL) {
        sd_kv_cache_free(kv);
        return NULL;
    }
    c->kv = kv;
    Py_INCREF(self);
    c->owner = (PyObject *)self;
    return (PyObject *)c;
}

static PyObject *model_set_token_pieces(sd_py_Model *self, PyObject *arg) {
    sd_py_bytes_list b;
    if (sd_py_bytes_list_from(&b, arg, "token pieces") < 0) {
        return NULL;
    }
    if (b.n > INT32_MAX || sd_py_model_enter(self) < 0) {
        sd_py_bytes_list_free(&b);
        return NULL;
    }
    sd_status st = sd_model_set_token_pieces(self->model, b.ptrs, b.lens, (int)b.n);
    sd_py_model_leave(self);
    sd_py_bytes_list_free(&b);
    if (st != SD_OK) {
        return sd_py_raise(st);
    }
    Py_RETURN_NONE;
}

/* One GGUF value at *p (validated by the loader), advancing *p past it: scalars as the reader
 * decodes them; strings that are not valid UTF-8 come back as bytes rather than altered. */
static PyObject *gguf_value(int type, const unsigned char **p, int depth) {
    const unsigned char *v = *p;
    uint64_t n = 0;
    const size_t size = sd_gguf_scalar_size((uint32_t)type);
    if (size > 0) {
        const sd_gguf_scalar x = sd_gguf_scalar_at((uint32_t)type, v);
        *p += size;
        switch (x.kind) {
        case SD_GGUF_KIND_INT: return PyLong_FromLongLong((long long)x.i);
        case SD_GGUF_KIND_FLOAT: return PyFloat_FromDouble(x.f);
        case SD_GGUF_KIND_BOOL: return PyBool_FromLong((long)x.u);
        default: return PyLong_FromUnsignedLongLong((unsigned long long)x.u);
        }
    }
    switch (type) {
    case SD_GGUF_STRING: {
        memcpy(&n, v, 8);
        *p += 8 + n;
        PyObject *str = PyUnicode_DecodeUTF8((const char *)v + 8, (Py_ssize_t)n, NULL);
        if (str == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            str = PyBytes_FromStringAndSize((const char *)v + 8, (Py_ssize_t)n);
        }
        return str;
    }
    case SD_GGUF_ARRAY: {
        uint32_t et;
        memcpy(&et, v, 4);
        memcpy(&n, v + 4, 8);
        *p += 12;
        if (depth > 8) {
            PyErr_SetString(PyExc_ValueError, "GGUF arrays nested too deeply");
            return NULL;
        }
        PyObject *list = PyList_New((Py_ssize_t)n);
        for (uint64_t i = 0; list != NULL && i < n; i++) {
            PyObject *item = gguf_value((int)et, p, depth + 1);
            if (item == NULL) {
                Py_CLEAR(list);
                break;
            }
            PyList_SET_ITEM(list, (Py_ssize_t)i, item);
        }
        return list;
    }
    default: PyErr_Format(PyExc_ValueError, "unknown GGUF value type %d", type); return NULL;
    }
}

static PyObject *model_gguf_metadata(sd_py_Model *self, PyObject *unused) {
    (void)unused;
    int n = sd_model_metadata_count(self->model);
    PyObject *dict = PyDict_New();
    for (int i = 0; dict != NULL && i < n; i++) {
        const char *key = NULL;
        int type = 0;
        const unsigned char *raw = NULL;
        sd_status st = sd_model_metadata_entry(self->model, i, &key, &type, &raw);
        if (st != SD_OK) {
            Py_CLEAR(dict);
            return sd_py_raise(st);
        }
        PyObject *value = gguf_value(type, &raw, 0);
        if (value == NULL || PyDict_SetItemString(dict, key, value) < 0) {
            Py_XDECREF(value);
            Py_CLEAR(dict);
            break;
        }
        Py_DECREF(value);
    }
    return dict;
}

static PyObject *model_try_reserve(sd_py_Model *self, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(sd_py_sequence_try_admit(self));
}

static PyObject *model_unreserve(sd_py_Model *self, PyObject *unused) {
    (void)unused;
    if (self->n_sequences <= 0) {
        PyErr_SetString(PyExc_RuntimeError, "no sequence slot is taken");
        return NULL;
    }
    sd_py_sequence_release(self);
    Py_RETURN_NONE;
}

static PyMethodDef model_methods[] = {
    {"gguf_metadata", (PyCFunction)model_gguf_metadata, METH_NOARGS,
     "gguf_metadata() -> dict of the GGUF key/value metadata ({} for HF directories)"},
    {"forward", (PyCFunction)(void (*)(void))model_forward, METH_VARARGS | METH_KEYWORDS,
     "forward(cache, tokens, positions=None, slots=None, mask=None, n_logits=None) -> ndarray"},
    {"new_cache", (PyCFunction)model_new_cache, METH_VARARGS, "new_cache(n_slots) -> KVCache"},
    {"llamacpp_logits", (PyCFunction)model_llamacpp_logits, METH_VARARGS,
     "llamacpp_logits(tokens, n_batch) -> ndarray: logits in llama.cpp's float order"},
    {"generate", (PyCFunction)(void (*)(void))sd_py_model_generate, METH_VARARGS | METH_KEYWORDS,
     "generate(prompt, *, max_new_tokens=16, temperature=0.0, seed=0, stop_ids=None, "
     "stop_strings=None, top_k=0, top_p=1.0, min_p=0.0, drafter=None, check_cache=False, "
     "on_token=None) -> (tokens, finish_reason, stats): the whole loop in one call"},
    {"sequence", (PyCFunction)(void (*)(void))sd_py_model_sequence, METH_VARARGS | METH_KEYWORDS,
     "sequence(prompt, *, ...) -> Sequence: generate's arguments (on_token aside), decoded a "
     "step at a time by Sequence.step(); waits for a free slot under max_sequences, unless "
     "reserved=True (a slot taken by try_reserve, which stays the caller's if this fails)"},
    {"try_reserve", (PyCFunction)model_try_reserve, METH_NOARGS,
     "try_reserve() -> bool: takes a sequence slot now if one is free and no one waits "
     "(asyncio admission: the event loop never blocks)"},
    {"unreserve", (PyCFunction)model_unreserve, METH_NOARGS,
     "unreserve(): gives back a slot taken by try_reserve that no sequence took"},
    {"bench_forward", (PyCFunction)model_bench_forward, METH_VARARGS,
     "bench_forward(T, context, iters) -> seconds per forward over T tokens"},
    {"bench_synthetic", (PyCFunction)model_bench_synthetic, METH_VARARGS,
     "bench_synthetic(prompt, max_new_tokens, k, alpha, seed) -> (tokens, stats): benchmarks "
     "only (sd_bench_synthetic)"},
    {"set_token_pieces", (PyCFunction)model_set_token_pieces, METH_O,
     "set_token_pieces(list of bytes): the bytes of every token id, for stop strings"},
    {NULL, NULL, 0, NULL},
};

static PyObject *model_get_max_sequences(sd_py_Model *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(self->max_sequences);
}

static int model_set_max_sequences(sd_py_Model *self, PyObject *value, void *closure) {
    (void)closure;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete max_sequences");
        return -1;
    }
    const long n = PyLong_AsLong(value);
    if (n == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (n < 0 || n > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "max_sequences must be >= 0 (0: no limit), got %ld", n);
        return -1;
    }
    self->max_sequences = (int)n;
    return 0;
}

static PyObject *model_get_open_sequences(sd_py_Model *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(self->n_sequences);
}

static PyObject *model_get_scheduler_stats(sd_py_Model *self, void *closure) {
    (void)closure;
    if (self->model == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "model is not loaded");
        return NULL;
    }
    long long forwards = 0, steps = 0;
    sd_model_sched_counts(self->model, &forwards, &steps);
    return Py_BuildValue("{sLsL}", "steps", steps, "forwards", forwards);
}

static PyObject *model_get_prefix_cache(sd_py_Model *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(sd_model_prefix_cache(self->model));
}

static int model_set_prefix_cache(sd_py_Model *self, PyObject *value, void *closure) {
    (void)closure;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete prefix_cache");
        return -1;
    }
    const long n = PyLong_AsLong(value);
    if (n == -1 && PyErr_Occurred()) {
        return -1;
    }
    /* the core checks the range; a long beyond int saturates (and is out of it) */
    const sd_status st = sd_model_set_prefix_cache(self->model, n > INT_MAX   ? INT_MAX
                                                                : n < INT_MIN ? INT_MIN
                                                                              : (int)n);
    if (st != SD_OK) {
        sd_py_raise(st);
        return -1;
    }
    return 0;
}

static PyObject *model_get_kv_dtype(sd_py_Model *self, void *closure) {
    (void)closure;
    return PyUnicode_FromString(sd_model_kv_f16(self->model) ? "f16" : "f32");
}

static int model_set_kv_dtype(sd_py_Model *self, PyObject *value, void *closure) {
    (void)closure;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete kv_dtype");
        return -1;
    }
    const char *s = PyUnicode_Check(value) ? PyUnicode_AsUTF8(value) : NULL;
    if (s == NULL || (strcmp(s, "f16") != 0 && strcmp(s, "f32") != 0)) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "kv_dtype must be 'f16' or 'f32', got %R", value);
        return -1;
    }
    if (sd_py_model_enter(self) < 0) {
        return -1;
    }
    sd_status st = sd_model_set_kv_f16(self->model, strcmp(s, "f16") == 0);
    sd_py_model_leave(self);
    if (st != SD_OK) {
        sd_py_raise(st);
        return -1;
    }
    return 0;
}

static PyGetSetDef model_getset[] = {
    {"config", (getter)model_config, NULL, "hyper-parameters as a dict", NULL},
    {"threads", (getter)model_get_threads, (setter)model_set_threads, "worker threads", NULL},
    {"max_sequences", (getter)model_get_max_sequences, (setter)model_set_max_sequences,
     "the most sequences open at once (0: no limit); Model.sequence waits for a free slot", NULL},
    {"open_sequences", (getter)model_get_open_sequences, NULL, "sequences open now", NULL},
    {"scheduler_stats", (getter)model_get_scheduler_stats, NULL,
     "{'steps': n, 'forwards': m}: the sequence steps run on this model so far and the forwards "
     "they took (steps of requests running at once share one forward)",
     NULL},
    {"prefix_cache", (getter)model_get_prefix_cache, (setter)model_set_prefix_cache,
     "finished requests' caches kept for prefix reuse", NULL},
    {"kv_dtype", (getter)model_get_kv_dtype, (setter)model_set_kv_dtype,
     "element type of the KV caches created from now on: 'f16' or 'f32'", NULL},
    {"weight_bytes", (getter)model_weight_bytes, NULL, "bytes of weights one forward reads", NULL},
    {"device", (getter)model_device, NULL, "'cpu' or 'cuda'", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject sd_py_ModelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "specdec._core.Model",
    .tp_basicsize = sizeof(sd_py_Model),
    .tp_dealloc = (destructor)model_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A loaded model (C core). Create with specdec._core.load().",
    .tp_methods = model_methods,
    .tp_getset = model_getset,
};
