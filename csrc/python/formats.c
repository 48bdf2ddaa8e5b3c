/* formats.c — test hooks for the weight-file readers: the tensors of a PyTorch checkpoint (read
 * without torch, format/torch_bin.h) or of any one weights file, as NumPy copies, so the tests
 * can hold the readers against the values they wrote. */
#include "python/py_core.h"

#include <string.h>

#include "format/torch_bin.h"

/* The NumPy type of a tensor's elements by its type name; BF16 comes back as its raw uint16
 * bits (NumPy has no bfloat16). */
static int numpy_type(const char *type_name) {
    static const struct {
        const char *name;
        int npy;
    } table[] = {
        {"F32", NPY_FLOAT32}, {"F16", NPY_FLOAT16}, {"BF16", NPY_UINT16}, {"F64", NPY_FLOAT64},
        {"I64", NPY_INT64},   {"I32", NPY_INT32},   {"I16", NPY_INT16},   {"I8", NPY_INT8},
        {"U8", NPY_UINT8},    {"BOOL", NPY_BOOL},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        if (strcmp(table[i].name, type_name) == 0) {
            return table[i].npy;
        }
    }
    return -1;
}

/* {name: (type_name, shape, array copy)} of a tensor set. */
static PyObject *set_dict(const sd_st_set *set) {
    PyObject *d = PyDict_New();
    for (int i = 0; d != NULL && i < set->n_tensors; i++) {
        const sd_tensor_info *t = &set->tensors[i];
        const int npy = numpy_type(t->type_name);
        if (npy < 0) {
            PyErr_Format(PyExc_ValueError, "tensor '%s' has type %s, which has no NumPy type",
                         t->name, t->type_name);
            Py_CLEAR(d);
            break;
        }
        npy_intp dims[SD_MAX_DIMS];
        PyObject *shape = PyTuple_New(t->n_dims);
        for (int k = 0; shape != NULL && k < t->n_dims; k++) {
            dims[k] = (npy_intp)t->shape[k];
            PyTuple_SET_ITEM(shape, k, PyLong_FromLongLong(t->shape[k]));
        }
        PyObject *arr = shape != NULL ? PyArray_SimpleNew(t->n_dims, dims, npy) : NULL;
        PyObject *item = NULL;
        if (arr != NULL && (size_t)PyArray_NBYTES((PyArrayObject *)arr) != t->nbytes) {
            PyErr_Format(PyExc_RuntimeError, "tensor '%s': %zu bytes for its shape", t->name,
                         t->nbytes);
        } else if (arr != NULL) {
            if (t->nbytes > 0) {
                memcpy(PyArray_DATA((PyArrayObject *)arr), t->data, t->nbytes);
            }
            item = Py_BuildValue("(sOO)", t->type_name, shape, arr);
        }
        Py_XDECREF(shape);
        Py_XDECREF(arr);
        if (item == NULL || PyDict_SetItemString(d, t->name, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(d);
            break;
        }
        Py_DECREF(item);
    }
    return d;
}

/* Open `path` (the one argument) with `open` and return its tensors. */
static PyObject *open_with(PyObject *args, const char *fmt,
                           sd_status (*open)(sd_st_set **, const char *)) {
    PyObject *path_obj = NULL;
    if (!PyArg_ParseTuple(args, fmt, PyUnicode_FSConverter, &path_obj)) {
        return NULL;
    }
    const char *path = PyBytes_AS_STRING(path_obj);
    sd_st_set *set = NULL;
    sd_status st;
    Py_BEGIN_ALLOW_THREADS st = open(&set, path);
    Py_END_ALLOW_THREADS Py_DECREF(path_obj);
    if (st != SD_OK) {
        return sd_py_raise(st);
    }
    PyObject *d = set_dict(set);
    sd_st_close(set);
    return d;
}

static PyObject *hook_torch_bin_tensors(PyObject *mod, PyObject *args) {
    (void)mod;
    return open_with(args, "O&:torch_bin_tensors", sd_torch_bin_open);
}

static PyObject *hook_tensor_file_tensors(PyObject *mod, PyObject *args) {
    (void)mod;
    return open_with(args, "O&:tensor_file_tensors", sd_tensor_set_open_file);
}

PyMethodDef sd_py_format_methods[] = {
    {"torch_bin_tensors", hook_torch_bin_tensors, METH_VARARGS,
     "torch_bin_tensors(path) -> {name: (dtype, shape, array)}: a PyTorch checkpoint read "
     "without torch (BF16 as uint16 bits)"},
    {"tensor_file_tensors", hook_tensor_file_tensors, METH_VARARGS,
     "tensor_file_tensors(path) -> {name: (dtype, shape, array)}: one .safetensors, .bin or .pt "
     "file, by its content"},
    {NULL, NULL, 0, NULL},
};
