/* py_module.c — the Python boundary, and the only file that includes Python.h and NumPy.
 * Converts arguments with explicit dtypes, releases the GIL around every C call that computes,
 * and maps sd_status to Python exceptions carrying the core's message. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <stdint.h>
#include <string.h>

#include "check/llamacpp_order.h"
#include "spec/lookup.h"
#include "specdec.h"
#include "util/threadpool.h"
#include "spec/verify.h"

/* ---- errors ---------------------------------------------------------------------------------- */

static PyObject *raise_status(sd_status st) {
    if (PyErr_Occurred()) {
        return NULL; /* never overwrite an exception already set */
    }
    PyObject *type;
    switch (st) {
    case SD_ERR_INVALID_ARG:
    case SD_ERR_FORMAT:
    case SD_ERR_UNSUPPORTED: type = PyExc_ValueError; break;
    case SD_ERR_IO: type = PyExc_OSError; break;
    case SD_ERR_NOMEM: type = PyExc_MemoryError; break;
    default: type = PyExc_RuntimeError; break;
    }
    const char *msg = sd_last_error();
    PyErr_SetString(type, msg[0] != '\0' ? msg : sd_status_name(st));
    return NULL;
}

/* ---- objects --------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD sd_model *model;
    int busy; /* set while a call runs without the GIL: a second thread gets an error, not a race */
} ModelObject;

typedef struct {
    PyObject_HEAD sd_kv_cache *kv;
    PyObject *owner; /* the ModelObject this cache was made for */
} CacheObject;

static PyTypeObject ModelType;
static PyTypeObject CacheType;
static PyObject *stats_dict(const sd_spec_stats *st, int k);

/* A Python list of n token ids. */
static PyObject *token_list(const int32_t *out, int n) {
    PyObject *list = PyList_New(n);
    for (int i = 0; list != NULL && i < n; i++) {
        PyObject *v = PyLong_FromLong(out[i]);
        if (v == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

static int model_enter(ModelObject *self) {
    if (self->model == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "model is not loaded");
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this model is already running a call in another thread; use one "
                        "model per thread");
        return -1;
    }
    self->busy = 1;
    return 0;
}

static void model_leave(ModelObject *self) {
    self->busy = 0;
}

/* A 1-D int32 copy of a token sequence. Only integers are token ids (floats and bools are a
 * TypeError, not silently truncated); ids outside int32 are reported as out of range. */
static int32_t *tokens_from(PyObject *obj, const char *what, Py_ssize_t *n) {
    PyArrayObject *raw = NULL, *a = NULL;
    int32_t *dst = NULL;
    raw = (PyArrayObject *)PyArray_FromAny(obj, NULL, 1, 1, NPY_ARRAY_DEFAULT, NULL);
    if (raw == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_ValueError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s must be a 1-D sequence of integer token ids", what);
        }
        goto fail;
    }
    if (PyArray_SIZE(raw) > 0) {
        int ok = PyArray_ISINTEGER(raw);
        if (PyArray_TYPE(raw) == NPY_OBJECT) { /* e.g. Python ints beyond 64 bits */
            PyObject **items = (PyObject **)PyArray_DATA(raw);
            ok = 1;
            for (npy_intp i = 0; i < PyArray_SIZE(raw) && ok; i++) {
                ok = PyLong_Check(items[i]) && !PyBool_Check(items[i]);
            }
        }
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s must be integer token ids, got %s values", what,
                         PyArray_DESCR(raw)->typeobj->tp_name);
            goto fail;
        }
    }
    a = (PyArrayObject *)PyArray_FROMANY((PyObject *)raw, NPY_INT64, 1, 1,
                                         NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (a == NULL) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s: a token id is out of range (beyond 64 bits)", what);
        }
        goto fail;
    }
    *n = PyArray_DIM(a, 0);
    const int64_t *src = (const int64_t *)PyArray_DATA(a);
    dst = PyMem_Malloc((size_t)(*n > 0 ? *n : 1) * sizeof(int32_t));
    if (dst == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        if (src[i] < INT32_MIN || src[i] > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "%s: token id %lld at index %zd is out of range", what,
                         (long long)src[i], i);
            goto fail;
        }
        dst[i] = (int32_t)src[i];
    }
    Py_DECREF(raw);
    Py_DECREF(a);
    return dst;
fail:
    PyMem_Free(dst);
    Py_XDECREF(raw);
    Py_XDECREF(a);
    return NULL;
}

/* ---- module functions ------------------------------------------------------------------------ */

/* A new Model object owning m (freed on failure). */
static PyObject *model_wrap(sd_model *m) {
    ModelObject *self = PyObject_New(ModelObject, &ModelType);
    if (self == NULL) {
        sd_model_free(m);
        return NULL;
    }
    self->model = m;
    self->busy = 0;
    return (PyObject *)self;
}

static sd_model_params model_params(int threads, int device, int gpu) {
    sd_model_params p = sd_model_default_params();
    p.n_threads = threads;
    p.device = device;
    p.gpu = gpu;
    return p;
}

/* load(path, threads=0, device=0, gpu=0) -> Model */
static PyObject *core_load(PyObject *mod, PyObject *args, PyObject *kwds) {
    (void)mod;
    static char *kwlist[] = {"path", "threads", "device", "gpu", NULL};
    PyObject *path_obj = NULL;
    int threads = 0, device = SD_DEVICE_CPU, gpu = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&|iii:load", kwlist, PyUnicode_FSConverter,
                                     &path_obj, &threads, &device, &gpu)) {
        return NULL;
    }
    const sd_model_params p = model_params(threads, device, gpu);
    sd_model *m = NULL;
    sd_status st;
    const char *path = PyBytes_AS_STRING(path_obj);
    Py_BEGIN_ALLOW_THREADS st = sd_model_load(&m, path, &p);
    Py_END_ALLOW_THREADS Py_DECREF(path_obj);
    if (st != SD_OK) {
        return raise_status(st);
    }
    return model_wrap(m);
}

