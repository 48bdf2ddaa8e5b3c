/* convert.c — conversions at the Python boundary: statuses to exceptions, token sequences to
 * int32 arrays, lists of bytes to C views, and the lock of a model. */
#include "python/py_core.h"

#include <stdint.h>
#include <string.h>
#include <time.h>

PyObject *sd_py_raise(sd_status st) {
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
    case SD_ERR_NUMERIC: type = PyExc_FloatingPointError; break;
    default: type = PyExc_RuntimeError; break;
    }
    const char *msg = sd_last_error();
    PyErr_SetString(type, msg[0] != '\0' ? msg : sd_status_name(st));
    return NULL;
}

/* A Python list of n token ids. */
PyObject *sd_py_token_list(const int32_t *out, int n) {
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

/* Takes self->lock (see sd_py_model_enter), not yet waiting for shared steps. */
static int take_lock(sd_py_Model *self) {
    if (self->model == NULL || self->lock == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "model is not loaded");
        return -1;
    }
    const unsigned long me = PyThread_get_thread_ident();
    if (self->owner == me) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this model is already running a call in this thread: a callback "
                        "of a call cannot use the model that calls it");
        return -1;
    }
    if (self->waiting > 0 || !PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        self->waiting++;
        int interrupted = 0;
        for (;;) { /* wait for the running call, noticing signals (Ctrl-C) */
            PyLockStatus r;
            Py_BEGIN_ALLOW_THREADS r = PyThread_acquire_lock_timed(self->lock, -1, 1);
            Py_END_ALLOW_THREADS if (r == PY_LOCK_ACQUIRED) {
                break;
            }
            if (PyErr_CheckSignals() < 0) {
                interrupted = 1;
                break;
            }
        }
        self->waiting--;
        if (interrupted) {
            return -1;
        }
    }
    self->owner = me;
    return 0;
}

int sd_py_model_enter(sd_py_Model *self) {
    if (take_lock(self) < 0) {
        return -1;
    }
    /* the steps running now end (no new one starts while the lock is held) */
    while (self->shared > 0) {
        Py_BEGIN_ALLOW_THREADS struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
        Py_END_ALLOW_THREADS if (PyErr_CheckSignals() < 0) {
            sd_py_model_leave(self);
            return -1;
        }
    }
    return 0;
}

void sd_py_model_leave(sd_py_Model *self) {
    self->owner = 0;
    PyThread_release_lock(self->lock);
}

/* a shared holder: waits for a call holding the model alone, then counts itself in */
static int enter_shared(sd_py_Model *self) {
    if (take_lock(self) < 0) {
        return -1;
    }
    self->shared++;
    sd_py_model_leave(self);
    return 0;
}

static int enter_either(sd_py_Model *self, int shared) {
    return shared ? enter_shared(self) : sd_py_model_enter(self);
}

static void leave_either(sd_py_Model *self, int shared) {
    if (shared) {
        self->shared--;
    } else {
        sd_py_model_leave(self);
    }
}

/* a and b (b may be NULL or a; a shared when a_shared), in one global order */
static int enter_pair(sd_py_Model *a, sd_py_Model *b, int a_shared) {
    if (b == NULL || b == a) {
        return enter_either(a, a_shared);
    }
    const int a_first = (uintptr_t)a < (uintptr_t)b;
    sd_py_Model *first = a_first ? a : b, *second = a_first ? b : a;
    const int s1 = a_first && a_shared, s2 = !a_first && a_shared;
    if (enter_either(first, s1) < 0) {
        return -1;
    }
    if (enter_either(second, s2) < 0) {
        leave_either(first, s1);
        return -1;
    }
    return 0;
}

static void leave_pair(sd_py_Model *a, sd_py_Model *b, int a_shared) {
    leave_either(a, a_shared);
    if (b != NULL && b != a) {
        leave_either(b, 0);
    }
}

int sd_py_models_enter(sd_py_Model *a, sd_py_Model *b) {
    return enter_pair(a, b, 0);
}

void sd_py_models_leave(sd_py_Model *a, sd_py_Model *b) {
    leave_pair(a, b, 0);
}

int sd_py_step_enter(sd_py_Model *a, sd_py_Model *b) {
    return enter_pair(a, b, 1);
}

void sd_py_step_leave(sd_py_Model *a, sd_py_Model *b) {
    leave_pair(a, b, 1);
}

/* a slot is free (max_sequences 0: no limit) */
static int slot_free(const sd_py_Model *self) {
    return self->max_sequences <= 0 || self->n_sequences < self->max_sequences;
}

int sd_py_sequence_try_admit(sd_py_Model *self) {
    if (self->first == NULL && slot_free(self)) {
        self->n_sequences++;
        return 1;
    }
    return 0;
}

