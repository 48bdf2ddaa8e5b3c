/* cache_type.c — the KVCache type: a model's slot-addressed cache, its length and capacity,
 * rollback and slot copies. */
#include "python/py_core.h"

static void cache_dealloc(sd_py_Cache *self) {
    sd_kv_cache_free(self->kv);
    Py_XDECREF(self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *cache_length(sd_py_Cache *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(sd_kv_cache_length(self->kv));
}

static PyObject *cache_capacity(sd_py_Cache *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(sd_kv_cache_capacity(self->kv));
}

/* An integer argument (a Python or NumPy integer, not a bool) as a C int: TypeError or
 * ValueError naming it otherwise, where "i" would give an OverflowError naming nothing. The
 * core checks the range itself. */
static int int_arg(PyObject *v, const char *name, int *out) {
    if (PyBool_Check(v) || !PyIndex_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s must be an integer, got %R", name, v);
        return -1;
    }
    PyObject *i = PyNumber_Index(v);
    if (i == NULL) {
        return -1;
    }
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(i, &overflow);
    Py_DECREF(i);
    if (x == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow != 0 || x < INT_MIN || x > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "%s %R is out of range", name, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static PyObject *cache_rollback(sd_py_Cache *self, PyObject *args) {
    int n = 0;
    PyObject *n_obj = NULL;
    if (!PyArg_ParseTuple(args, "O:rollback", &n_obj) || int_arg(n_obj, "n", &n) < 0) {
        return NULL;
    }
    if (sd_py_model_enter((sd_py_Model *)self->owner) < 0) {
        return NULL;
    }
    sd_status st = sd_kv_cache_set_length(self->kv, n);
    sd_py_model_leave((sd_py_Model *)self->owner);
    if (st != SD_OK) {
        return sd_py_raise(st);
    }
    Py_RETURN_NONE;
}

static PyObject *cache_copy_slot(sd_py_Cache *self, PyObject *args) {
    int dst = 0, src = 0;
    PyObject *dst_obj = NULL, *src_obj = NULL;
    if (!PyArg_ParseTuple(args, "OO:copy_slot", &dst_obj, &src_obj) ||
        int_arg(dst_obj, "dst", &dst) < 0 || int_arg(src_obj, "src", &src) < 0) {
        return NULL;
    }
    if (sd_py_model_enter((sd_py_Model *)self->owner) < 0) {
        return NULL;
    }
    sd_status st = sd_kv_cache_copy_slot(self->kv, dst, src);
    sd_py_model_leave((sd_py_Model *)self->owner);
    if (st != SD_OK) {
        return sd_py_raise(st);
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

PyTypeObject sd_py_CacheType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "specdec.KVCache",
    .tp_basicsize = sizeof(sd_py_Cache),
    .tp_dealloc = (destructor)cache_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Slot-addressed key/value cache of one model. Create with Model.new_cache().",
    .tp_methods = cache_methods,
    .tp_getset = cache_getset,
};
