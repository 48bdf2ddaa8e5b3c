/* drafters.c — the Drafter type and one constructor per drafter (spec/drafters/): each parses
 * the drafter's parameters, lets the core check their ranges, and wraps the sd_drafter. A new
 * drafter adds its constructor here and one line to sd_py_drafter_methods. */
#include "python/py_core.h"

#include <string.h>

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

/* prompt_lookup(k, max_ngram, min_ngram, verify_slope, branching=1, size_by_cost=False)
 * -> Drafter */
static PyObject *py_prompt_lookup(PyObject *mod, PyObject *args, PyObject *kwds) {
    (void)mod;
    static char *kwlist[] = {"k",         "max_ngram",    "min_ngram", "verify_slope",
                             "branching", "size_by_cost", NULL};
    sd_prompt_lookup pl;
    memset(&pl, 0, sizeof(pl));
    pl.branching = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iiif|ip:prompt_lookup", kwlist, &pl.k,
                                     &pl.max_ngram, &pl.min_ngram, &pl.verify_slope, &pl.branching,
                                     &pl.size_by_cost)) {
        return NULL;
    }
    sd_drafter *d = NULL;
    const sd_status st = sd_drafter_prompt_lookup(&d, &pl);
    return st != SD_OK ? sd_py_raise(st) : drafter_wrap(d, NULL);
}

/* draft_model(model, k, p_min, verify_slope, branching=1, nodes=16) -> Drafter */
static PyObject *py_draft_model(PyObject *mod, PyObject *args, PyObject *kwds) {
    (void)mod;
    static char *kwlist[] = {"model",     "k",     "p_min",        "verify_slope",
                             "branching", "nodes", "size_by_cost", NULL};
    sd_py_Model *model = NULL;
    sd_draft_params dp = {0, 0.0f, 0.0f, 1, 16, 0};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!iff|iip:draft_model", kwlist, &sd_py_ModelType,
                                     &model, &dp.k, &dp.p_min, &dp.verify_slope, &dp.branching,
                                     &dp.nodes, &dp.size_by_cost)) {
        return NULL;
    }
    sd_drafter *d = NULL;
    const sd_status st = sd_drafter_draft_model(&d, model->model, &dp);
    return st != SD_OK ? sd_py_raise(st) : drafter_wrap(d, model);
}

/* layerskip(layers, k, p_min, verify_slope, branching=1, nodes=16) -> Drafter */
static PyObject *py_layerskip(PyObject *mod, PyObject *args, PyObject *kwds) {
    (void)mod;
    static char *kwlist[] = {"layers",    "k",     "p_min",        "verify_slope",
                             "branching", "nodes", "size_by_cost", NULL};
    int layers = 0;
    sd_draft_params dp = {0, 0.0f, 0.0f, 1, 16, 0};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iiff|iip:layerskip", kwlist, &layers, &dp.k,
                                     &dp.p_min, &dp.verify_slope, &dp.branching, &dp.nodes,
                                     &dp.size_by_cost)) {
        return NULL;
    }
    sd_drafter *d = NULL;
    const sd_status st = sd_drafter_layerskip(&d, layers, &dp);
    return st != SD_OK ? sd_py_raise(st) : drafter_wrap(d, NULL);
}

/* token_recycling(nodes, widths, top, adaptive, lookup=0) -> Drafter; widths: a sequence of 1
 * to SD_RECYCLE_MAX_DEPTH ints, its length the tree's depth */
static PyObject *py_token_recycling(PyObject *mod, PyObject *args, PyObject *kwds) {
    (void)mod;
    static char *kwlist[] = {"nodes", "widths", "top", "adaptive", "lookup", NULL};
    sd_token_recycling p;
    memset(&p, 0, sizeof(p));
    PyObject *widths = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOip|i:token_recycling", kwlist, &p.nodes,
                                     &widths, &p.top, &p.adaptive, &p.lookup)) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(widths, "widths must be a sequence of integers");
    if (seq == NULL) {
        return NULL;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > SD_RECYCLE_MAX_DEPTH) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "widths must hold 1 to %d levels, got %zd",
                     SD_RECYCLE_MAX_DEPTH, n);
        return NULL;
    }
    p.depth = (int)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        const long w = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (w == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        p.widths[i] = w < -1 || w > 1 << 20 ? -1 : (int)w;
    }
    Py_DECREF(seq);
    sd_drafter *d = NULL;
    const sd_status st = sd_drafter_token_recycling(&d, &p);
    return st != SD_OK ? sd_py_raise(st) : drafter_wrap(d, NULL);
}

