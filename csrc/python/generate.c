/* generate.c — Model.generate: plain or speculative decoding in C with the GIL released, the
 * on_token callback taking the GIL back for each token, and the statistics as a dict. */
#include "python/py_core.h"

#include <string.h>

/* {i: h[i]} for the nonzero entries of h (n), or NULL with an exception. */
static PyObject *counts_dict(const int *h, int n) {
    PyObject *d = PyDict_New();
    for (int i = 0; d != NULL && i < n; i++) {
        if (h[i] == 0) {
            continue;
        }
        PyObject *key = PyLong_FromLong(i), *val = PyLong_FromLong(h[i]);
        if (key == NULL || val == NULL || PyDict_SetItem(d, key, val) < 0) {
            Py_CLEAR(d);
        }
        Py_XDECREF(key);
        Py_XDECREF(val);
    }
    return d;
}

PyObject *sd_py_stats_dict(const sd_spec_stats *st, int k) {
    k = k < SD_MAX_DRAFT ? k : SD_MAX_DRAFT; /* the per-depth counts stop there (a tree drafter's
                                              * k is its node count, which may be more) */
    PyObject *drafted = PyList_New(k), *accepted = PyList_New(k);
    for (int i = 0; drafted != NULL && accepted != NULL && i < k; i++) {
        PyList_SET_ITEM(drafted, i, PyLong_FromLong(st->drafted_at[i]));
        PyList_SET_ITEM(accepted, i, PyLong_FromLong(st->accepted_at[i]));
    }
    PyObject *by_nodes = counts_dict(st->steps_by_nodes, SD_MAX_TREE_NODES + 1);
    PyObject *by_accepted = counts_dict(st->steps_by_accepted, SD_MAX_TREE_NODES + 1);
    if (drafted == NULL || accepted == NULL || by_nodes == NULL || by_accepted == NULL) {
        Py_XDECREF(drafted);
        Py_XDECREF(accepted);
        Py_XDECREF(by_nodes);
        Py_XDECREF(by_accepted);
        return NULL;
    }
    return Py_BuildValue("{s:i,s:i,s:i,s:N,s:N,s:N,s:N,s:d,s:d,s:d}", "steps", st->steps, "drafted",
                         st->drafted, "accepted", st->accepted, "drafted_at", drafted,
                         "accepted_at", accepted, "steps_by_nodes", by_nodes, "steps_by_accepted",
                         by_accepted, "time_draft_s", st->time_draft_s, "time_verify_s",
                         st->time_verify_s, "time_total_s", st->time_total_s);
}

/* on_token from C: calls the Python callable with the GIL; a true result cancels, an exception
 * cancels and is kept to be raised once the loop has returned. */
typedef struct {
    PyObject *fn;
    PyObject *type, *value, *tb; /* a pending exception */
} token_callback;

static int call_on_token(void *user, int32_t token) {
    token_callback *cb = user;
    PyGILState_STATE g = PyGILState_Ensure();
    int stop = 1;
    PyObject *r = PyObject_CallFunction(cb->fn, "i", (int)token);
    if (r != NULL) {
        stop = PyObject_IsTrue(r);
        Py_DECREF(r);
    }
    if (stop < 0 || r == NULL) {
        PyErr_Fetch(&cb->type, &cb->value, &cb->tb);
        stop = 1;
    }
    PyGILState_Release(g);
    return stop;
}

void sd_py_call_free(sd_py_call *c) {
    PyMem_Free(c->prompt);
    PyMem_Free(c->stops);
    PyMem_Free(c->bias_ids);
    PyMem_Free(c->bias_values);
    sd_py_bytes_list_free(&c->strings);
}

