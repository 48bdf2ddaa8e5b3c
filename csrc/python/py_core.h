/* py_core.h — what the files of the Python boundary share: Python.h and NumPy (included here and
 * nowhere outside csrc/python/), the object layouts of Model, KVCache and Drafter, and the
 * conversions every method uses. Arguments are converted with explicit dtypes, the GIL is
 * released around every C call that computes, and statuses become exceptions carrying the
 * core's message. */
#ifndef SD_PY_CORE_H
#define SD_PY_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL sd_py_ARRAY_API
#ifndef SD_PY_MODULE_C
#define NO_IMPORT_ARRAY /* module.c imports NumPy's C API once for all files */
#endif
#include <numpy/arrayobject.h>

#include <stdint.h>

#include "specdec.h"

typedef struct {
    PyObject_HEAD sd_model *model;
    int busy; /* set while a call runs without the GIL: a second thread gets an error, not a race */
} sd_py_Model;

typedef struct {
    PyObject_HEAD sd_kv_cache *kv;
    PyObject *owner; /* the sd_py_Model this cache was made for */
} sd_py_Cache;

/* A drafter's parameters (sd_drafter), and the model it drafts with, if any, kept alive. */
typedef struct {
    PyObject_HEAD sd_drafter *drafter;
    sd_py_Model *model; /* a draft model's object, or NULL */
} sd_py_Drafter;

extern PyTypeObject sd_py_ModelType;
extern PyTypeObject sd_py_CacheType;
extern PyTypeObject sd_py_DrafterType;

/* The module functions of each file, added to the module at its creation. */
extern PyMethodDef sd_py_module_methods[];  /* module.c */
extern PyMethodDef sd_py_hook_methods[];    /* hooks.c: test and research hooks */
extern PyMethodDef sd_py_drafter_methods[]; /* drafters.c: the drafters' constructors */

/* Sets the exception for a failed status (ValueError, OSError, MemoryError or RuntimeError, with
 * the core's message) unless one is already set; returns NULL. */
PyObject *sd_py_raise(sd_status st);
/* A Python list of n token ids. */
PyObject *sd_py_token_list(const int32_t *out, int n);
/* A new Model object owning m (freed on failure). */
PyObject *sd_py_model_wrap(sd_model *m);
/* Marks a model busy for a call without the GIL (RuntimeError when it already is), and clears
 * the mark. */
int sd_py_model_enter(sd_py_Model *self);
void sd_py_model_leave(sd_py_Model *self);
/* A 1-D int32 copy of a token sequence (PyMem_Free it), *n its length; `what` names it in
 * errors. Only integers are token ids. */
int32_t *sd_py_tokens_from(PyObject *obj, const char *what, Py_ssize_t *n);

/* A list of bytes objects as C views, valid while `seq` lives. */
typedef struct {
    PyObject *seq;
    const char **ptrs;
    size_t *lens;
    Py_ssize_t n;
} sd_py_bytes_list;
int sd_py_bytes_list_from(sd_py_bytes_list *b, PyObject *obj, const char *what);
void sd_py_bytes_list_free(sd_py_bytes_list *b);

/* The statistics of a speculative run as a dict (per-position counts for k positions). */
PyObject *sd_py_stats_dict(const sd_spec_stats *st, int k);
/* Model.generate (generate.c). */
PyObject *sd_py_model_generate(sd_py_Model *self, PyObject *args, PyObject *kwds);

#endif /* SD_PY_CORE_H */