/* drafter_costs(drafter, length=0) -> list[float]: sd_drafter_costs */
static PyObject *py_drafter_costs(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *obj = NULL;
    int len = 0;
    if (!PyArg_ParseTuple(args, "O!|i:drafter_costs", &sd_py_DrafterType, &obj, &len)) {
        return NULL;
    }
    float rel[SD_MAX_TREE_NODES + 1];
    const int n =
        sd_drafter_costs(((sd_py_Drafter *)obj)->drafter, len, rel, SD_MAX_TREE_NODES + 1);
    PyObject *list = PyList_New(n);
    for (int i = 0; list != NULL && i < n; i++) {
        PyList_SET_ITEM(list, i, PyFloat_FromDouble(rel[i]));
    }
    return list;
}

/* drafter_set_costs(drafter, list[float]): sd_drafter_set_costs */
static PyObject *py_drafter_set_costs(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *obj = NULL, *costs = NULL;
    if (!PyArg_ParseTuple(args, "O!O:drafter_set_costs", &sd_py_DrafterType, &obj, &costs)) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(costs, "costs must be a sequence of numbers");
    if (seq == NULL) {
        return NULL;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    float rel[SD_MAX_TREE_NODES + 1];
    for (Py_ssize_t i = 0; i < n && i <= SD_MAX_TREE_NODES; i++) {
        const double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1.0 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        rel[i] = (float)v;
    }
    Py_DECREF(seq);
    const sd_status st = sd_drafter_set_costs(((sd_py_Drafter *)obj)->drafter, rel,
                                              n > INT32_MAX ? INT32_MAX : (int)n);
    if (st != SD_OK) {
        return sd_py_raise(st);
    }
    Py_RETURN_NONE;
}

/* drafter_set_history(drafter, tokens): sd_drafter_set_history */
static PyObject *py_drafter_set_history(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *obj = NULL;
    int tokens = 0;
    if (!PyArg_ParseTuple(args, "O!i:drafter_set_history", &sd_py_DrafterType, &obj, &tokens)) {
        return NULL;
    }
    const sd_status st = sd_drafter_set_history(((sd_py_Drafter *)obj)->drafter, tokens);
    if (st != SD_OK) {
        return sd_py_raise(st);
    }
    Py_RETURN_NONE;
}

static PyObject *py_cost_fit(PyObject *mod, PyObject *points) {
    (void)mod;
    PyObject *seq = PySequence_Fast(points, "points must be a sequence of (length, T, seconds)");
    if (seq == NULL) {
        return NULL;
    }
    enum { MOST = 64 };
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    double len[MOST], add[MOST];
    int T[MOST];
    if (n > MOST) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "cost_fit: at most %d points, got %zd", MOST, n);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "did:cost_fit", &len[i], &T[i],
                              &add[i])) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    double b0 = 0.0, b1 = 0.0;
    sd_verify_cost_fit(len, T, add, (int)n, &b0, &b1);
    return Py_BuildValue("(dd)", b0, b1);
}

/* A head read from `path` (and quantized to Q8_0 when q8), for a drafter to own. */
static sd_status load_head(sd_head **head, PyObject *path, int q8) {
    sd_status st;
    const char *p = PyBytes_AS_STRING(path);
    Py_BEGIN_ALLOW_THREADS st = sd_head_load(head, p);
    if (st == SD_OK && q8) {
        st = sd_head_quantize(*head);
    }
    Py_END_ALLOW_THREADS if (st != SD_OK) {
        sd_head_free(*head);
        *head = NULL;
    }
    return st;
}

/* eagle(path, k, p_min, branching=1, nodes=16, q8=1, size_by_cost=0, lookup=0, window=0) ->
 * Drafter: an EAGLE-1/2 or EAGLE-3 head */
static PyObject *py_eagle(PyObject *mod, PyObject *args, PyObject *kwds) {
    (void)mod;
    static char *kwlist[] = {"path",         "k",      "p_min",  "branching", "nodes", "q8",
                             "size_by_cost", "lookup", "window", NULL};
    PyObject *path = NULL;
    sd_draft_params dp = {0, 0.0f, 0.0f, 1, 16, 0};
    int q8 = 1, lookup = 0, window = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&if|iippii:eagle", kwlist, PyUnicode_FSConverter,
                                     &path, &dp.k, &dp.p_min, &dp.branching, &dp.nodes, &q8,
                                     &dp.size_by_cost, &lookup, &window)) {
        return NULL;
    }
    sd_head *head = NULL;
    sd_drafter *d = NULL;
    sd_status st = load_head(&head, path, q8);
    if (st == SD_OK) {
        st = sd_drafter_eagle(&d, head, &dp, lookup, window); /* owns the head from here on */
    }
    Py_DECREF(path);
    return st != SD_OK ? sd_py_raise(st) : drafter_wrap(d, NULL);
}