/* An int field of a config dict (required). */
static int dict_int(PyObject *d, const char *key, int *out) {
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    if (v == NULL || !PyLong_Check(v) || PyBool_Check(v)) {
        PyErr_Format(PyExc_ValueError, "the shape needs an integer '%s'", key);
        return -1;
    }
    const long x = PyLong_AsLong(v);
    if (x == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (x <= 0 || x > (1L << 30)) {
        PyErr_Format(PyExc_ValueError, "'%s' must be a positive integer, got %ld", key, x);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* dummy(shape: dict, weight_type, seed, threads=0, device=0, gpu=0) -> Model with random
 * weights (sd_model_create_dummy); shape: arch ("llama" | "qwen2"), vocab_size, hidden_size,
 * n_layers, n_heads, n_kv_heads, head_dim, ffn_size, context_length (ints), rope_theta,
 * rms_eps (floats), tied_embeddings (bool). */
static PyObject *core_dummy(PyObject *mod, PyObject *args, PyObject *kwds) {
    (void)mod;
    static char *kwlist[] = {"shape", "weight_type", "seed", "threads", "device", "gpu", NULL};
    PyObject *shape = NULL;
    int weight_type = 0, threads = 0, device = SD_DEVICE_CPU, gpu = 0;
    unsigned long long seed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!iK|iii:dummy", kwlist, &PyDict_Type, &shape,
                                     &weight_type, &seed, &threads, &device, &gpu)) {
        return NULL;
    }
    sd_config c;
    memset(&c, 0, sizeof(c));
    PyObject *arch = PyDict_GetItemString(shape, "arch");
    const char *an = arch != NULL && PyUnicode_Check(arch) ? PyUnicode_AsUTF8(arch) : NULL;
    if (an == NULL || (strcmp(an, "llama") != 0 && strcmp(an, "qwen2") != 0)) {
        PyErr_SetString(PyExc_ValueError, "the shape's 'arch' must be 'llama' or 'qwen2'");
        return NULL;
    }
    c.arch = strcmp(an, "qwen2") == 0 ? SD_ARCH_QWEN2 : SD_ARCH_LLAMA;
    if (dict_int(shape, "vocab_size", &c.vocab_size) < 0 ||
        dict_int(shape, "hidden_size", &c.hidden_size) < 0 ||
        dict_int(shape, "n_layers", &c.n_layers) < 0 ||
        dict_int(shape, "n_heads", &c.n_heads) < 0 ||
        dict_int(shape, "n_kv_heads", &c.n_kv_heads) < 0 ||
        dict_int(shape, "head_dim", &c.head_dim) < 0 ||
        dict_int(shape, "ffn_size", &c.ffn_size) < 0 ||
        dict_int(shape, "context_length", &c.context_length) < 0) {
        return NULL;
    }
    PyObject *theta = PyDict_GetItemString(shape, "rope_theta");
    PyObject *eps = PyDict_GetItemString(shape, "rms_eps");
    PyObject *tied = PyDict_GetItemString(shape, "tied_embeddings");
    c.rope_theta = theta != NULL ? (float)PyFloat_AsDouble(theta) : 10000.0f;
    c.rms_eps = eps != NULL ? (float)PyFloat_AsDouble(eps) : 1e-5f;
    c.tied_embeddings = tied != NULL ? PyObject_IsTrue(tied) : 0;
    if (PyErr_Occurred()) {
        return NULL;
    }
    const sd_model_params p = model_params(threads, device, gpu);
    sd_model *m = NULL;
    sd_status st;
    Py_BEGIN_ALLOW_THREADS st = sd_model_create_dummy(&m, &c, weight_type, (uint64_t)seed, &p);
    Py_END_ALLOW_THREADS if (st != SD_OK) {
        return raise_status(st);
    }
    return model_wrap(m);
}

/* kernel(name, device, args: list) -> None: run a CUDA kernel (device 1) or its CPU twin
 * (device 0) on NumPy arrays, which are written in place (sd_kernel_run). Arrays must be
 * C-contiguous and writable; None is a NULL array; ints and floats are scalars (ints up to
 * 2^64 - 1 keep their bits: seeds). */
static PyObject *core_kernel(PyObject *mod, PyObject *args) {
    (void)mod;
    const char *name = NULL;
    int device = 0;
    PyObject *list = NULL;
    if (!PyArg_ParseTuple(args, "siO!:kernel", &name, &device, &PyList_Type, &list)) {
        return NULL;
    }
    const Py_ssize_t n = PyList_GET_SIZE(list);
    if (n > 16) {
        PyErr_SetString(PyExc_ValueError, "at most 16 kernel arguments");
        return NULL;
    }
    sd_karg a[16];
    memset(a, 0, sizeof(a));
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *v = PyList_GET_ITEM(list, j);
        if (v == Py_None) {
            continue;
        }
        if (PyArray_Check(v)) {
            PyArrayObject *arr = (PyArrayObject *)v;
            if (!PyArray_IS_C_CONTIGUOUS(arr) || !PyArray_ISWRITEABLE(arr)) {
                PyErr_Format(PyExc_ValueError,
                             "kernel argument %zd must be a C-contiguous writable array", j);
                return NULL;
            }
            a[j].data = PyArray_DATA(arr);
            a[j].bytes = (size_t)PyArray_NBYTES(arr);
            if (a[j].data == NULL || a[j].bytes == 0) {
                a[j].data = a; /* an empty array: a valid pointer to no bytes */
                a[j].bytes = 0;
            }
        } else if (PyFloat_Check(v)) {
            a[j].f = PyFloat_AsDouble(v);
        } else if (PyLong_Check(v)) {
            int overflow = 0;
            const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow > 0) {
                const unsigned long long u = PyLong_AsUnsignedLongLong(v);
                if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                    return NULL;
                }
                a[j].i = (int64_t)u;
            } else if (overflow < 0 || (x == -1 && PyErr_Occurred())) {
                PyErr_Format(PyExc_ValueError, "kernel argument %zd is out of range", j);
                return NULL;
            } else {
                a[j].i = x;
            }
            a[j].f = (double)a[j].i;
        } else {
            PyErr_Format(PyExc_TypeError,
                         "kernel argument %zd must be an array, None, an int or a float", j);
            return NULL;
        }
    }
    sd_status st;
    Py_BEGIN_ALLOW_THREADS st = sd_kernel_run(name, device, a, (int)n);
    Py_END_ALLOW_THREADS if (st != SD_OK) {
        return raise_status(st);
    }
    Py_RETURN_NONE;
}

/* copy_bench(gpu, bytes, iters) -> seconds per device-to-device copy (sd_bench_copy). */
static PyObject *core_copy_bench(PyObject *mod, PyObject *args) {
    (void)mod;
    int gpu = 0, iters = 0;
    unsigned long long bytes = 0;
    if (!PyArg_ParseTuple(args, "iKi:copy_bench", &gpu, &bytes, &iters)) {
        return NULL;
    }
    if (iters < 1 || bytes == 0) {
        PyErr_SetString(PyExc_ValueError, "copy_bench needs bytes > 0 and iters >= 1");
        return NULL;
    }
    double sec = 0.0;
    sd_status st;
    Py_BEGIN_ALLOW_THREADS st = sd_bench_copy(&sec, gpu, (size_t)bytes, iters);
    Py_END_ALLOW_THREADS if (st != SD_OK) {
        return raise_status(st);
    }
    return PyFloat_FromDouble(sec);
}

/* bench_attention(T, n_attn, n_heads, n_kv_heads, head_dim, n_layers, threads, iters) ->
 * seconds per pass over the layers (sd_bench_attention). */
static PyObject *core_bench_attention(PyObject *mod, PyObject *args) {
    (void)mod;
    int T = 0, n_attn = 0, H = 0, Hkv = 0, Dh = 0, layers = 0, threads = 0, iters = 0;
    if (!PyArg_ParseTuple(args, "iiiiiiii:bench_attention", &T, &n_attn, &H, &Hkv, &Dh, &layers,
                          &threads, &iters)) {
        return NULL;
    }
    double sec = 0.0;
    sd_status st;
    Py_BEGIN_ALLOW_THREADS st =
        sd_bench_attention(&sec, T, n_attn, H, Hkv, Dh, layers, threads, iters);
    Py_END_ALLOW_THREADS if (st != SD_OK) {
        return raise_status(st);
    }
    return PyFloat_FromDouble(sec);
}

/* lookup_draft(tokens, k, max_ngram, min_ngram) -> (draft, n_match, extent): the prompt-lookup
 * draft after tokens (sd_lookup_draft), a test and research hook. */