int sd_py_sequence_admit(sd_py_Model *self) {
    if (self->first == NULL && slot_free(self)) {
        self->n_sequences++;
        return 0;
    }
    sd_py_waiter me = {self->last, NULL};
    if (self->last != NULL) {
        self->last->next = &me;
    } else {
        self->first = &me;
    }
    self->last = &me;
    int interrupted = 0;
    while (self->first != &me || !slot_free(self)) {
        Py_BEGIN_ALLOW_THREADS struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        Py_END_ALLOW_THREADS if (PyErr_CheckSignals() < 0) {
            interrupted = 1;
            break;
        }
    }
    /* out of the line */
    if (me.prev != NULL) {
        me.prev->next = me.next;
    } else {
        self->first = me.next;
    }
    if (me.next != NULL) {
        me.next->prev = me.prev;
    } else {
        self->last = me.prev;
    }
    if (interrupted) {
        return -1;
    }
    self->n_sequences++;
    return 0;
}

void sd_py_sequence_release(sd_py_Model *self) {
    self->n_sequences--;
}

/* A 1-D int32 copy of a sequence of integers (floats and bools are a TypeError, not silently
 * truncated); values outside int32 are reported as out of range. `tokens`: the messages call
 * them token ids. */
static int32_t *int32_from(PyObject *obj, const char *what, int tokens, Py_ssize_t *n) {
    const char *ids = tokens ? "integer token ids" : "integers",
               *id = tokens ? "token id" : "value";
    PyArrayObject *raw = NULL, *a = NULL;
    int32_t *dst = NULL;
    raw = (PyArrayObject *)PyArray_FromAny(obj, NULL, 1, 1, NPY_ARRAY_DEFAULT, NULL);
    if (raw == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_ValueError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s must be a 1-D sequence of %s", what, ids);
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
            PyErr_Format(PyExc_TypeError, "%s must be %s, got %s values", what, ids,
                         PyArray_DESCR(raw)->typeobj->tp_name);
            goto fail;
        }
    }
    a = (PyArrayObject *)PyArray_FROMANY((PyObject *)raw, NPY_INT64, 1, 1,
                                         NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
    if (a == NULL) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s: a %s is out of range (beyond 64 bits)", what, id);
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
            PyErr_Format(PyExc_ValueError, "%s: %s %lld at index %zd is out of range", what, id,
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

int32_t *sd_py_tokens_from(PyObject *obj, const char *what, Py_ssize_t *n) {
    return int32_from(obj, what, 1, n);
}

int32_t *sd_py_ints_from(PyObject *obj, const char *what, Py_ssize_t *n) {
    return int32_from(obj, what, 0, n);
}

float *sd_py_floats_from(PyObject *obj, const char *what, Py_ssize_t *n) {
    PyObject *seq = PySequence_Fast(obj, what);
    if (seq == NULL) {
        return NULL;
    }
    *n = PySequence_Fast_GET_SIZE(seq);
    float *dst = PyMem_Malloc((size_t)(*n > 0 ? *n : 1) * sizeof(float));
    if (dst == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        const double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError, "%s must be a sequence of numbers", what);
            PyMem_Free(dst);
            Py_DECREF(seq);
            return NULL;
        }
        dst[i] = (float)v;
    }
    Py_DECREF(seq);
    return dst;
}

void sd_py_bytes_list_free(sd_py_bytes_list *b) {
    Py_XDECREF(b->seq);
    PyMem_Free(b->ptrs);
    PyMem_Free(b->lens);
    memset(b, 0, sizeof(*b));
}

int sd_py_bytes_list_from(sd_py_bytes_list *b, PyObject *obj, const char *what) {
    memset(b, 0, sizeof(*b));
    b->seq = PySequence_Fast(obj, what);
    if (b->seq == NULL) {
        return -1;
    }
    b->n = PySequence_Fast_GET_SIZE(b->seq);
    b->ptrs = PyMem_Malloc((size_t)(b->n > 0 ? b->n : 1) * sizeof(char *));
    b->lens = PyMem_Malloc((size_t)(b->n > 0 ? b->n : 1) * sizeof(size_t));
    if (b->ptrs == NULL || b->lens == NULL) {
        sd_py_bytes_list_free(b);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < b->n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(b->seq, i);
        char *ptr = NULL;
        Py_ssize_t len = 0;
        if (PyBytes_AsStringAndSize(item, &ptr, &len) < 0) {
            sd_py_bytes_list_free(b);
            PyErr_Format(PyExc_TypeError, "%s must be a sequence of bytes", what);
            return -1;
        }
        b->ptrs[i] = ptr;
        b->lens[i] = (size_t)len;
    }
    return 0;
}