int sd_py_call_parse(sd_py_call *c, PyObject *args, PyObject *kwds, int with_on_token) {
    /* Model.sequence takes the same keywords but on_token (the list ends one entry earlier) */
    static char *kwlist[] = {"prompt",       "max_new_tokens", "temperature", "seed",  "stop_ids",
                             "stop_strings", "top_k",          "top_p",       "min_p", "drafter",
                             "check_cache",  "on_token",       NULL};
    static char *kwlist_seq[] = {"prompt",
                                 "max_new_tokens",
                                 "temperature",
                                 "seed",
                                 "stop_ids",
                                 "stop_strings",
                                 "top_k",
                                 "top_p",
                                 "min_p",
                                 "drafter",
                                 "check_cache",
                                 "reserved",
                                 "logprobs",
                                 "top_logprobs",
                                 "logit_bias_ids",
                                 "logit_bias_values",
                                 "repetition_penalty",
                                 "frequency_penalty",
                                 "presence_penalty",
                                 "min_tokens",
                                 NULL};
    PyObject *prompt_obj = NULL, *stop_obj = Py_None, *strings_obj = Py_None;
    PyObject *drafter_obj = Py_None, *bias_ids_obj = Py_None, *bias_values_obj = Py_None;
    unsigned long long seed = 0;
    memset(c, 0, sizeof(*c));
    c->p = sd_generate_default_params();
    c->on_token = Py_None;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwds,
            with_on_token ? "O|$ifKOOiffOpO:generate" : "O|$ifKOOiffOpppiOOfffi:sequence",
            with_on_token ? kwlist : kwlist_seq, &prompt_obj, &c->p.max_new_tokens,
            &c->p.temperature, &seed, &stop_obj, &strings_obj, &c->p.top_k, &c->p.top_p,
            &c->p.min_p, &drafter_obj, &c->p.check_cache,
            with_on_token ? (void *)&c->on_token : (void *)&c->reserved, &c->p.logprobs,
            &c->p.top_logprobs, &bias_ids_obj, &bias_values_obj, &c->p.repetition_penalty,
            &c->p.frequency_penalty, &c->p.presence_penalty, &c->p.min_tokens)) {
        return -1;
    }
    c->p.seed = (uint64_t)seed;
    if (drafter_obj != Py_None && !PyObject_TypeCheck(drafter_obj, &sd_py_DrafterType)) {
        PyErr_Format(PyExc_TypeError, "drafter must be a specdec._core.Drafter or None, got %s",
                     Py_TYPE(drafter_obj)->tp_name);
        return -1;
    }
    c->drafter = drafter_obj != Py_None ? (sd_py_Drafter *)drafter_obj : NULL;
    if (c->on_token != Py_None && !PyCallable_Check(c->on_token)) {
        PyErr_SetString(PyExc_TypeError, "on_token must be callable or None");
        return -1;
    }
    Py_ssize_t n_stops = 0;
    if ((c->prompt = sd_py_tokens_from(prompt_obj, "prompt", &c->n_prompt)) == NULL) {
        return -1;
    }
    if (stop_obj != Py_None &&
        (c->stops = sd_py_tokens_from(stop_obj, "stop_ids", &n_stops)) == NULL) {
        return -1;
    }
    if (strings_obj != Py_None &&
        sd_py_bytes_list_from(&c->strings, strings_obj, "stop_strings") < 0) {
        return -1;
    }
    if (c->n_prompt > INT32_MAX || n_stops > INT32_MAX || c->strings.n > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "sequence too long");
        return -1;
    }
    if ((bias_ids_obj == Py_None) != (bias_values_obj == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "logit_bias_ids and logit_bias_values go together");
        return -1;
    }
    if (bias_ids_obj != Py_None) {
        Py_ssize_t n_ids = 0;
        if ((c->bias_ids = sd_py_tokens_from(bias_ids_obj, "logit_bias_ids", &n_ids)) == NULL ||
            (c->bias_values =
                 sd_py_floats_from(bias_values_obj, "logit_bias_values", &c->n_bias)) == NULL) {
            return -1;
        }
        if (n_ids != c->n_bias || n_ids > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError,
                            "logit_bias_ids and logit_bias_values must have the same length");
            return -1;
        }
        c->p.bias_ids = c->bias_ids;
        c->p.bias_values = c->bias_values;
        c->p.n_bias = (int)n_ids;
    }
    c->p.stop_ids = c->stops;
    c->p.n_stop_ids = (int)n_stops;
    c->p.stop_strings = c->strings.ptrs;
    c->p.stop_lens = c->strings.lens;
    c->p.n_stop_strings = (int)c->strings.n;
    return 0;
}