static PyObject *core_lookup_draft(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *t_obj;
    int k = 0, max_ngram = 0, min_ngram = 0;
    if (!PyArg_ParseTuple(args, "Oiii:lookup_draft", &t_obj, &k, &max_ngram, &min_ngram)) {
        return NULL;
    }
    if (k < 1 || k > SD_MAX_DRAFT || min_ngram < 1 || max_ngram < min_ngram) {
        PyErr_Format(PyExc_ValueError,
                     "lookup_draft needs 1 <= k <= %d and 1 <= min_ngram <= max_ngram, got k=%d, "
                     "max_ngram=%d, min_ngram=%d",
                     SD_MAX_DRAFT, k, max_ngram, min_ngram);
        return NULL;
    }
    PyArrayObject *t =
        (PyArrayObject *)PyArray_FROMANY(t_obj, NPY_INT32, 1, 1, NPY_ARRAY_IN_ARRAY);
    if (t == NULL) {
        return NULL;
    }
    if (PyArray_DIM(t, 0) > INT32_MAX) {
        Py_DECREF(t);
        PyErr_SetString(PyExc_ValueError, "lookup_draft: too many tokens");
        return NULL;
    }
    int32_t draft[SD_MAX_DRAFT];
    int n_match = 0, extent = 0;
    const int n = sd_lookup_draft(draft, &n_match, &extent, (const int32_t *)PyArray_DATA(t),
                                  (int)PyArray_DIM(t, 0), max_ngram, min_ngram, k);
    Py_DECREF(t);
    PyObject *l = PyList_New(n);
    if (l == NULL) {
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        PyList_SET_ITEM(l, i, PyLong_FromLong(draft[i]));
    }
    return Py_BuildValue("(Nii)", l, n_match, extent);
}

static PyObject *core_kernel_names(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
    PyObject *l = PyList_New(0);
    for (int i = 0; l != NULL && sd_kernel_names(i) != NULL; i++) {
        PyObject *s = PyUnicode_FromString(sd_kernel_names(i));
        if (s == NULL || PyList_Append(l, s) < 0) {
            Py_XDECREF(s);
            Py_CLEAR(l);
            break;
        }
        Py_DECREF(s);
    }
    return l;
}

static PyObject *core_simd_name(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
    return PyUnicode_FromString(sd_simd_name());
}

static PyObject *core_built_with_cuda(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
    return PyBool_FromLong(sd_built_with_cuda());
}

/* ---- Model ----------------------------------------------------------------------------------- */

static void model_dealloc(ModelObject *self) {
    sd_model_free(self->model);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *model_config(ModelObject *self, void *closure) {
    (void)closure;
    const sd_config *c = sd_model_config(self->model);
    return Py_BuildValue(
        "{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:d,s:d,s:O,s:O,s:O,s:s}", "arch", c->arch_name,
        "vocab_size", c->vocab_size, "hidden_size", c->hidden_size, "n_layers", c->n_layers,
        "n_heads", c->n_heads, "n_kv_heads", c->n_kv_heads, "head_dim", c->head_dim, "ffn_size",
        c->ffn_size, "context_length", c->context_length, "rope_theta", (double)c->rope_theta,
        "rms_eps", (double)c->rms_eps, "tied_embeddings", c->tied_embeddings ? Py_True : Py_False,
        "rope_neox", c->rope_neox ? Py_True : Py_False, "qkv_bias",
        c->has_qkv_bias ? Py_True : Py_False, "weight_type", sd_type_name(c->weight_type));
}

static PyObject *model_get_threads(ModelObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(sd_model_threads(self->model));
}

static int model_set_threads(ModelObject *self, PyObject *value, void *closure) {
    (void)closure;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete threads");
        return -1;
    }
    long n = PyLong_AsLong(value);
    if (n == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (n < 1 || n > 1024) {
        PyErr_Format(PyExc_ValueError, "threads must be in [1, 1024], got %ld", n);
        return -1;
    }
    if (model_enter(self) < 0) {
        return -1;
    }
    sd_status st = sd_model_set_threads(self->model, (int)n);
    model_leave(self);
    if (st != SD_OK) {
        raise_status(st);
        return -1;
    }
    return 0;
}

static PyObject *model_weight_bytes(ModelObject *self, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(sd_model_weight_bytes(self->model));
}

static PyObject *model_device(ModelObject *self, void *closure) {
    (void)closure;
    return PyUnicode_FromString(sd_model_device(self->model) == SD_DEVICE_CUDA ? "cuda" : "cpu");
}

/* bench_forward(T, context, iters) -> seconds per forward (sd_bench_forward). */
static PyObject *model_bench_forward(ModelObject *self, PyObject *args) {
    int T = 0, context = 0, iters = 0;
    if (!PyArg_ParseTuple(args, "iii:bench_forward", &T, &context, &iters)) {
        return NULL;
    }
    if (model_enter(self) < 0) {
        return NULL;
    }
    double sec = 0.0;
    sd_status st;
    Py_BEGIN_ALLOW_THREADS st = sd_bench_forward(&sec, self->model, T, context, iters);
    Py_END_ALLOW_THREADS model_leave(self);
    if (st != SD_OK) {
        return raise_status(st);
    }
    return PyFloat_FromDouble(sec);
}

/* bench_synthetic(prompt, max_new_tokens, k, alpha, seed) -> (list[int], stats dict): the
 * benchmark-only loop of sd_bench_synthetic (its tokens are not the model's output). */
static PyObject *model_bench_synthetic(ModelObject *self, PyObject *args) {
    PyObject *prompt_obj = NULL;
    int max_new = 0, k = 0;
    double alpha = 0.0;
    unsigned long long seed = 0;
    if (!PyArg_ParseTuple(args, "OiidK:bench_synthetic", &prompt_obj, &max_new, &k, &alpha,
                          &seed)) {
        return NULL;
    }
    if (max_new < 0) {
        PyErr_Format(PyExc_ValueError, "max_new_tokens must be >= 0, got %d", max_new);
        return NULL;
    }
    Py_ssize_t n_prompt = 0;
    int32_t *prompt = tokens_from(prompt_obj, "prompt", &n_prompt);
    if (prompt == NULL) {
        return NULL;
    }
    int32_t *out = PyMem_Malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof(int32_t));
    PyObject *result = NULL, *list = NULL, *stats = NULL;
    if (out == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (n_prompt > INT32_MAX || model_enter(self) < 0) {
        goto done;
    }
    sd_spec_stats ss;
    int n_out = 0;
    sd_status st;
    Py_BEGIN_ALLOW_THREADS st = sd_bench_synthetic(
        out, &n_out, &ss, self->model, prompt, (int)n_prompt, max_new, k, alpha, (uint64_t)seed);
    Py_END_ALLOW_THREADS model_leave(self);
    if (st != SD_OK) {
        raise_status(st);
        goto done;
    }
    list = token_list(out, n_out);
    stats = stats_dict(&ss, k);
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

/* forward(cache, tokens, positions=None, slots=None, mask=None, n_logits=-1) -> (n_logits, V) */
static PyObject *model_forward(ModelObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"cache", "tokens", "positions", "slots", "mask", "n_logits", NULL};
    PyObject *cache_obj = NULL, *tok_obj = NULL, *pos_obj = Py_None, *slot_obj = Py_None;
    PyObject *mask_obj = Py_None;
    int n_logits = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O|OOOi:forward", kwlist, &CacheType, &cache_obj,
                                     &tok_obj, &pos_obj, &slot_obj, &mask_obj, &n_logits)) {
        return NULL;
    }
    CacheObject *cache = (CacheObject *)cache_obj;
    if (cache->owner != (PyObject *)self) {
        PyErr_SetString(PyExc_ValueError, "cache was created by a different model");
        return NULL;
    }
    int32_t *tokens = NULL, *pos = NULL, *slots = NULL;
    PyArrayObject *mask = NULL, *out = NULL;
    Py_ssize_t T = 0, n = 0;
    const sd_config *c = sd_model_config(self->model);
    tokens = tokens_from(tok_obj, "tokens", &T);
    if (tokens == NULL) {
        goto fail;
    }
    if (T < 1) {
        PyErr_SetString(PyExc_ValueError, "tokens must hold at least one token");
        goto fail;
    }
    if (pos_obj != Py_None) {
        if ((pos = tokens_from(pos_obj, "positions", &n)) == NULL) {
            goto fail;
        }
        if (n != T) {
            PyErr_Format(PyExc_ValueError, "positions has %zd entries, tokens has %zd", n, T);
            goto fail;
        }
    }
    if (slot_obj != Py_None) {
        if ((slots = tokens_from(slot_obj, "slots", &n)) == NULL) {
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
    if (n_logits < 0) {
        n_logits = (int)T;
    }
    if (n_logits > T) {
        PyErr_Format(PyExc_ValueError, "n_logits %d exceeds the %zd tokens", n_logits, T);
        goto fail;
    }
    npy_intp dims[2] = {n_logits, c->vocab_size};
    out = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_FLOAT32);
    if (out == NULL || model_enter(self) < 0) {
        goto fail;
    }
    sd_batch b = {0};
    b.n_tokens = (int)T;
    b.tokens = tokens;
    b.pos = pos;
    b.slots = slots;
    b.mask = mask != NULL ? (const uint8_t *)PyArray_DATA(mask) : NULL;
    b.n_mask_cols = mask != NULL ? (int)PyArray_DIM(mask, 1) : 0;
    b.n_logits = n_logits;
    sd_status st;
    float *dst = (float *)PyArray_DATA(out);
    Py_BEGIN_ALLOW_THREADS st = sd_forward(self->model, cache->kv, &b, dst);
    Py_END_ALLOW_THREADS model_leave(self);
    if (st != SD_OK) {
        raise_status(st);
        goto fail;
    }
    PyMem_Free(tokens);
    PyMem_Free(pos);
    PyMem_Free(slots);
    Py_XDECREF(mask);
    return (PyObject *)out;
fail:
    PyMem_Free(tokens);
    PyMem_Free(pos);
    PyMem_Free(slots);
    Py_XDECREF(mask);
    Py_XDECREF(out);
    return NULL;
}

