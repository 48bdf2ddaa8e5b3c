/* sequence_type.c — the Sequence type: one request decoded a step at a time (sd_sequence), each
 * step a C call with the GIL released, so that the thread stepping it streams the tokens and
 * notices Ctrl-C between steps. Steps share the model's lock: the steps of other threads'
 * requests on the same model go through the model's scheduler with it, which puts their forwards
 * into one. specdec.generate and specdec.stream are loops over its steps. */
#include "python/py_core.h"

#include <string.h>

typedef struct {
    PyObject_HEAD sd_sequence *seq; /* NULL once closed */
    sd_py_Model *model;
    sd_py_Drafter *drafter; /* or NULL; both kept alive while the sequence lives */
    int stepping;           /* a step runs (the GIL released): another thread may not step */
    int logprobs, top;      /* the call's logprobs and top_logprobs */
} sd_py_Sequence;

/* Frees the sequence and gives its slot back (once). */
static void close_seq(sd_py_Sequence *self) {
    if (self->seq != NULL) {
        sd_sequence_free(self->seq);
        self->seq = NULL;
        sd_py_sequence_release(self->model);
    }
}

static void sequence_dealloc(sd_py_Sequence *self) {
    close_seq(self);
    Py_XDECREF(self->model);
    Py_XDECREF(self->drafter);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The draft model a drafter steps with (NULL for drafters without one). */
static sd_py_Model *draft_of(const sd_py_Sequence *self) {
    return self->drafter != NULL ? self->drafter->model : NULL;
}

/* sequence(prompt, *, max_new_tokens=16, temperature=0.0, seed=0, stop_ids=None,
 *          stop_strings=None, top_k=0, top_p=1.0, min_p=0.0, drafter=None, check_cache=False)
 *   -> Sequence: the arguments of generate, checked now; nothing is computed until step(). */
PyObject *sd_py_model_sequence(sd_py_Model *self, PyObject *args, PyObject *kwds) {
    sd_py_call c;
    sd_py_Sequence *obj = NULL;
    if (sd_py_call_parse(&c, args, kwds, 0) < 0) {
        goto done;
    }
    sd_py_Model *draft = c.drafter != NULL ? c.drafter->model : NULL;
    /* a slot: the caller's (reserved: it keeps it when this fails), or one waited for */
    const int own_slot = !c.reserved;
    if (own_slot && sd_py_sequence_admit(self) < 0) {
        goto done;
    }
    if (sd_py_step_enter(self, draft) < 0) {
        if (own_slot) {
            sd_py_sequence_release(self);
        }
        goto done;
    }
    sd_sequence *seq = NULL;
    sd_status st;
    Py_BEGIN_ALLOW_THREADS st =
        sd_sequence_create(&seq, self->model, c.drafter != NULL ? c.drafter->drafter : NULL,
                           c.prompt, (int)c.n_prompt, &c.p);
    Py_END_ALLOW_THREADS sd_py_step_leave(self, draft);
    if (st != SD_OK) {
        if (own_slot) {
            sd_py_sequence_release(self);
        }
        sd_py_raise(st);
        goto done;
    }
    obj = PyObject_New(sd_py_Sequence, &sd_py_SequenceType);
    if (obj == NULL) {
        sd_sequence_free(seq);
        if (own_slot) {
            sd_py_sequence_release(self);
        }
        goto done;
    }
    obj->seq = seq;
    obj->stepping = 0;
    obj->logprobs = c.p.logprobs;
    obj->top = c.p.top_logprobs;
    Py_INCREF(self);
    obj->model = self;
    Py_XINCREF(c.drafter);
    obj->drafter = c.drafter;
done:
    sd_py_call_free(&c);
    return (PyObject *)obj;
}

/* The sequence, or NULL with an exception when it was closed or another thread steps it. */
static sd_sequence *usable(sd_py_Sequence *self) {
    if (self->seq == NULL) {
        PyErr_SetString(PyExc_ValueError, "the sequence is closed");
        return NULL;
    }
    if (self->stepping) {
        PyErr_SetString(PyExc_RuntimeError, "the sequence is being stepped in another thread");
        return NULL;
    }
    return self->seq;
}

static PyObject *sequence_step(sd_py_Sequence *self, PyObject *unused) {
    (void)unused;
    sd_sequence *seq = usable(self);
    if (seq == NULL) {
        return NULL;
    }
    self->stepping = 1; /* before the wait: no other thread steps or closes it meanwhile */
    if (sd_py_step_enter(self->model, draft_of(self)) < 0) {
        self->stepping = 0;
        return NULL;
    }
    int n_new = 0;
    sd_status st;
    Py_BEGIN_ALLOW_THREADS st = sd_sequence_step(seq, &n_new);
    Py_END_ALLOW_THREADS self->stepping = 0;
    sd_py_step_leave(self->model, draft_of(self));
    if (st != SD_OK) {
        return sd_py_raise(st);
    }
    int n = 0;
    const int32_t *toks = sd_sequence_tokens(seq, &n);
    return sd_py_token_list(toks + n - n_new, n_new);
}

/* logprobs(start=0) -> (list[float], list[list[tuple[int, float]]] | None) | None */
static PyObject *sequence_logprobs(sd_py_Sequence *self, PyObject *args) {
    int start = 0;
    if (!PyArg_ParseTuple(args, "|i:logprobs", &start) || usable(self) == NULL) {
        return NULL;
    }
    int n = 0;
    const int32_t *ids = NULL;
    const float *tops = NULL;
    const float *lp = sd_sequence_logprobs(self->seq, &n, &ids, &tops);
    if (!self->logprobs) {
        Py_RETURN_NONE; /* not asked for */
    }
    if (start < 0 || start > n) {
        return PyErr_Format(PyExc_ValueError, "start must be in [0, %d], got %d", n, start);
    }
    const int k = self->top; /* lp, ids and tops hold n rows (none when n is 0) */
    PyObject *lps = PyList_New(n - start), *top = k > 0 ? PyList_New(n - start) : NULL;
    if (lps == NULL || (k > 0 && top == NULL)) {
        goto fail;
    }
    for (int i = start; i < n; i++) {
        PyObject *v = PyFloat_FromDouble(lp[i]);
        if (v == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(lps, i - start, v);
        if (top == NULL) {
            continue;
        }
        PyObject *row = PyList_New(k);
        if (row == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(top, i - start, row);
        for (int j = 0; j < k; j++) {
            PyObject *pair = Py_BuildValue("(if)", ids[(size_t)i * k + j], tops[(size_t)i * k + j]);
            if (pair == NULL) {
                goto fail;
            }
            PyList_SET_ITEM(row, j, pair);
        }
    }
    PyObject *r = Py_BuildValue("(OO)", lps, top != NULL ? top : Py_None);
    Py_DECREF(lps);
    Py_XDECREF(top);
    return r;
fail:
    Py_XDECREF(lps);
    Py_XDECREF(top);
    return NULL;
}

static PyObject *sequence_close(sd_py_Sequence *self, PyObject *unused) {
    (void)unused;
    if (self->seq != NULL && usable(self) == NULL) {
        return NULL;
    }
    close_seq(self);
    Py_RETURN_NONE;
}

static PyObject *sequence_done(sd_py_Sequence *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(self->seq == NULL || sd_sequence_done(self->seq));
}

static PyObject *sequence_finish_reason(sd_py_Sequence *self, void *closure) {
    (void)closure;
    if (usable(self) == NULL) {
        return NULL;
    }
    if (!sd_sequence_done(self->seq)) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(sd_py_finish_name(sd_sequence_finish_reason(self->seq)));
}

static PyObject *sequence_tokens(sd_py_Sequence *self, void *closure) {
    (void)closure;
    if (usable(self) == NULL) {
        return NULL;
    }
    int n = 0;
    const int32_t *toks = sd_sequence_tokens(self->seq, &n);
    return sd_py_token_list(toks, n);
}

static PyObject *sequence_reused(sd_py_Sequence *self, void *closure) {
    (void)closure;
    if (usable(self) == NULL) {
        return NULL;
    }
    return PyLong_FromLong(sd_sequence_reused(self->seq));
}

static PyObject *sequence_stats(sd_py_Sequence *self, void *closure) {
    (void)closure;
    if (usable(self) == NULL) {
        return NULL;
    }
    const sd_spec_stats *ss = sd_sequence_stats(self->seq);
    if (ss == NULL) {
        Py_RETURN_NONE;
    }
    return sd_py_stats_dict(ss, sd_drafter_max_draft(self->drafter->drafter));
}

static PyMethodDef sequence_methods[] = {
    {"step", (PyCFunction)sequence_step, METH_NOARGS,
     "step() -> list[int]: one step (a part of the prompt, one plain token, or one speculative "
     "step) and the tokens it appended; an error once the sequence is done."},
    {"logprobs", (PyCFunction)sequence_logprobs, METH_VARARGS,
     "logprobs(start=0) -> (list[float], list[list[tuple[int, float]]] | None) | None: the "
     "log-probabilities of output tokens start.. (and of the top_logprobs best tokens at each), "
     "None when the sequence was created without logprobs."},
    {"close", (PyCFunction)sequence_close, METH_NOARGS,
     "close(): free the caches now (the sequence is unusable after)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef sequence_getset[] = {
    {"done", (getter)sequence_done, NULL, "True once generation has ended (or it was closed)",
     NULL},
    {"finish_reason", (getter)sequence_finish_reason, NULL,
     "'length', 'stop_token', 'stop_string' or 'cancelled' once done, else None", NULL},
    {"tokens", (getter)sequence_tokens, NULL, "the output so far", NULL},
    {"reused", (getter)sequence_reused, NULL,
     "prompt tokens taken from a finished request's cache (prefix reuse)", NULL},
    {"stats", (getter)sequence_stats, NULL, "a speculative sequence's statistics, else None", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject sd_py_SequenceType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "specdec._core.Sequence",
    .tp_basicsize = sizeof(sd_py_Sequence),
    .tp_dealloc = (destructor)sequence_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One request decoded a step at a time. Create with Model.sequence(prompt, ...).",
    .tp_methods = sequence_methods,
    .tp_getset = sequence_getset,
};