/* medusa(path, paths, q8=1) -> Drafter: Medusa heads and a static tree (a sequence of paths, each a
 * sequence of ranks) */
static PyObject *py_medusa(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *path = NULL, *paths_obj = NULL, *seq = NULL;
    int32_t *flat = NULL, *start = NULL, *len = NULL;
    int q8 = 1;
    if (!PyArg_ParseTuple(args, "O&O|p:medusa", PyUnicode_FSConverter, &path, &paths_obj, &q8)) {
        return NULL;
    }
    const int dflt = paths_obj == Py_None; /* the default tree */
    seq = dflt ? PyTuple_New(0) : PySequence_Fast(paths_obj, "tree must be a sequence of paths");
    Py_ssize_t n = seq != NULL ? PySequence_Fast_GET_SIZE(seq) : 0, total = 0;
    if (seq == NULL || n > SD_MAX_TREE_NODES) {
        if (seq != NULL) {
            PyErr_Format(PyExc_ValueError, "a Medusa tree needs 1 to %d paths, got %zd",
                         SD_MAX_TREE_NODES, n);
        }
        goto fail;
    }
    start = PyMem_Calloc((size_t)n + 1, sizeof(int32_t));
    len = PyMem_Calloc((size_t)n + 1, sizeof(int32_t));
    flat = PyMem_Calloc((size_t)n * 32 + 1, sizeof(int32_t));
    if (start == NULL || len == NULL || flat == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t m = 0;
        int32_t *ranks = sd_py_ints_from(PySequence_Fast_GET_ITEM(seq, i), "tree path", &m);
        if (ranks == NULL) {
            goto fail;
        }
        if (m > 32) {
            PyMem_Free(ranks);
            PyErr_Format(PyExc_ValueError, "Medusa tree path %zd is %zd long", i, m);
            goto fail;
        }
        start[i] = (int32_t)total;
        len[i] = (int32_t)m;
        memcpy(flat + total, ranks, (size_t)m * sizeof(int32_t));
        total += m;
        PyMem_Free(ranks);
    }
    sd_head *head = NULL;
    sd_drafter *d = NULL;
    sd_status st = load_head(&head, path, q8);
    if (st == SD_OK) {
        st = sd_drafter_medusa(&d, head, dflt ? NULL : flat, start, len, (int)n); /* owns it */
    }
    PyMem_Free(flat);
    PyMem_Free(start);
    PyMem_Free(len);
    Py_DECREF(seq);
    Py_DECREF(path);
    return st != SD_OK ? sd_py_raise(st) : drafter_wrap(d, NULL);
fail:
    PyMem_Free(flat);
    PyMem_Free(start);
    PyMem_Free(len);
    Py_XDECREF(seq);
    Py_DECREF(path);
    return NULL;
}