/* llamacpp_logits(tokens, n_batch) -> (T, V): the forward in llama.cpp's float order */
static PyObject *model_llamacpp_logits(ModelObject *self, PyObject *args) {
    PyObject *tok_obj = NULL;
    int n_batch = 0;
    if (!PyArg_ParseTuple(args, "Oi:llamacpp_logits", &tok_obj, &n_batch)) {
        return NULL;
    }
    Py_ssize_t T = 0;
    int32_t *tokens = tokens_from(tok_obj, "tokens", &T);
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
    if (out == NULL || model_enter(self) < 0) {
        goto fail;
    }
    sd_status st;
    float *dst = (float *)PyArray_DATA(out);
    Py_BEGIN_ALLOW_THREADS st = sd_forward_llamacpp_order(self->model, tokens, (int)T, n_batch, dst);
    Py_END_ALLOW_THREADS model_leave(self);
    if (st != SD_OK) {
        raise_status(st);
        goto fail;
    }
    PyMem_Free(tokens);
    return (PyObject *)out;
fail:
    PyMem_Free(tokens);
    Py_XDECREF(out);
    return NULL;
}

static PyObject *model_new_cache(ModelObject *self, PyObject *args) {
    int n_slots = 0;
    if (!PyArg_ParseTuple(args, "i:new_cache", &n_slots)) {
        return NULL;
    }
    sd_kv_cache *kv = NULL;
    sd_status st = sd_kv_cache_create(&kv, self->model, n_slots);
    if (st != SD_OK) {
        return raise_status(st);
    }
    CacheObject *c = PyObject_New(CacheObject, &CacheType);
    if (c == NULL) {
        sd_kv_cache_free(kv);
        return NULL;
    }
    c->kv = kv;
    Py_INCREF(self);
    c->owner = (PyObject *)self;
    return (PyObject *)c;
}

/* A list of bytes objects as C views, valid while `seq` lives. */
typedef struct {
    PyObject *seq;
    const char **ptrs;
    size_t *lens;
    Py_ssize_t n;
} bytes_list;

static void bytes_list_free(bytes_list *b) {
    Py_XDECREF(b->seq);
    PyMem_Free(b->ptrs);
    PyMem_Free(b->lens);
    memset(b, 0, sizeof(*b));
}

static int bytes_list_from(bytes_list *b, PyObject *obj, const char *what) {
    memset(b, 0, sizeof(*b));
    b->seq = PySequence_Fast(obj, what);
    if (b->seq == NULL) {
        return -1;
    }
    b->n = PySequence_Fast_GET_SIZE(b->seq);
    b->ptrs = PyMem_Malloc((size_t)(b->n > 0 ? b->n : 1) * sizeof(char *));
    b->lens = PyMem_Malloc((size_t)(b->n > 0 ? b->n : 1) * sizeof(size_t));
    if (b->ptrs == NULL || b->lens == NULL) {
        bytes_list_free(b);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < b->n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(b->seq, i);
        char *ptr = NULL;
        Py_ssize_t len = 0;
        if (PyBytes_AsStringAndSize(item, &ptr, &len) < 0) {
            bytes_list_free(b);
            PyErr_Format(PyExc_TypeError, "%s must be a sequence of bytes", what);
            return -1;
        }
        b->ptrs[i] = ptr;
        b->lens[i] = (size_t)len;
    }
    return 0;
}

static PyObject *model_set_token_pieces(ModelObject *self, PyObject *arg) {
    bytes_list b;
    if (bytes_list_from(&b, arg, "token pieces") < 0) {
        return NULL;
    }
    if (b.n > INT32_MAX || model_enter(self) < 0) {
        bytes_list_free(&b);
        return NULL;
    }
    sd_status st = sd_model_set_token_pieces(self->model, b.ptrs, b.lens, (int)b.n);
    model_leave(self);
    bytes_list_free(&b);
    if (st != SD_OK) {
        return raise_status(st);
    }
    Py_RETURN_NONE;
}

static PyObject *stats_dict(const sd_spec_stats *st, int k) {
    PyObject *drafted = PyList_New(k), *accepted = PyList_New(k);
    for (int i = 0; drafted != NULL && accepted != NULL && i < k; i++) {
        PyList_SET_ITEM(drafted, i, PyLong_FromLong(st->drafted_at[i]));
        PyList_SET_ITEM(accepted, i, PyLong_FromLong(st->accepted_at[i]));
    }
    if (drafted == NULL || accepted == NULL) {
        Py_XDECREF(drafted);
        Py_XDECREF(accepted);
        return NULL;
    }
    return Py_BuildValue("{s:i,s:i,s:i,s:N,s:N,s:d,s:d,s:d}", "steps", st->steps, "drafted",
                         st->drafted, "accepted", st->accepted, "drafted_at", drafted,
                         "accepted_at", accepted, "time_draft_s", st->time_draft_s, "time_verify_s",
                         st->time_verify_s, "time_total_s", st->time_total_s);
}

/* on_token from C: calls the Python callable with the GIL; a true result cancels, an exception
 * cancels and is kept to be raised once the loop has returned. */
typedef struct {
    PyObject *fn;
    PyObject *type, *value, *tb; /* a pending exception */
} token_callback;

