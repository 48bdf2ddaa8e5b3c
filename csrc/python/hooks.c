/* hooks.c — test and research hooks: the kernels and their CPU twins on NumPy arrays, the
 * row kernels, the accept/reject rule and the logits processing over synthetic distributions,
 * the prompt-lookup matcher, the thread pool's self-test and the kernel benchmarks. Not part of
 * the public API: they exist so the tests can hold each piece against an independent
 * reference. */
#include "python/py_core.h"

#include <stdint.h>
#include <string.h>

#include "format/types.h"
#include "spec/drafters/lookup_history.h"
#include "spec/lookup.h"
#include "spec/verify.h"
#include "util/threadpool.h"

/* kernel(name, device, args: list) -> None: run a CUDA kernel (device 1) or its CPU twin
 * (device 0) on NumPy arrays, which are written in place (sd_kernel_run). Arrays must be
 * C-contiguous and writable; None is a NULL array; ints and floats are scalars (ints up to
 * 2^64 - 1 keep their bits: seeds). */
static PyObject *hook_kernel(PyObject *mod, PyObject *args) {
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
        return sd_py_raise(st);
    }
    Py_RETURN_NONE;
}

/* copy_bench(gpu, bytes, iters) -> seconds per device-to-device copy (sd_bench_copy). */
static PyObject *hook_copy_bench(PyObject *mod, PyObject *args) {
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
        return sd_py_raise(st);
    }
    return PyFloat_FromDouble(sec);
}

/* bench_attention(T, n_attn, n_heads, n_kv_heads, head_dim, n_layers, threads, iters) ->
 * seconds per pass over the layers (sd_bench_attention). */
static PyObject *hook_bench_attention(PyObject *mod, PyObject *args) {
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
        return sd_py_raise(st);
    }
    return PyFloat_FromDouble(sec);
}

/* lookup_draft(tokens, k, max_ngram, min_ngram) -> (draft, n_match, extent): the prompt-lookup
 * draft after tokens (sd_lookup_draft), a test and research hook. */
static PyObject *hook_lookup_draft(PyObject *mod, PyObject *args) {
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
    PyArrayObject *t = (PyArrayObject *)PyArray_FROMANY(t_obj, NPY_INT32, 1, 1, NPY_ARRAY_IN_ARRAY);
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

/* lookup_history_drafts(tokens, outputs, queries, k) -> [(draft, n_match)]: a history of at least
 * `tokens` tokens (sd_lookup_history) given `outputs` one after another, then each query's draft
 * of up to k tokens; a test hook. */
static PyObject *hook_lookup_history_drafts(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *outputs = NULL, *queries = NULL;
    int tokens = 0, k = 0;
    if (!PyArg_ParseTuple(args, "iO!O!i:lookup_history_drafts", &tokens, &PyList_Type, &outputs,
                          &PyList_Type, &queries, &k)) {
        return NULL;
    }
    if (k < 1 || k > SD_MAX_DRAFT) {
        PyErr_Format(PyExc_ValueError, "lookup_history_drafts needs 1 <= k <= %d, got %d",
                     SD_MAX_DRAFT, k);
        return NULL;
    }
    sd_lookup_history *hs = NULL;
    const sd_status st = sd_lookup_history_create(&hs, tokens);
    if (st != SD_OK) {
        return sd_py_raise(st);
    }
    PyObject *res = PyList_New(0);
    for (Py_ssize_t i = 0; res != NULL && i < PyList_GET_SIZE(outputs); i++) {
        Py_ssize_t n = 0;
        int32_t *t = sd_py_tokens_from(PyList_GET_ITEM(outputs, i), "an output", &n);
        if (t == NULL) {
            Py_CLEAR(res);
            break;
        }
        sd_lookup_history_add(hs, t, n < INT32_MAX ? (int)n : INT32_MAX);
        PyMem_Free(t);
    }
    for (Py_ssize_t i = 0; res != NULL && i < PyList_GET_SIZE(queries); i++) {
        Py_ssize_t n = 0;
        int32_t *t = sd_py_tokens_from(PyList_GET_ITEM(queries, i), "a query", &n);
        if (t == NULL) {
            Py_CLEAR(res);
            break;
        }
        int32_t draft[SD_MAX_DRAFT];
        int n_match = 0;
        const int got =
            sd_lookup_history_draft(hs, draft, &n_match, t, n < INT32_MAX ? (int)n : INT32_MAX, k);
        PyMem_Free(t);
        PyObject *l = sd_py_token_list(draft, got);
        PyObject *item = l != NULL ? Py_BuildValue("(Ni)", l, n_match) : NULL;
        if (item == NULL || PyList_Append(res, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(res);
            break;
        }
        Py_DECREF(item);
    }
    sd_lookup_history_free(hs);
    return res;
}

static PyObject *hook_kernel_names(PyObject *mod, PyObject *unused) {
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

/* quantize_q8(x: float32 (n,)) -> bytes: the activation row the integer kernels read
 * (quant.h: n int8, then the f32 arrays d, s, e of n / 32 each) */
static PyObject *hook_quantize_q8(PyObject *mod, PyObject *arg) {
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
            sd_py_raise(st);
        }
    }
    Py_DECREF(x);
    return out;
}

/* dequantize(type, data: bytes, n) -> float32 (n,) */
static PyObject *hook_dequantize(PyObject *mod, PyObject *args) {
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
            sd_py_raise(st);
        }
    }
