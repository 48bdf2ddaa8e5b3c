/* module.c — the module specdec._core: loading models (from files or with random weights), build
 * information, and the module's creation, which adds the functions of hooks.c and drafters.c
 * and the Model, KVCache and Drafter types. */
#define SD_PY_MODULE_C /* imports NumPy's C API for every file of the boundary */
#include "python/py_core.h"

#include <limits.h>
#include <string.h>

#include "util/threadpool.h"

/* The thread count of a load: None for the cores this process may use (the core's 0), else an
 * int the core's one check accepts. */
static int threads_arg(PyObject *obj, int *out) {
    *out = 0;
    if (obj == Py_None) {
        return 0;
    }
    const long n = PyLong_AsLong(obj);
    if (n == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = n > INT_MAX ? INT_MAX : n < INT_MIN ? INT_MIN : (int)n;
    const sd_status st = sd_threadpool_check(*out);
    if (st != SD_OK) {
        sd_py_raise(st);
        return -1;
    }
    return 0;
}

static sd_model_params model_params(int threads, int device, int gpu) {
    sd_model_params p = sd_model_default_params();
    p.n_threads = threads;
    p.device = device;
    p.gpu = gpu;
    return p;
}

/* load(path, threads=None, device=0, gpu=0, context_length=0) -> Model */
static PyObject *core_load(PyObject *mod, PyObject *args, PyObject *kwds) {
    (void)mod;
    static char *kwlist[] = {"path", "threads", "device", "gpu", "context_length", NULL};
    PyObject *path_obj = NULL;
    PyObject *threads_obj = Py_None;
    int threads = 0, device = SD_DEVICE_CPU, gpu = 0, context_length = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&|Oiii:load", kwlist, PyUnicode_FSConverter,
                                     &path_obj, &threads_obj, &device, &gpu, &context_length)) {
        return NULL;
    }
    if (threads_arg(threads_obj, &threads) < 0) {
        Py_DECREF(path_obj);
        return NULL;
    }
    sd_model_params p = model_params(threads, device, gpu);
    p.context_length = context_length;
    sd_model *m = NULL;
    sd_status st;
    const char *path = PyBytes_AS_STRING(path_obj);
    Py_BEGIN_ALLOW_THREADS st = sd_model_load(&m, path, &p);
    Py_END_ALLOW_THREADS Py_DECREF(path_obj);
    if (st != SD_OK) {
        return sd_py_raise(st);
    }
    return sd_py_model_wrap(m);
}