static int call_on_token(void *user, int32_t token) {
    token_callback *cb = user;
    PyGILState_STATE g = PyGILState_Ensure();
    int stop = 1;
    PyObject *r = PyObject_CallFunction(cb->fn, "i", (int)token);
    if (r != NULL) {
        stop = PyObject_IsTrue(r);
        Py_DECREF(r);
    }
    if (stop < 0 || r == NULL) {
        PyErr_Fetch(&cb->type, &cb->value, &cb->tb);
        stop = 1;
    }
    PyGILState_Release(g);
    return stop;
}

/* generate(prompt, max_new_tokens, temperature, seed, stop_ids, stop_strings, top_k, top_p,
 *          min_p, lookup=(k, max_ngram, min_ngram, verify_slope) or None,
 *          draft=(draft Model, k, p_min, verify_slope) or None,
 *          layerskip=(n_layers, k, p_min, verify_slope) or None,
 *          on_token=callable(token) -> bool or None, check_cache=False (a test hook: see
 *          sd_generate_params.check_cache))
 *   -> (list[int], finish reason: "length" | "stop_token" | "stop_string", stats dict or None) */
static PyObject *model_generate(ModelObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"prompt",   "max_new_tokens", "temperature", "seed",
                             "stop_ids", "stop_strings",   "top_k",       "top_p",
                             "min_p",    "lookup",         "draft",       "layerskip",
                             "on_token", "check_cache",    NULL};
    PyObject *prompt_obj = NULL, *stop_obj = Py_None, *strings_obj = Py_None;
    PyObject *lookup_obj = Py_None, *draft_obj = Py_None, *skip_obj = Py_None;
    PyObject *on_token_obj = Py_None;
    sd_generate_params p = sd_generate_default_params();
    unsigned long long seed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|ifKOOiffOOOOp:generate", kwlist, &prompt_obj,
                                     &p.max_new_tokens, &p.temperature, &seed, &stop_obj,
                                     &strings_obj, &p.top_k, &p.top_p, &p.min_p, &lookup_obj,
                                     &draft_obj, &skip_obj, &on_token_obj, &p.check_cache)) {
        return NULL;
    }
    ModelObject *draft = NULL;
    sd_draft_params dp = {0, 0.0f, 0.0f};
    if (draft_obj != Py_None && !PyArg_ParseTuple(draft_obj, "O!iff:draft", &ModelType, &draft,
                                                  &dp.k, &dp.p_min, &dp.verify_slope)) {
        return NULL;
    }
    if (on_token_obj != Py_None && !PyCallable_Check(on_token_obj)) {
        PyErr_SetString(PyExc_TypeError, "on_token must be callable or None");
        return NULL;
    }
    int skip_layers = 0;
    if (skip_obj != Py_None && !PyArg_ParseTuple(skip_obj, "iiff:layerskip", &skip_layers, &dp.k,
                                                 &dp.p_min, &dp.verify_slope)) {
        return NULL;
    }
    if ((draft != NULL) + (lookup_obj != Py_None) + (skip_obj != Py_None) > 1) {
        PyErr_SetString(PyExc_ValueError, "pass at most one of lookup, draft and layerskip");
        return NULL;
    }
    sd_prompt_lookup pl = {0, 0, 0, 0.0f};
    if (lookup_obj != Py_None && !PyArg_ParseTuple(lookup_obj, "iiif:lookup", &pl.k, &pl.max_ngram,
                                                   &pl.min_ngram, &pl.verify_slope)) {
        return NULL;
    }
    int32_t *prompt = NULL, *stops = NULL, *out = NULL;
    Py_ssize_t n_prompt = 0, n_stops = 0;
    PyObject *result = NULL, *list = NULL, *stats = NULL;
    bytes_list strings;
    memset(&strings, 0, sizeof(strings));
    if ((prompt = tokens_from(prompt_obj, "prompt", &n_prompt)) == NULL) {
        goto done;
    }
    if (stop_obj != Py_None && (stops = tokens_from(stop_obj, "stop_ids", &n_stops)) == NULL) {
        goto done;
    }
    if (strings_obj != Py_None && bytes_list_from(&strings, strings_obj, "stop_strings") < 0) {
        goto done;
    }
    if (n_prompt > INT32_MAX || n_stops > INT32_MAX || strings.n > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "sequence too long");
        goto done;
    }
    out = PyMem_Malloc((size_t)(p.max_new_tokens > 0 ? p.max_new_tokens : 1) * sizeof(int32_t));
    if (out == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (model_enter(self) < 0) {
        goto done;
    }
    /* the draft may be the target itself (calls are sequential, each with its own cache) */
    const int enter_draft = draft != NULL && draft != self;
    if (enter_draft && model_enter(draft) < 0) {
        model_leave(self);
        goto done;
    }
    if (draft != NULL) {
        Py_INCREF(draft); /* held while the GIL is released */
    }
    p.seed = (uint64_t)seed;
    p.stop_ids = stops;
    p.n_stop_ids = (int)n_stops;
    p.stop_strings = strings.ptrs;
    p.stop_lens = strings.lens;
    p.n_stop_strings = (int)strings.n;
    token_callback cb = {on_token_obj, NULL, NULL, NULL};
    if (on_token_obj != Py_None) {
        p.on_token = call_on_token;
        p.on_token_user = &cb;
    }
    int n_out = 0;
    sd_finish_reason reason = SD_FINISH_LENGTH;
    sd_spec_stats ss;
    memset(&ss, 0, sizeof(ss));
    sd_status st;
    const int speculative = lookup_obj != Py_None || draft != NULL || skip_obj != Py_None;
    Py_BEGIN_ALLOW_THREADS if (skip_obj != Py_None) {
        st = sd_generate_layerskip(out, &n_out, &reason, &ss, self->model, skip_layers, &dp, prompt,
                                   (int)n_prompt, &p);
    }
    else if (draft != NULL) {
        st = sd_generate_draft(out, &n_out, &reason, &ss, self->model, draft->model, &dp, prompt,
                               (int)n_prompt, &p);
    }
    else if (speculative) {
        st = sd_generate_lookup(out, &n_out, &reason, &ss, self->model, prompt, (int)n_prompt, &p,
                                &pl);
    }
    else {
        st = sd_generate(out, &n_out, &reason, self->model, prompt, (int)n_prompt, &p);
    }
    Py_END_ALLOW_THREADS model_leave(self);
    if (enter_draft) {
        model_leave(draft);
    }
    Py_XDECREF(draft);
    if (cb.type != NULL) { /* the callback raised: that exception is the result */
        PyErr_Restore(cb.type, cb.value, cb.tb);
        goto done;
    }
    if (st != SD_OK) {
        raise_status(st);
        goto done;
    }
    list = token_list(out, n_out);
    if (speculative) {
        stats = stats_dict(&ss, draft != NULL || skip_obj != Py_None ? dp.k : pl.k);
    } else {
        stats = Py_None;
        Py_INCREF(stats);
    }
    if (list != NULL && stats != NULL) {
        const char *names[] = {"length", "stop_token", "stop_string", "cancelled"};
        result = Py_BuildValue("(OsO)", list, names[reason], stats);
    }
done:
    Py_XDECREF(list);
    Py_XDECREF(stats);
    PyMem_Free(prompt);
    PyMem_Free(stops);
    PyMem_Free(out);
    bytes_list_free(&strings);
    return result;
}

/* One GGUF value at *p (validated by the loader), advancing *p past it. Strings that are not
 * valid UTF-8 come back as bytes rather than being altered. */
