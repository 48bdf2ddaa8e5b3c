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

static PyObject *cache_rollback(sd_py_Cache *self, PyObject *args) {
    int n = 0;
    if (!PyArg_ParseTuple(args, "i:rollback", &n)) {
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
    if (!PyArg_ParseTuple(args, "ii:copy_slot", &dst, &src)) {
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
