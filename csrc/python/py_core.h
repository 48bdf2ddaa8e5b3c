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

#include <pythread.h>

/* A thread waiting for a sequence slot (on its stack; a list under the GIL). */
typedef struct sd_py_waiter {
    struct sd_py_waiter *prev, *next;
} sd_py_waiter;

/* A model and the lock of its calls. A call holds it alone (its scratch buffers are shared),
 * except the steps of sequences, which share it: the model's scheduler runs them (sched.h). A
 * thread that finds the model held waits, with the GIL released, for its turn. */
typedef struct {
    PyObject_HEAD sd_model *model;
    PyThread_type_lock lock;
    /* the thread holding `lock` alone (read and written under the GIL), or 0 */
    unsigned long owner;
    /* threads waiting for `lock` (under the GIL): a holder coming back for its next call queues
     * behind them instead of taking it first */
    int waiting;
    /* sequence steps (and creations) running now (under the GIL): a call that holds the model
     * alone waits for them to end */
    int shared;
    /* admission (under the GIL): at most max_sequences open sequences (0: no limit); more wait
     * in line, first come first in */
    int max_sequences;
    int n_sequences;
    sd_py_waiter *first, *last;
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
extern PyMethodDef sd_py_format_methods[];  /* formats.c: the weight-file readers' hooks */

/* Sets the exception for a failed status (ValueError, OSError, MemoryError or RuntimeError, with
 * the core's message) unless one is already set; returns NULL. */
PyObject *sd_py_raise(sd_status st);
/* A Python list of n token ids. */
PyObject *sd_py_token_list(const int32_t *out, int n);
/* A new Model object owning m (freed on failure). */
PyObject *sd_py_model_wrap(sd_model *m);
/* Takes a model's lock for a call (waiting, the GIL released, while another thread's call runs;
 * -1 with an exception when the model is not loaded, when this thread already holds it (a
 * callback of a call using its own model) or on an interrupt while waiting), and gives it back.
 * The pair form takes a target's and a draft model's (b may be NULL or a) in one global order,
 * so that two threads taking the same two never wait on each other. */
int sd_py_model_enter(sd_py_Model *self);
void sd_py_model_leave(sd_py_Model *self);
int sd_py_models_enter(sd_py_Model *a, sd_py_Model *b);
void sd_py_models_leave(sd_py_Model *a, sd_py_Model *b);
/* The same for a sequence's step (or creation) on target a with draft model b (NULL, or a: the
 * target itself drafts): a is shared with the other sequences' steps, b held alone (its own
 * forwards have no scheduler); in the same global order. */
int sd_py_step_enter(sd_py_Model *a, sd_py_Model *b);
void sd_py_step_leave(sd_py_Model *a, sd_py_Model *b);
/* Waits (the GIL released, noticing Ctrl-C: -1 with the exception) until the model has a free
 * sequence slot and this thread is first in line, and takes the slot; gives one back. */
int sd_py_sequence_admit(sd_py_Model *self);
void sd_py_sequence_release(sd_py_Model *self);
/* Takes a free slot without waiting (when no one waits in line): 1, else 0. */
int sd_py_sequence_try_admit(sd_py_Model *self);
/* A 1-D int32 copy of a token sequence (PyMem_Free it), *n its length; `what` names it in
 * errors. Only integers are token ids. */
int32_t *sd_py_tokens_from(PyObject *obj, const char *what, Py_ssize_t *n);
/* The same for integers that are not token ids (positions, slots, layers), so worded. */
int32_t *sd_py_ints_from(PyObject *obj, const char *what, Py_ssize_t *n);
/* A float copy of a sequence of numbers (PyMem_Free it), *n its length. */
float *sd_py_floats_from(PyObject *obj, const char *what, Py_ssize_t *n);

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
/* The arguments of a decoding call (generate.c), parsed and converted: the prompt, the
 * parameters with their arrays (valid until sd_py_call_free), the drafter (borrowed) and, for
 * Model.generate, on_token (borrowed, Py_None when absent). */
typedef struct {
    sd_generate_params p;
    int32_t *prompt, *stops, *bias_ids;
    float *bias_values;
    Py_ssize_t n_prompt, n_bias;
    sd_py_bytes_list strings;
    sd_py_Drafter *drafter;
    PyObject *on_token;
    int reserved; /* Model.sequence's: its slot was taken by Model.try_reserve */
} sd_py_call;
int sd_py_call_parse(sd_py_call *c, PyObject *args, PyObject *kwds, int with_on_token);
void sd_py_call_free(sd_py_call *c);
/* "length", "stop_token", "stop_string" or "cancelled". */
const char *sd_py_finish_name(sd_finish_reason reason);

/* Model.generate (generate.c) and Model.sequence (sequence_type.c). */
PyObject *sd_py_model_generate(sd_py_Model *self, PyObject *args, PyObject *kwds);
PyObject *sd_py_model_sequence(sd_py_Model *self, PyObject *args, PyObject *kwds);
extern PyTypeObject sd_py_SequenceType;

#endif /* SD_PY_CORE_H */