static PyObject *gguf_value(int type, const unsigned char **p, int depth) {
    const unsigned char *v = *p;
    uint64_t n = 0;
    switch (type) {
    case SD_GGUF_U8: *p += 1; return PyLong_FromLong(v[0]);
    case SD_GGUF_I8: *p += 1; return PyLong_FromLong((int8_t)v[0]);
    case SD_GGUF_BOOL: *p += 1; return PyBool_FromLong(v[0] != 0);
    case SD_GGUF_U16: {
        uint16_t x;
        memcpy(&x, v, 2);
        *p += 2;
        return PyLong_FromLong(x);
    }
    case SD_GGUF_I16: {
        int16_t x;
        memcpy(&x, v, 2);
        *p += 2;
        return PyLong_FromLong(x);
    }
    case SD_GGUF_U32: {
        uint32_t x;
        memcpy(&x, v, 4);
        *p += 4;
        return PyLong_FromUnsignedLong(x);
    }
    case SD_GGUF_I32: {
        int32_t x;
        memcpy(&x, v, 4);
        *p += 4;
        return PyLong_FromLong(x);
    }
    case SD_GGUF_F32: {
        float x;
        memcpy(&x, v, 4);
        *p += 4;
        return PyFloat_FromDouble(x);
    }
    case SD_GGUF_U64: {
        uint64_t x;
        memcpy(&x, v, 8);
        *p += 8;
        return PyLong_FromUnsignedLongLong(x);
    }
    case SD_GGUF_I64: {
        int64_t x;
        memcpy(&x, v, 8);
        *p += 8;
        return PyLong_FromLongLong(x);
    }
    case SD_GGUF_F64: {
        double x;
        memcpy(&x, v, 8);
        *p += 8;
        return PyFloat_FromDouble(x);
    }
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

static PyObject *model_gguf_metadata(ModelObject *self, PyObject *unused) {
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
            return raise_status(st);
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

static PyMethodDef model_methods[] = {
    {"gguf_metadata", (PyCFunction)model_gguf_metadata, METH_NOARGS,
     "gguf_metadata() -> dict of the GGUF key/value metadata ({} for HF directories)"},
    {"forward", (PyCFunction)(void (*)(void))model_forward, METH_VARARGS | METH_KEYWORDS,
     "forward(cache, tokens, positions=None, slots=None, mask=None, n_logits=-1) -> ndarray"},
    {"new_cache", (PyCFunction)model_new_cache, METH_VARARGS, "new_cache(n_slots) -> KVCache"},
    {"llamacpp_logits", (PyCFunction)model_llamacpp_logits, METH_VARARGS,
     "llamacpp_logits(tokens, n_batch) -> ndarray: logits in llama.cpp's float order"},
    {"generate", (PyCFunction)(void (*)(void))model_generate, METH_VARARGS | METH_KEYWORDS,
     "generate(prompt, max_new_tokens=16, temperature=0.0, seed=0, stop_ids=None, "
     "stop_strings=None, top_k=0, top_p=1.0, min_p=0.0, lookup=None, draft=None, layerskip=None, "
     "on_token=None) "
     "-> (tokens, "
     "finish_reason, stats)"},
    {"bench_forward", (PyCFunction)model_bench_forward, METH_VARARGS,
     "bench_forward(T, context, iters) -> seconds per forward over T tokens"},
    {"bench_synthetic", (PyCFunction)model_bench_synthetic, METH_VARARGS,
     "bench_synthetic(prompt, max_new_tokens, k, alpha, seed) -> (tokens, stats): benchmarks "
     "only (sd_bench_synthetic)"},
    {"set_token_pieces", (PyCFunction)model_set_token_pieces, METH_O,
     "set_token_pieces(list of bytes): the bytes of every token id, for stop strings"},
    {NULL, NULL, 0, NULL},
};

static PyObject *model_get_kv_dtype(ModelObject *self, void *closure) {
    (void)closure;
    return PyUnicode_FromString(sd_model_kv_f16(self->model) ? "f16" : "f32");
}

static int model_set_kv_dtype(ModelObject *self, PyObject *value, void *closure) {
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
    if (model_enter(self) < 0) {
        return -1;
    }
    sd_status st = sd_model_set_kv_f16(self->model, strcmp(s, "f16") == 0);
    model_leave(self);
    if (st != SD_OK) {
        raise_status(st);
        return -1;
    }
    return 0;
}

static PyGetSetDef model_getset[] = {
    {"config", (getter)model_config, NULL, "hyper-parameters as a dict", NULL},
    {"threads", (getter)model_get_threads, (setter)model_set_threads, "worker threads", NULL},
    {"kv_dtype", (getter)model_get_kv_dtype, (setter)model_set_kv_dtype,
     "element type of the KV caches created from now on: 'f16' or 'f32'", NULL},
    {"weight_bytes", (getter)model_weight_bytes, NULL, "bytes of weights one forward reads", NULL},
    {"device", (getter)model_device, NULL, "'cpu' or 'cuda'", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ModelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "specdec._core.Model",
    .tp_basicsize = sizeof(ModelObject),
    .tp_dealloc = (destructor)model_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A loaded model (C core). Create with specdec._core.load().",
    .tp_methods = model_methods,
    .tp_getset = model_getset,
};

/* ---- KVCache --------------------------------------------------------------------------------- */

static void cache_dealloc(CacheObject *self) {
    sd_kv_cache_free(self->kv);
    Py_XDECREF(self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *cache_length(CacheObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(sd_kv_cache_length(self->kv));
}

static PyObject *cache_capacity(CacheObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(sd_kv_cache_capacity(self->kv));
}

static PyObject *cache_rollback(CacheObject *self, PyObject *args) {
    int n = 0;
    if (!PyArg_ParseTuple(args, "i:rollback", &n)) {
        return NULL;
    }
    if (((ModelObject *)self->owner)->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the cache's model is running a call");
        return NULL;
    }
    sd_status st = sd_kv_cache_set_length(self->kv, n);
    if (st != SD_OK) {
        return raise_status(st);
    }
    Py_RETURN_NONE;
}

static PyObject *cache_copy_slot(CacheObject *self, PyObject *args) {
    int dst = 0, src = 0;
    if (!PyArg_ParseTuple(args, "ii:copy_slot", &dst, &src)) {
        return NULL;
    }
    if (((ModelObject *)self->owner)->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the cache's model is running a call");
        return NULL;
    }
    sd_status st = sd_kv_cache_copy_slot(self->kv, dst, src);
    if (st != SD_OK) {
        return raise_status(st);
    }
    Py_RETURN_NONE;
}

static PyMethodDef cache_methods[] = {
    {"rollback", (PyCFunction)cache_rollback, METH_VARARGS,
     "rollback(n): keep slots [0, n) and forget the rest (0 <= n <= length)."},
    {"copy_slot", (PyCFunction)cache_copy_slot, METH_VARARGS,
     "copy_slot(dst, src): copy one slot's keys, values and position onto another."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef cache_getset[] = {
    {"length", (getter)cache_length, NULL, "number of live slots", NULL},
    {"capacity", (getter)cache_capacity, NULL, "number of slots", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CacheType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "specdec.KVCache",
    .tp_basicsize = sizeof(CacheObject),
    .tp_dealloc = (destructor)cache_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Slot-addressed key/value cache of one model. Create with Model.new_cache().",
    .tp_methods = cache_methods,
    .tp_getset = cache_getset,
};

/* ---- module ---------------------------------------------------------------------------------- */

static PyObject *core_cuda_probe(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
#ifdef SD_WITH_CUDA
    int cublas = 0;
    int n = sd_cuda_probe(&cublas);
    return Py_BuildValue("{s:i,s:i}", "devices", n, "cublas_version", cublas);
#else
    Py_RETURN_NONE;
#endif
}

/* quantize_q8(x: float32 (n,)) -> bytes: the activation row the integer kernels read
 * (quant.h: n int8, then the f32 arrays d, s, e of n / 32 each) */
static PyObject *core_quantize_q8(PyObject *mod, PyObject *arg) {
    (void)mod;
    PyArrayObject *x =
        (PyArrayObject *)PyArray_FROMANY(arg, NPY_FLOAT32, 1, 1, NPY_ARRAY_CARRAY_RO);
    if (x == NULL) {
        return NULL;
    }
    const int64_t n = (int64_t)PyArray_DIM(x, 0);
    /* the size is computed only for a valid n; sd_quantize_activations reports the rest */
    const size_t bytes = n > 0 && n % 32 == 0 ? sd_quantized_activation_bytes(n) : 0;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)bytes);
    if (out != NULL) {
        sd_status st = sd_quantize_activations((unsigned char *)PyBytes_AS_STRING(out), bytes,
                                               (const float *)PyArray_DATA(x), n);
        if (st != SD_OK) {
            Py_CLEAR(out);
            raise_status(st);
        }
    }
    Py_DECREF(x);
    return out;
}

/* dequantize(type, data: bytes, n) -> float32 (n,) */
static PyObject *core_dequantize(PyObject *mod, PyObject *args) {
    (void)mod;
    int type = 0;
    long long n = 0;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "iy*L:dequantize", &type, &buf, &n)) {
        return NULL;
    }
    PyArrayObject *out = NULL;
    if (n <= 0 || n > ((long long)1 << 40)) {
        PyErr_Format(PyExc_ValueError, "n must be positive, got %lld", n);
        goto done;
    }
    npy_intp dims[1] = {(npy_intp)n};
    out = (PyArrayObject *)PyArray_SimpleNew(1, dims, NPY_FLOAT32);
    if (out != NULL) {
        sd_status st =
            sd_dequantize((float *)PyArray_DATA(out), type, buf.buf, (size_t)buf.len, (int64_t)n);
        if (st != SD_OK) {
            Py_CLEAR(out);
            raise_status(st);
        }
    }
done:
    PyBuffer_Release(&buf);
    return (PyObject *)out;
}

/* matmul_rows(type, w: bytes, nrows, n, x: float32 (T, n), kernel) -> float32 (T, nrows);
 * kernel: 0 the forward pass's, 1 portable, 2 SIMD over unrepacked rows (sd_kernel) */
static PyObject *core_matmul_rows(PyObject *mod, PyObject *args) {
    (void)mod;
    int type = 0, kernel = 0;
    long long nrows = 0, n = 0;
    Py_buffer buf;
    PyObject *x_obj = NULL;
    if (!PyArg_ParseTuple(args, "iy*LLOi:matmul_rows", &type, &buf, &nrows, &n, &x_obj, &kernel)) {
        return NULL;
    }
    PyArrayObject *x = NULL, *out = NULL;
    x = (PyArrayObject *)PyArray_FROMANY(x_obj, NPY_FLOAT32, 2, 2, NPY_ARRAY_IN_ARRAY);
    if (x == NULL) {
        goto fail;
    }
    if (PyArray_DIM(x, 1) != n || PyArray_DIM(x, 0) < 1 || PyArray_DIM(x, 0) > INT32_MAX ||
        nrows < 1 || nrows > ((long long)1 << 40)) {
        PyErr_SetString(PyExc_ValueError, "x must have shape (T, n) with T >= 1; nrows >= 1");
        goto fail;
    }
    npy_intp dims[2] = {PyArray_DIM(x, 0), (npy_intp)nrows};
    out = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_FLOAT32);
    if (out == NULL) {
        goto fail;
    }
    sd_status st;
    Py_BEGIN_ALLOW_THREADS st =
        sd_matmul_rows((float *)PyArray_DATA(out), type, buf.buf, (size_t)buf.len, (int64_t)nrows,
                       (int64_t)n, (const float *)PyArray_DATA(x), (int)PyArray_DIM(x, 0), kernel);
    Py_END_ALLOW_THREADS if (st != SD_OK) {
        raise_status(st);
        goto fail;
    }
    Py_DECREF(x);
    PyBuffer_Release(&buf);
    return (PyObject *)out;
fail:
    Py_XDECREF(x);
    Py_XDECREF(out);
    PyBuffer_Release(&buf);
    return NULL;
}

/* process_logits(logits (V,), temperature, top_k, top_p, min_p) -> float32 (V,) */
static PyObject *core_process_logits(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *obj = NULL;
    sd_sampling sp = sd_sampling_default();
    if (!PyArg_ParseTuple(args, "Ofiff:process_logits", &obj, &sp.temperature, &sp.top_k, &sp.top_p,
                          &sp.min_p)) {
        return NULL;
    }
    sd_status st = sd_sampling_check(&sp);
    if (st != SD_OK) {
        return raise_status(st);
    }
    PyArrayObject *x = (PyArrayObject *)PyArray_FROMANY(obj, NPY_FLOAT32, 1, 1, NPY_ARRAY_IN_ARRAY);
    if (x == NULL) {
        return NULL;
    }
    const npy_intp V = PyArray_DIM(x, 0);
    PyArrayObject *out = NULL;
    int32_t *work = NULL;
    if (V < 1 || V > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "logits must hold at least one value");
        goto done;
    }
    out = (PyArrayObject *)PyArray_SimpleNew(1, &PyArray_DIMS(x)[0], NPY_FLOAT32);
    work = PyMem_Malloc((size_t)V * sizeof(int32_t));
    if (out == NULL || work == NULL) {
        Py_CLEAR(out);
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        goto done;
    }
    sd_process_logits((float *)PyArray_DATA(out), (const float *)PyArray_DATA(x), (int)V, &sp,
                      work);
done:
    PyMem_Free(work);
    Py_DECREF(x);
    return (PyObject *)out;
}

/* verify_chains(p (K+1, V), q (K, V) or None, drafts (N, K), u_accept (N, K), u_next (N, K+1))
 *   -> (n_accepted int32 (N,), next int32 (N,)): N independent runs of the chain rule. */
static PyObject *core_verify_chains(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *p_obj, *q_obj, *d_obj, *ua_obj, *un_obj;
    if (!PyArg_ParseTuple(args, "OOOOO:verify_chains", &p_obj, &q_obj, &d_obj, &ua_obj, &un_obj)) {
        return NULL;
    }
    PyArrayObject *p = NULL, *q = NULL, *d = NULL, *ua = NULL, *un = NULL;
    PyArrayObject *n_acc = NULL, *next = NULL;
    float *work = NULL;
    PyObject *result = NULL;
    p = (PyArrayObject *)PyArray_FROMANY(p_obj, NPY_FLOAT32, 2, 2, NPY_ARRAY_IN_ARRAY);
    d = (PyArrayObject *)PyArray_FROMANY(d_obj, NPY_INT32, 2, 2, NPY_ARRAY_IN_ARRAY);
    ua = (PyArrayObject *)PyArray_FROMANY(ua_obj, NPY_FLOAT64, 2, 2, NPY_ARRAY_IN_ARRAY);
    un = (PyArrayObject *)PyArray_FROMANY(un_obj, NPY_FLOAT64, 2, 2, NPY_ARRAY_IN_ARRAY);
    if (p == NULL || d == NULL || ua == NULL || un == NULL) {
        goto done;
    }
    if (q_obj != Py_None) {
        q = (PyArrayObject *)PyArray_FROMANY(q_obj, NPY_FLOAT32, 2, 2, NPY_ARRAY_IN_ARRAY);
        if (q == NULL) {
            goto done;
        }
    }
    const npy_intp K = PyArray_DIM(p, 0) - 1, V = PyArray_DIM(p, 1), N = PyArray_DIM(d, 0);
    if (K < 0 || V < 1 || PyArray_DIM(d, 1) != K || PyArray_DIM(ua, 0) != N ||
        PyArray_DIM(ua, 1) != K || PyArray_DIM(un, 0) != N || PyArray_DIM(un, 1) != K + 1 ||
        (q != NULL && (PyArray_DIM(q, 0) != K || PyArray_DIM(q, 1) != V))) {
        PyErr_SetString(PyExc_ValueError, "shapes: p (K+1, V), q (K, V), drafts (N, K), "
                                          "u_accept (N, K), u_next (N, K+1)");
        goto done;
    }
    const int32_t *dd = (const int32_t *)PyArray_DATA(d);
    for (npy_intp i = 0; i < N * K; i++) {
        if (dd[i] < 0 || dd[i] >= V) {
            PyErr_Format(PyExc_ValueError, "draft token %d is out of range [0, %zd)", dd[i],
                         (Py_ssize_t)V);
            goto done;
        }
    }
    n_acc = (PyArrayObject *)PyArray_SimpleNew(1, &N, NPY_INT32);
    next = (PyArrayObject *)PyArray_SimpleNew(1, &N, NPY_INT32);
    work = PyMem_Malloc((size_t)V * sizeof(float));
    if (n_acc == NULL || next == NULL || work == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        goto done;
    }
    const float *pp = (const float *)PyArray_DATA(p);
    const float *qq = q != NULL ? (const float *)PyArray_DATA(q) : NULL;
    const double *uu = (const double *)PyArray_DATA(ua), *nn = (const double *)PyArray_DATA(un);
    int32_t *na = (int32_t *)PyArray_DATA(n_acc), *nx = (int32_t *)PyArray_DATA(next);
    Py_BEGIN_ALLOW_THREADS for (npy_intp i = 0; i < N; i++) {
        na[i] = sd_verify_chain(&nx[i], pp, qq, dd + i * K, (int)K, (int)V, uu + i * K,
                                nn + i * (K + 1), work);
    }
    Py_END_ALLOW_THREADS result = Py_BuildValue("(OO)", n_acc, next);
done:
    PyMem_Free(work);
    Py_XDECREF(p);
    Py_XDECREF(q);
    Py_XDECREF(d);
    Py_XDECREF(ua);
    Py_XDECREF(un);
    Py_XDECREF(n_acc);
    Py_XDECREF(next);
    return result;
}

static PyObject *core_threadpool_selftest(PyObject *mod, PyObject *args) {
    (void)mod;
    int n_threads = 0, n_runs = 0;
    if (!PyArg_ParseTuple(args, "ii:threadpool_selftest", &n_threads, &n_runs)) {
        return NULL;
    }
    sd_status st;
    Py_BEGIN_ALLOW_THREADS st = sd_threadpool_selftest(n_threads, n_runs);
    Py_END_ALLOW_THREADS if (st != SD_OK) {
        return raise_status(st);
    }
    Py_RETURN_NONE;
}

static PyMethodDef core_methods[] = {
    {"threadpool_selftest", core_threadpool_selftest, METH_VARARGS,
     "threadpool_selftest(threads, runs): run jobs of changing sizes on a fresh pool and raise "
     "RuntimeError unless every piece ran exactly once within its run (a test hook)"},
    {"process_logits", core_process_logits, METH_VARARGS,
     "process_logits(logits, temperature, top_k, top_p, min_p) -> the processed distribution"},
    {"lookup_draft", core_lookup_draft, METH_VARARGS,
     "lookup_draft(tokens, k, max_ngram, min_ngram) -> (draft, n_match, extent): the draft "
     "prompt lookup proposes after tokens (a test and research hook)"},
    {"verify_chains", core_verify_chains, METH_VARARGS,
     "verify_chains(p, q, drafts, u_accept, u_next) -> (n_accepted, next): the chain rule of "
     "speculative sampling over N runs (a test and research hook)"},
    {"quantize_q8", core_quantize_q8, METH_O,
     "quantize_q8(x) -> bytes: one float32 row quantized as the integer kernels' activations"},
    {"dequantize", core_dequantize, METH_VARARGS,
     "dequantize(type, data, n) -> float32 array: the row kernels' f32 values of n elements"},
    {"matmul_rows", core_matmul_rows, METH_VARARGS,
     "matmul_rows(type, w, nrows, n, x, kernel) -> float32 (T, nrows) = x . W^T; kernel 0: the "
     "forward pass's, 1: portable, 2: SIMD without repacking"},
    {"cuda_probe", core_cuda_probe, METH_NOARGS,
     "CUDA builds: {'devices': n, 'cublas_version': v}; CPU-only builds: None"},
    {"dummy", (PyCFunction)(void (*)(void))core_dummy, METH_VARARGS | METH_KEYWORDS,
     "dummy(shape, weight_type, seed, threads=0, device=0, gpu=0) -> Model with random weights"},
    {"kernel", core_kernel, METH_VARARGS,
     "kernel(name, device, args) -> None: a CUDA kernel (device 1) or its CPU twin (0)"},
    {"kernel_names", core_kernel_names, METH_NOARGS, "the kernels kernel() runs"},
    {"bench_attention", core_bench_attention, METH_VARARGS,
     "bench_attention(T, n_attn, n_heads, n_kv_heads, head_dim, n_layers, threads, iters) -> "
     "seconds per pass of the CPU attention over n_layers layers of an f16 cache"},
    {"copy_bench", core_copy_bench, METH_VARARGS,
     "copy_bench(gpu, bytes, iters) -> seconds per device-to-device copy"},
    {"load", (PyCFunction)(void (*)(void))core_load, METH_VARARGS | METH_KEYWORDS,
     "load(path, threads=0, device=0, gpu=0) -> Model"},
    {"simd_name", core_simd_name, METH_NOARGS, "SIMD level of the CPU kernels"},
    {"built_with_cuda", core_built_with_cuda, METH_NOARGS,
     "whether the CUDA sources were compiled into this build"},
    {NULL, NULL, 0, NULL},
};

static int core_exec(PyObject *m) {
    import_array1(-1);
    if (PyType_Ready(&ModelType) < 0 || PyType_Ready(&CacheType) < 0) {
        return -1;
    }
    Py_INCREF(&ModelType);
    if (PyModule_AddObject(m, "Model", (PyObject *)&ModelType) < 0) {
        Py_DECREF(&ModelType);
        return -1;
    }
    Py_INCREF(&CacheType);
    if (PyModule_AddObject(m, "KVCache", (PyObject *)&CacheType) < 0) {
        Py_DECREF(&CacheType);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot core_slots[] = {
    {Py_mod_exec, (void *)core_exec},
    {0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "specdec._core",
    .m_doc = "specdec's C core: model loading, forward passes and decoding.",
    .m_size = 0,
    .m_methods = core_methods,
    .m_slots = core_slots,
};

PyMODINIT_FUNC PyInit__core(void) {
    return PyModuleDef_Init(&core_module);
}