/* An int field of a config dict (required). */
static int dict_int(PyObject *d, const char *key, int *out) {
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    if (v == NULL || !PyLong_Check(v) || PyBool_Check(v)) {
        PyErr_Format(PyExc_ValueError, "the shape needs an integer '%s'", key);
        return -1;
    }
    const long x = PyLong_AsLong(v);
    if (x == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (x <= 0 || x > (1L << 30)) {
        PyErr_Format(PyExc_ValueError, "'%s' must be a positive integer, got %ld", key, x);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* dummy(shape: dict, weight_type, seed, threads=None, device=0, gpu=0) -> Model with random
 * weights (sd_model_create_dummy); shape: arch ("llama" | "qwen2"), vocab_size, hidden_size,
 * n_layers, n_heads, n_kv_heads, head_dim, ffn_size, context_length (ints), rope_theta,
 * rms_eps (floats), tied_embeddings (bool). */
static PyObject *core_dummy(PyObject *mod, PyObject *args, PyObject *kwds) {
    (void)mod;
    static char *kwlist[] = {"shape", "weight_type", "seed", "threads", "device", "gpu", NULL};
    PyObject *shape = NULL;
    PyObject *threads_obj = Py_None;
    int weight_type = 0, threads = 0, device = SD_DEVICE_CPU, gpu = 0;
    unsigned long long seed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!iK|Oii:dummy", kwlist, &PyDict_Type, &shape,
                                     &weight_type, &seed, &threads_obj, &device, &gpu)) {
        return NULL;
    }
    if (threads_arg(threads_obj, &threads) < 0) {
        return NULL;
    }
    sd_config c;
    memset(&c, 0, sizeof(c));
    PyObject *arch = PyDict_GetItemString(shape, "arch");
    const char *an = arch != NULL && PyUnicode_Check(arch) ? PyUnicode_AsUTF8(arch) : NULL;
    if (an == NULL || (strcmp(an, "llama") != 0 && strcmp(an, "qwen2") != 0)) {
        PyErr_SetString(PyExc_ValueError, "the shape's 'arch' must be 'llama' or 'qwen2'");
        return NULL;
    }
    c.arch = strcmp(an, "qwen2") == 0 ? SD_ARCH_QWEN2 : SD_ARCH_LLAMA;
    if (dict_int(shape, "vocab_size", &c.vocab_size) < 0 ||
        dict_int(shape, "hidden_size", &c.hidden_size) < 0 ||
        dict_int(shape, "n_layers", &c.n_layers) < 0 ||
        dict_int(shape, "n_heads", &c.n_heads) < 0 ||
        dict_int(shape, "n_kv_heads", &c.n_kv_heads) < 0 ||
        dict_int(shape, "head_dim", &c.head_dim) < 0 ||
        dict_int(shape, "ffn_size", &c.ffn_size) < 0 ||
        dict_int(shape, "context_length", &c.context_length) < 0) {
        return NULL;
    }
    PyObject *theta = PyDict_GetItemString(shape, "rope_theta");
    PyObject *eps = PyDict_GetItemString(shape, "rms_eps");
    PyObject *tied = PyDict_GetItemString(shape, "tied_embeddings");
    c.rope_theta = theta != NULL ? (float)PyFloat_AsDouble(theta) : 10000.0f;
    c.rms_eps = eps != NULL ? (float)PyFloat_AsDouble(eps) : 1e-5f;
    c.tied_embeddings = tied != NULL ? PyObject_IsTrue(tied) : 0;
    if (PyErr_Occurred()) {
        return NULL;
    }
    const sd_model_params p = model_params(threads, device, gpu);
    sd_model *m = NULL;
    sd_status st;
    Py_BEGIN_ALLOW_THREADS st = sd_model_create_dummy(&m, &c, weight_type, (uint64_t)seed, &p);
    Py_END_ALLOW_THREADS if (st != SD_OK) {
        return sd_py_raise(st);
    }
    return sd_py_model_wrap(m);
}

static PyObject *core_simd_name(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
    return PyUnicode_FromString(sd_simd_name());
}

static PyObject *core_built_with_cuda(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
    return PyBool_FromLong(sd_built_with_cuda());
}

static PyObject *core_max_draft(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
    return PyLong_FromLong(SD_MAX_DRAFT);
}

static PyObject *core_cuda_probe(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
#ifdef SD_WITH_CUDA
    int cublas = 0;
    int n = sd_cuda_probe(&cublas);
    return Py_BuildValue("{s:i,s:i}", "devices", n, "cublas_version", cublas);
#else
    Py_RETURN_NONE;
#endif
}

PyMethodDef sd_py_module_methods[] = {
    {"load", (PyCFunction)(void (*)(void))core_load, METH_VARARGS | METH_KEYWORDS,
     "load(path, threads=None, device=0, gpu=0) -> Model"},
    {"dummy", (PyCFunction)(void (*)(void))core_dummy, METH_VARARGS | METH_KEYWORDS,
     "dummy(shape, weight_type, seed, threads=None, device=0, gpu=0) -> Model with random "
     "weights"},
    {"simd_name", core_simd_name, METH_NOARGS, "SIMD level of the CPU kernels"},
    {"built_with_cuda", core_built_with_cuda, METH_NOARGS,
     "whether the CUDA sources were compiled into this build"},
    {"cuda_probe", core_cuda_probe, METH_NOARGS,
     "CUDA builds: {'devices': n, 'cublas_version': v}; CPU-only builds: None"},
    {"max_draft", core_max_draft, METH_NOARGS,
     "the most draft tokens a speculative step may carry (SD_MAX_DRAFT)"},
    {NULL, NULL, 0, NULL},
};

static int core_exec(PyObject *m) {
    import_array1(-1);
    if (PyModule_AddFunctions(m, sd_py_hook_methods) < 0 ||
        PyModule_AddFunctions(m, sd_py_drafter_methods) < 0 ||
        PyModule_AddFunctions(m, sd_py_format_methods) < 0) {
        return -1;
    }
    if (PyType_Ready(&sd_py_DrafterType) < 0) {
        return -1;
    }
    Py_INCREF(&sd_py_DrafterType);
    if (PyModule_AddObject(m, "Drafter", (PyObject *)&sd_py_DrafterType) < 0) {
        Py_DECREF(&sd_py_DrafterType);
        return -1;
    }
    if (PyType_Ready(&sd_py_ModelType) < 0 || PyType_Ready(&sd_py_CacheType) < 0 ||
        PyType_Ready(&sd_py_SequenceType) < 0) {
        return -1;
    }
    Py_INCREF(&sd_py_ModelType);
    if (PyModule_AddObject(m, "Model", (PyObject *)&sd_py_ModelType) < 0) {
        Py_DECREF(&sd_py_ModelType);
        return -1;
    }
    Py_INCREF(&sd_py_CacheType);
    if (PyModule_AddObject(m, "KVCache", (PyObject *)&sd_py_CacheType) < 0) {
        Py_DECREF(&sd_py_CacheType);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot core_slots[] = {
    {Py_mod_exec, (void *)core_exec},
    {0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "specdec._core",
    .m_doc = "specdec's C core: model loading, forward passes and decoding.",
    .m_size = 0,
    .m_methods = sd_py_module_methods,
    .m_slots = core_slots,
};

PyMODINIT_FUNC PyInit__core(void) {
    return PyModuleDef_Init(&core_module);
}
