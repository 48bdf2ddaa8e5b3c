/* drafters.c — the Drafter type and one constructor per drafter (spec/drafters/): each parses
 * the drafter's parameters, lets the core check their ranges, and wraps the sd_drafter. A new
 * drafter adds its constructor here and one line to sd_py_drafter_methods. */
#include "python/py_core.h"

static void drafter_dealloc(sd_py_Drafter *self) {
    sd_drafter_free(self->drafter);
    Py_XDECREF(self->model);
    PyObject_Free(self);
}

/* A new Drafter owning d (freed on failure), holding `model` (may be NULL). */
static PyObject *drafter_wrap(sd_drafter *d, sd_py_Model *model) {
    sd_py_Drafter *self = PyObject_New(sd_py_Drafter, &sd_py_DrafterType);
    if (self == NULL) {
        sd_drafter_free(d);
        return NULL;
    }
    self->drafter = d;
    self->model = model;
    Py_XINCREF(model);
    return (PyObject *)self;
}

static PyObject *drafter_name(sd_py_Drafter *self, void *closure) {
    (void)closure;
    return PyUnicode_FromString(sd_drafter_name(self->drafter));
}

static PyObject *drafter_max_draft(sd_py_Drafter *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(sd_drafter_max_draft(self->drafter));
}

static PyGetSetDef drafter_getset[] = {
    {"name", (getter)drafter_name, NULL, "the drafter's kind", NULL},
    {"max_draft", (getter)drafter_max_draft, NULL, "the most draft tokens per step", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject sd_py_DrafterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "specdec._core.Drafter",
    .tp_basicsize = sizeof(sd_py_Drafter),
    .tp_dealloc = (destructor)drafter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A drafter's parameters (C core), made by prompt_lookup(), draft_model() or "
              "layerskip(); pass it to Model.generate(drafter=...).",
    .tp_getset = drafter_getset,
};

/* prompt_lookup(k, max_ngram, min_ngram, verify_slope) -> Drafter */
static PyObject *py_prompt_lookup(PyObject *mod, PyObject *args, PyObject *kwds) {
    (void)mod;
    static char *kwlist[] = {"k", "max_ngram", "min_ngram", "verify_slope", NULL};
    sd_prompt_lookup pl = {0, 0, 0, 0.0f};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iiif:prompt_lookup", kwlist, &pl.k, &pl.max_ngram,
                                     &pl.min_ngram, &pl.verify_slope)) {
        return NULL;
    }
    sd_drafter *d = NULL;
    const sd_status st = sd_drafter_prompt_lookup(&d, &pl);
    return st != SD_OK ? sd_py_raise(st) : drafter_wrap(d, NULL);
}

/* draft_model(model, k, p_min, verify_slope) -> Drafter */
static PyObject *py_draft_model(PyObject *mod, PyObject *args, PyObject *kwds) {
    (void)mod;
    static char *kwlist[] = {"model", "k", "p_min", "verify_slope", NULL};
    sd_py_Model *model = NULL;
    sd_draft_params dp = {0, 0.0f, 0.0f};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!iff:draft_model", kwlist, &sd_py_ModelType,
                                     &model, &dp.k, &dp.p_min, &dp.verify_slope)) {
        return NULL;
    }
    sd_drafter *d = NULL;
    const sd_status st = sd_drafter_draft_model(&d, model->model, &dp);
    return st != SD_OK ? sd_py_raise(st) : drafter_wrap(d, model);
}

/* layerskip(layers, k, p_min, verify_slope) -> Drafter */
static PyObject *py_layerskip(PyObject *mod, PyObject *args, PyObject *kwds) {
    (void)mod;
    static char *kwlist[] = {"layers", "k", "p_min", "verify_slope", NULL};
    int layers = 0;
    sd_draft_params dp = {0, 0.0f, 0.0f};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iiff:layerskip", kwlist, &layers, &dp.k,
                                     &dp.p_min, &dp.verify_slope)) {
        return NULL;
    }
    sd_drafter *d = NULL;
    const sd_status st = sd_drafter_layerskip(&d, layers, &dp);
    return st != SD_OK ? sd_py_raise(st) : drafter_wrap(d, NULL);
}

PyMethodDef sd_py_drafter_methods[] = {
    {"prompt_lookup", (PyCFunction)(void (*)(void))py_prompt_lookup, METH_VARARGS | METH_KEYWORDS,
     "prompt_lookup(k, max_ngram, min_ngram, verify_slope) -> Drafter (sd_prompt_lookup)"},
    {"draft_model", (PyCFunction)(void (*)(void))py_draft_model, METH_VARARGS | METH_KEYWORDS,
     "draft_model(model, k, p_min, verify_slope) -> Drafter (sd_draft_params)"},
    {"layerskip", (PyCFunction)(void (*)(void))py_layerskip, METH_VARARGS | METH_KEYWORDS,
     "layerskip(layers, k, p_min, verify_slope) -> Drafter (the target's first layers)"},
    {NULL, NULL, 0, NULL},
};