/* head_info(drafter) -> (sd_head_kind, Medusa's head count) of a learned drafter's head */
static PyObject *py_head_info(PyObject *mod, PyObject *arg) {
    (void)mod;
    if (!PyObject_TypeCheck(arg, &sd_py_DrafterType)) {
        PyErr_Format(PyExc_TypeError, "expected a Drafter, got %s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    const sd_head *h = sd_drafter_head(((sd_py_Drafter *)arg)->drafter);
    if (h == NULL) {
        PyErr_SetString(PyExc_ValueError, "the drafter has no head");
        return NULL;
    }
    return Py_BuildValue("(ii)", sd_head_kind_of(h), sd_head_medusa_heads(h));
}

/* head_draft_logits(drafter, model, tokens, window=0) -> float32 (len(tokens) - 1, V), or
 * Medusa's (heads, len(tokens), V) */
static PyObject *py_head_draft_logits(PyObject *mod, PyObject *args) {
    (void)mod;
    sd_py_Drafter *dr = NULL;
    sd_py_Model *model = NULL;
    PyObject *tok_obj = NULL;
    int window = 0;
    if (!PyArg_ParseTuple(args, "O!O!O|i:head_draft_logits", &sd_py_DrafterType, &dr,
                          &sd_py_ModelType, &model, &tok_obj, &window)) {
        return NULL;
    }
    const sd_head *h = sd_drafter_head(dr->drafter);
    if (h == NULL) {
        PyErr_SetString(PyExc_ValueError, "the drafter has no head");
        return NULL;
    }
    Py_ssize_t n = 0;
    int32_t *tokens = sd_py_tokens_from(tok_obj, "tokens", &n);
    if (tokens == NULL) {
        return NULL;
    }
    if (n < 2 || n > INT32_MAX) {
        PyMem_Free(tokens);
        PyErr_Format(PyExc_ValueError,
                     "draft logits need at least 2 tokens (row t predicts token t + 2), got %zd",
                     n);
        return NULL;
    }
    const int heads = sd_head_medusa_heads(h);
    npy_intp dims[3] = {heads, heads > 0 ? n : n - 1, sd_model_config(model->model)->vocab_size};
    PyArrayObject *out = (PyArrayObject *)(heads > 0 ? PyArray_SimpleNew(3, dims, NPY_FLOAT32)
                                                     : PyArray_SimpleNew(2, dims + 1, NPY_FLOAT32));
    if (out == NULL || sd_py_model_enter(model) < 0) {
        PyMem_Free(tokens);
        Py_XDECREF(out);
        return NULL;
    }
    sd_status st;
    float *dst = (float *)PyArray_DATA(out);
    Py_BEGIN_ALLOW_THREADS st = sd_head_draft_logits(h, model->model, tokens, (int)n, window, dst);
    Py_END_ALLOW_THREADS sd_py_model_leave(model);
    PyMem_Free(tokens);
    if (st != SD_OK) {
        Py_DECREF(out);
        return sd_py_raise(st);
    }
    return (PyObject *)out;
}

PyMethodDef sd_py_drafter_methods[] = {
    {"eagle", (PyCFunction)(void (*)(void))py_eagle, METH_VARARGS | METH_KEYWORDS,
     "eagle(path, k, p_min, branching=1, nodes=16, q8=True) -> Drafter (an EAGLE-1/2 or EAGLE-3 "
     "head; q8: its matrices as Q8_0 copies)"},
    {"medusa", (PyCFunction)py_medusa, METH_VARARGS,
     "medusa(path, tree, q8=True) -> Drafter (Medusa heads; tree: a sequence of paths of ranks)"},
    {"head_info", (PyCFunction)py_head_info, METH_O,
     "head_info(drafter) -> (kind: 1 EAGLE-1/2, 3 EAGLE-3, 4 Medusa; Medusa's head count)"},
    {"head_draft_logits", (PyCFunction)py_head_draft_logits, METH_VARARGS,
     "head_draft_logits(drafter, model, tokens, window=0) -> (len(tokens) - 1, V) teacher-forced "
     "logits"},
    {"prompt_lookup", (PyCFunction)(void (*)(void))py_prompt_lookup, METH_VARARGS | METH_KEYWORDS,
     "prompt_lookup(k, max_ngram, min_ngram, verify_slope, branching=1, size_by_cost=False) "
     "-> Drafter "
     "(sd_prompt_lookup)"},
    {"draft_model", (PyCFunction)(void (*)(void))py_draft_model, METH_VARARGS | METH_KEYWORDS,
     "draft_model(model, k, p_min, verify_slope, branching=1, nodes=16) -> Drafter "
     "(sd_draft_params)"},
    {"layerskip", (PyCFunction)(void (*)(void))py_layerskip, METH_VARARGS | METH_KEYWORDS,
     "layerskip(layers, k, p_min, verify_slope, branching=1, nodes=16) -> Drafter (the "
     "target's first layers)"},
    {"token_recycling", (PyCFunction)(void (*)(void))py_token_recycling,
     METH_VARARGS | METH_KEYWORDS,
     "token_recycling(nodes, widths, top, adaptive) -> Drafter (sd_token_recycling)"},
    {"drafter_costs", (PyCFunction)py_drafter_costs, METH_VARARGS,
     "drafter_costs(drafter, length=0) -> list[float]: the verify costs a tree drafter sizes "
     "trees by after a text of `length` tokens"},
    {"drafter_set_costs", (PyCFunction)py_drafter_set_costs, METH_VARARGS,
     "drafter_set_costs(drafter, costs): give them instead of measuring"},
    {"drafter_set_history", (PyCFunction)py_drafter_set_history, METH_VARARGS,
     "drafter_set_history(drafter, tokens): keep earlier requests' outputs for lookup (0: none)"},
    {"cost_fit", (PyCFunction)py_cost_fit, METH_O,
     "cost_fit(points) -> (b0, b1): sd_verify_cost_fit over (length, T, seconds) points"},
    {NULL, NULL, 0, NULL},
};