done:
    PyBuffer_Release(&buf);
    return (PyObject *)out;
}

/* first_nonfinite(type, data: bytes, n) -> the first of n elements that is not finite, or of a
 * block whose scale is not (sd_first_nonfinite, the model loader's check), or -1 */
static PyObject *hook_first_nonfinite(PyObject *mod, PyObject *args) {
    (void)mod;
    int type = 0;
    long long n = 0;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "iy*L:first_nonfinite", &type, &buf, &n)) {
        return NULL;
    }
    PyObject *out = NULL;
    const sd_type_info *t = sd_type_info_get(type);
    if (t == NULL || n <= 0 || n % t->block_size != 0) {
        PyErr_Format(PyExc_ValueError, "n = %lld is not a positive number of whole blocks of "
                     "type %d", n, type);
    } else if ((size_t)buf.len != sd_row_bytes(type, (int64_t)n)) {
        PyErr_Format(PyExc_ValueError, "%lld elements of type %s take %zu bytes, got %zd", n,
                     t->name, sd_row_bytes(type, (int64_t)n), buf.len);
    } else {
        out = PyLong_FromLongLong((long long)sd_first_nonfinite(type, buf.buf, (int64_t)n));
    }
    PyBuffer_Release(&buf);
    return out;
}

/* matmul_rows(type, w: bytes, nrows, n, x: float32 (T, n), kernel) -> float32 (T, nrows);
 * kernel: 0 the forward pass's, 1 portable, 2 SIMD over unrepacked rows (sd_kernel) */