const char *sd_py_finish_name(sd_finish_reason reason) {
    static const char *names[] = {"length", "stop_token", "stop_string", "cancelled"};
    return names[reason];
}

/* generate(prompt, *, max_new_tokens=16, temperature=0.0, seed=0, stop_ids=None,
 *          stop_strings=None, top_k=0, top_p=1.0, min_p=0.0, drafter=None, check_cache=False,
 *          on_token=None)
 *   -> (list[int], finish reason: "length" | "stop_token" | "stop_string" | "cancelled",
 *       stats dict or None)
 * The whole loop in C with the GIL released (sd_generate, sd_generate_speculative). drafter: a
 * Drafter (drafters.c) for speculative decoding, None for plain decoding; on_token:
 * callable(token) -> bool or None, called with the GIL from inside the loop; check_cache: a test
 * hook (sd_generate_params.check_cache). Every range is checked by the core, which names the
 * parameter. specdec.generate steps a Sequence instead (sequence_type.c). */
PyObject *sd_py_model_generate(sd_py_Model *self, PyObject *args, PyObject *kwds) {
    sd_py_call c;
    if (sd_py_call_parse(&c, args, kwds, 1) < 0) {
        sd_py_call_free(&c);
        return NULL;
    }
    sd_py_Drafter *drafter = c.drafter;
    sd_py_Model *draft = drafter != NULL ? drafter->model : NULL;
    int32_t *out = NULL;
    PyObject *result = NULL, *list = NULL, *stats = NULL;
    out = PyMem_Malloc((size_t)(c.p.max_new_tokens > 0 ? c.p.max_new_tokens : 1) * sizeof(int32_t));
    if (out == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* the draft may be the target itself (its own cache, the steps taking turns) */
    if (sd_py_models_enter(self, draft) < 0) {
        goto done;
    }
    Py_XINCREF(drafter); /* held while the GIL is released */
    token_callback cb = {c.on_token, NULL, NULL, NULL};
    if (c.on_token != Py_None) {
        c.p.on_token = call_on_token;
        c.p.on_token_user = &cb;
    }
    int n_out = 0;
    sd_finish_reason reason = SD_FINISH_LENGTH;
    sd_spec_stats ss;
    memset(&ss, 0, sizeof(ss));
    sd_status st;
    Py_BEGIN_ALLOW_THREADS if (drafter != NULL) {
        st = sd_generate_speculative(out, &n_out, &reason, &ss, self->model, drafter->drafter,
                                     c.prompt, (int)c.n_prompt, &c.p);
    }
    else {
        st = sd_generate(out, &n_out, &reason, self->model, c.prompt, (int)c.n_prompt, &c.p);
    }
    Py_END_ALLOW_THREADS sd_py_models_leave(self, draft);
    if (cb.type != NULL) { /* the callback raised: that exception is the result */
        PyErr_Restore(cb.type, cb.value, cb.tb);
        Py_XDECREF(drafter);
        goto done;
    }
    if (st != SD_OK) {
        sd_py_raise(st);
        Py_XDECREF(drafter);
        goto done;
    }
    list = sd_py_token_list(out, n_out);
    if (drafter != NULL) {
        stats = sd_py_stats_dict(&ss, sd_drafter_max_draft(drafter->drafter));
    } else {
        stats = Py_None;
        Py_INCREF(stats);
    }
    Py_XDECREF(drafter);
    if (list != NULL && stats != NULL) {
        result = Py_BuildValue("(OsO)", list, sd_py_finish_name(reason), stats);
    }
done:
    Py_XDECREF(list);
    Py_XDECREF(stats);
    PyMem_Free(out);
    sd_py_call_free(&c);
    return result;
}