static PyObject *hook_matmul_rows(PyObject *mod, PyObject *args) {
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
        sd_py_raise(st);
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
static PyObject *hook_process_logits(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *obj = NULL;
    sd_sampling sp = sd_sampling_default();
    if (!PyArg_ParseTuple(args, "Ofiff:process_logits", &obj, &sp.temperature, &sp.top_k, &sp.top_p,
                          &sp.min_p)) {
        return NULL;
    }
    sd_status st = sd_sampling_check(&sp);
    if (st != SD_OK) {
        return sd_py_raise(st);
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
static PyObject *hook_verify_chains(PyObject *mod, PyObject *args) {
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

/* verify_trees(parents, tokens, p, q, u_accept, u_next) -> (n_accepted, paths, next): the tree
 * rule (sd_verify_tree) over N runs of one tree shape: parents (n,) int32 with parents[i] < i;
 * tokens (N, n) int32; p (N, n + 1, V) float32; q (N, n, V) float32 or None; u_accept (N, n)
 * and u_next (N, depth + 1) float64. paths (N, depth) holds the accepted nodes, -1 past them. */
static PyObject *hook_verify_trees(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *par_obj, *tok_obj, *p_obj, *q_obj, *ua_obj, *un_obj;
    if (!PyArg_ParseTuple(args, "OOOOOO:verify_trees", &par_obj, &tok_obj, &p_obj, &q_obj, &ua_obj,
                          &un_obj)) {
        return NULL;
    }
    PyArrayObject *par = NULL, *tok = NULL, *p = NULL, *q = NULL, *ua = NULL, *un = NULL;
    PyArrayObject *n_acc = NULL, *paths = NULL, *next = NULL;
    float *work = NULL;
    PyObject *result = NULL;
    par = (PyArrayObject *)PyArray_FROMANY(par_obj, NPY_INT32, 1, 1, NPY_ARRAY_IN_ARRAY);
    tok = (PyArrayObject *)PyArray_FROMANY(tok_obj, NPY_INT32, 2, 2, NPY_ARRAY_IN_ARRAY);
    p = (PyArrayObject *)PyArray_FROMANY(p_obj, NPY_FLOAT32, 3, 3, NPY_ARRAY_IN_ARRAY);
    ua = (PyArrayObject *)PyArray_FROMANY(ua_obj, NPY_FLOAT64, 2, 2, NPY_ARRAY_IN_ARRAY);
    un = (PyArrayObject *)PyArray_FROMANY(un_obj, NPY_FLOAT64, 2, 2, NPY_ARRAY_IN_ARRAY);
    if (par == NULL || tok == NULL || p == NULL || ua == NULL || un == NULL) {
        goto done;
    }
    if (q_obj != Py_None) {
        q = (PyArrayObject *)PyArray_FROMANY(q_obj, NPY_FLOAT32, 3, 3, NPY_ARRAY_IN_ARRAY);
        if (q == NULL) {
            goto done;
        }
    }
    const npy_intp n = PyArray_DIM(par, 0), N = PyArray_DIM(tok, 0), V = PyArray_DIM(p, 2);
    const int32_t *pa = (const int32_t *)PyArray_DATA(par);
    int depth_of[SD_MAX_TREE], depth = 0;
    if (n < 1 || n > SD_MAX_TREE) {
        PyErr_Format(PyExc_ValueError, "a tree has 1 to %d nodes, got %zd", SD_MAX_TREE,
                     (Py_ssize_t)n);
        goto done;
    }
    for (npy_intp i = 0; i < n; i++) {
        if (pa[i] < -1 || pa[i] >= i) {
            PyErr_Format(PyExc_ValueError, "node %zd's parent %d is not an earlier node or -1",
                         (Py_ssize_t)i, pa[i]);
            goto done;
        }
        depth_of[i] = pa[i] < 0 ? 1 : depth_of[pa[i]] + 1;
        depth = depth_of[i] > depth ? depth_of[i] : depth;
    }
    if (V < 1 || PyArray_DIM(tok, 1) != n || PyArray_DIM(p, 0) != N || PyArray_DIM(p, 1) != n + 1 ||
        PyArray_DIM(ua, 0) != N || PyArray_DIM(ua, 1) != n || PyArray_DIM(un, 0) != N ||
        PyArray_DIM(un, 1) != depth + 1 ||
        (q != NULL &&
         (PyArray_DIM(q, 0) != N || PyArray_DIM(q, 1) != n || PyArray_DIM(q, 2) != V))) {
        PyErr_SetString(PyExc_ValueError, "shapes: tokens (N, n), p (N, n+1, V), q (N, n, V), "
                                          "u_accept (N, n), u_next (N, depth+1)");
        goto done;
    }
    const int32_t *tt = (const int32_t *)PyArray_DATA(tok);
    for (npy_intp r = 0; r < N; r++) {
        for (npy_intp i = 0; i < n; i++) {
            const int32_t t = tt[r * n + i];
            if (t < 0 || t >= V) {
                PyErr_Format(PyExc_ValueError, "token %d is out of range [0, %zd)", t,
                             (Py_ssize_t)V);
                goto done;
            }
            for (npy_intp j = 0; j < i; j++) {
                if (pa[j] == pa[i] && tt[r * n + j] == t) {
                    PyErr_Format(PyExc_ValueError,
                                 "run %zd: siblings %zd and %zd hold the same "
                                 "token %d",
                                 (Py_ssize_t)r, (Py_ssize_t)j, (Py_ssize_t)i, t);
                    goto done;
                }
            }
        }
    }
    npy_intp pdims[2] = {N, depth};
    n_acc = (PyArrayObject *)PyArray_SimpleNew(1, &N, NPY_INT32);
    paths = (PyArrayObject *)PyArray_SimpleNew(2, pdims, NPY_INT32);
    next = (PyArrayObject *)PyArray_SimpleNew(1, &N, NPY_INT32);
    work = PyMem_Malloc(2 * (size_t)V * sizeof(float));
    if (n_acc == NULL || paths == NULL || next == NULL || work == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        goto done;
    }
    const float *pp = (const float *)PyArray_DATA(p);
    const float *qq = q != NULL ? (const float *)PyArray_DATA(q) : NULL;
    const double *uu = (const double *)PyArray_DATA(ua), *nn = (const double *)PyArray_DATA(un);
    int32_t *na = (int32_t *)PyArray_DATA(n_acc), *pt = (int32_t *)PyArray_DATA(paths);
    int32_t *nx = (int32_t *)PyArray_DATA(next);
    Py_BEGIN_ALLOW_THREADS for (npy_intp r = 0; r < N; r++) {
        int32_t *path = pt + r * depth;
        na[r] = sd_verify_tree(path, &nx[r], tt + r * n, pa, (int)n, pp + r * (n + 1) * V,
                               qq != NULL ? qq + r * n * V : NULL, (int)V, uu + r * n,
                               nn + r * (depth + 1), work);
        for (int j = na[r]; j < depth; j++) {
            path[j] = -1;
        }
    }
    Py_END_ALLOW_THREADS result = Py_BuildValue("(OOO)", n_acc, paths, next);
done:
    PyMem_Free(work);
    Py_XDECREF(par);
    Py_XDECREF(tok);
    Py_XDECREF(p);
    Py_XDECREF(q);
    Py_XDECREF(ua);
    Py_XDECREF(un);
    Py_XDECREF(n_acc);
    Py_XDECREF(paths);
    Py_XDECREF(next);
    return result;
}

/* joint_counts(model, drafter, prompt, runs, temperature, top_k, top_p, min_p,
 *              repetition_penalty=1, frequency_penalty=0, presence_penalty=0) ->
 * (counts, drafted, accepted): the first three tokens of `runs` speculative generations with
 * seeds 0 .. runs - 1, counted in C (V^3 cells, a token triple (a, b, c) at a V^2 + b V + c) for
 * the chi-square tests of exactness, with the drafts proposed and accepted over all runs. */
static PyObject *hook_joint_counts(PyObject *mod, PyObject *args) {
    (void)mod;
    sd_py_Model *model = NULL;
    sd_py_Drafter *dr = NULL;
    PyObject *prompt_obj = NULL;
    long runs = 0;
    sd_generate_params p = sd_generate_default_params();
    if (!PyArg_ParseTuple(args, "O!O!Olfiff|fff:joint_counts", &sd_py_ModelType, &model,
                          &sd_py_DrafterType, &dr, &prompt_obj, &runs, &p.temperature, &p.top_k,
                          &p.top_p, &p.min_p, &p.repetition_penalty, &p.frequency_penalty,
                          &p.presence_penalty)) {
        return NULL;
    }
    const int V = sd_model_config(model->model)->vocab_size;
    if (runs < 1 || V > 64) {
        PyErr_SetString(PyExc_ValueError, "joint_counts needs runs >= 1 and a vocabulary <= 64");
        return NULL;
    }
    Py_ssize_t n_prompt = 0;
    int32_t *prompt = sd_py_tokens_from(prompt_obj, "prompt", &n_prompt);
    if (prompt == NULL) {
        return NULL;
    }
    npy_intp dims[1] = {(npy_intp)V * V * V};
    PyArrayObject *counts = (PyArrayObject *)PyArray_ZEROS(1, dims, NPY_INT64, 0);
    if (counts == NULL || sd_py_model_enter(model) < 0) {
        PyMem_Free(prompt);
        Py_XDECREF(counts);
        return NULL;
    }
    int64_t *c = (int64_t *)PyArray_DATA(counts);
    long long drafted = 0, accepted = 0;
    sd_status st = SD_OK;
    p.max_new_tokens = 3;
    Py_BEGIN_ALLOW_THREADS for (long s = 0; s < runs && st == SD_OK; s++) {
        int32_t out[3];
        int n = 0;
        sd_spec_stats ss;
        p.seed = (uint64_t)s;
        st = sd_generate_speculative(out, &n, NULL, &ss, model->model, dr->drafter, prompt,
                                     (int)n_prompt, &p);
        if (st == SD_OK && n == 3) {
            c[((int64_t)out[0] * V + out[1]) * V + out[2]]++;
        }
        drafted += ss.drafted;
        accepted += ss.accepted;
    }
    Py_END_ALLOW_THREADS sd_py_model_leave(model);
    PyMem_Free(prompt);
    if (st != SD_OK) {
        Py_DECREF(counts);
        return sd_py_raise(st);
    }
    return Py_BuildValue("(NLL)", counts, drafted, accepted);
}

static PyObject *hook_threadpool_selftest(PyObject *mod, PyObject *args) {
    (void)mod;
    int n_threads = 0, n_runs = 0;
    if (!PyArg_ParseTuple(args, "ii:threadpool_selftest", &n_threads, &n_runs)) {
        return NULL;
    }
    sd_status st;
    Py_BEGIN_ALLOW_THREADS st = sd_threadpool_selftest(n_threads, n_runs);
    Py_END_ALLOW_THREADS if (st != SD_OK) {
        return sd_py_raise(st);
    }
    Py_RETURN_NONE;
}

PyMethodDef sd_py_hook_methods[] = {
    {"threadpool_selftest", hook_threadpool_selftest, METH_VARARGS,
     "threadpool_selftest(threads, runs): run jobs of changing sizes on a fresh pool and raise "
     "RuntimeError unless every piece ran exactly once within its run (a test hook)"},
    {"process_logits", hook_process_logits, METH_VARARGS,
     "process_logits(logits, temperature, top_k, top_p, min_p) -> the processed distribution"},
    {"lookup_draft", hook_lookup_draft, METH_VARARGS,
     "lookup_draft(tokens, k, max_ngram, min_ngram) -> (draft, n_match, extent): the draft "
     "prompt lookup proposes after tokens (a test and research hook)"},
    {"lookup_history_drafts", hook_lookup_history_drafts, METH_VARARGS,
     "lookup_history_drafts(tokens, outputs, queries, k): a history's drafts (test hook)"},
    {"verify_chains", hook_verify_chains, METH_VARARGS,
     "verify_chains(p, q, drafts, u_accept, u_next) -> (n_accepted, next): the chain rule of "
     "speculative sampling over N runs (a test and research hook)"},
    {"verify_trees", hook_verify_trees, METH_VARARGS,
     "verify_trees(parents, tokens, p, q, u_accept, u_next) -> (n_accepted, paths, next): the "
     "tree rule over N runs of one tree shape (a test and research hook)"},
    {"quantize_q8", hook_quantize_q8, METH_O,
     "quantize_q8(x) -> bytes: one float32 row quantized as the integer kernels' activations"},
    {"dequantize", hook_dequantize, METH_VARARGS,
     "dequantize(type, data, n) -> float32 array: the row kernels' f32 values of n elements"},
    {"first_nonfinite", hook_first_nonfinite, METH_VARARGS,
     "first_nonfinite(type, data, n) -> the first element (of a block) whose value or scale is "
     "a NaN or an infinity, or -1: the model loader's check"},
    {"matmul_rows", hook_matmul_rows, METH_VARARGS,
     "matmul_rows(type, w, nrows, n, x, kernel) -> float32 (T, nrows) = x . W^T; kernel 0: the "
     "forward pass's, 1: portable, 2: SIMD without repacking"},
    {"kernel", hook_kernel, METH_VARARGS,
     "kernel(name, device, args) -> None: a CUDA kernel (device 1) or its CPU twin (0)"},
    {"kernel_names", hook_kernel_names, METH_NOARGS, "the kernels kernel() runs"},
    {"joint_counts", hook_joint_counts, METH_VARARGS,
     "joint_counts(model, drafter, prompt, runs, temperature, top_k, top_p, min_p, "
     "repetition_penalty=1, frequency_penalty=0, presence_penalty=0) -> (counts (V^3,), "
     "drafted, accepted): the first three tokens of seeded runs, counted in C"},
    {"bench_attention", hook_bench_attention, METH_VARARGS,
     "bench_attention(T, n_attn, n_heads, n_kv_heads, head_dim, n_layers, threads, iters) -> "
     "seconds per pass of the CPU attention over n_layers layers of an f16 cache"},
    {"copy_bench", hook_copy_bench, METH_VARARGS,
     "copy_bench(gpu, bytes, iters) -> seconds per device-to-device copy"},
    {NULL, NULL, 0, NULL},
};
