/* torch_bin.c — PyTorch checkpoints without torch: the archive (format/zip.h), a pickle machine
 * that knows only what torch.save writes for a state dict and refuses everything else, and the
 * tensors as checked views into their storages. */
#include "format/torch_bin.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/types.h"
#include "format/zip.h"
#include "util/status.h"

/* ---- the pickle machine ----
 * What torch.save writes for the state dict {"w": tensor} (protocol 2; each memo put, BINPUT,
 * after a global, string, non-empty tuple or dict left out, and a repeated one fetched by
 * BINGET):
 *   PROTO 2  GLOBAL 'collections OrderedDict'  EMPTY_TUPLE  REDUCE       the state dict
 *   BINUNICODE 'w'                                                      (MARK ... SETITEMS
 *   GLOBAL 'torch._utils _rebuild_tensor_v2'                             for several)
 *   MARK  MARK 'storage' GLOBAL 'torch FloatStorage' '0' 'cpu' BININT numel TUPLE  BINPERSID
 *         BININT offset  (BININT size ...) TUPLEn  (BININT stride ...) TUPLEn  NEWFALSE
 *         GLOBAL 'collections OrderedDict' EMPTY_TUPLE REDUCE  TUPLE  REDUCE      the tensor
 *   SETITEM
 *   EMPTY_DICT '_metadata' OrderedDict() ('' {'version': 1}) ... SETITEM  BUILD  STOP
 * Values live on a stack of pointers (MARKs as stack heights beside it) and in the memo; the
 * machine never recurses, so a cyclic or deeply nested pickle costs nothing but its length. */

typedef struct {
    const char *storage;   /* the class torch names in a persistent id */
    const char *type_name; /* safetensors' name of the dtype */
    int type;              /* sd_type, or -1: geometry only */
    int elem_size;
} torch_dtype;

static const torch_dtype g_dtypes[] = {
    {"FloatStorage", "F32", SD_TYPE_F32, 4},
    {"HalfStorage", "F16", SD_TYPE_F16, 2},
    {"BFloat16Storage", "BF16", SD_TYPE_BF16, 2},
    {"DoubleStorage", "F64", -1, 8},
    {"LongStorage", "I64", -1, 8},
    {"IntStorage", "I32", -1, 4},
    {"ShortStorage", "I16", -1, 2},
    {"CharStorage", "I8", -1, 1},
    {"ByteStorage", "U8", -1, 1},
    {"BoolStorage", "BOOL", -1, 1},
};

typedef enum {
    V_NONE,
    V_BOOL,
    V_INT,
    V_FLOAT,
    V_STR,
    V_TUPLE,
    V_LIST,
    V_DICT,
    V_GLOBAL,
    V_STORAGE,
    V_TENSOR
} vkind;
static const char *const g_kind_names[] = {"None", "bool", "int",    "float",   "str",   "tuple",
                                           "list", "dict", "global", "storage", "tensor"};

/* The callables a checkpoint may name (V_GLOBAL's `which`). */
enum { G_ORDERED_DICT, G_REBUILD_TENSOR, G_REBUILD_PARAMETER, G_STORAGE };

typedef struct val val;
struct val {
    vkind kind;
    int ordered;                  /* V_DICT: an OrderedDict */
    int which;                    /* V_GLOBAL: G_* */
    int64_t i;                    /* V_BOOL, V_INT; V_STORAGE: numel; V_TENSOR: storage offset */
    const char *s;                /* V_STR: (len) bytes of the pickle, not NUL-terminated */
    size_t len;                   /* V_STR */
    val **items;                  /* V_TUPLE, V_LIST: (n); V_DICT: key, value, key, value ... (n) */
    size_t n, cap;                /* items used, allocated */
    const torch_dtype *dt;        /* V_GLOBAL of a storage class, V_STORAGE */
    const sd_zip_entry *entry;    /* V_STORAGE: its bytes */
    val *storage, *size, *stride; /* V_TENSOR */
};

typedef struct {
    const unsigned char *p; /* the pickle, (n) bytes */
    size_t n, pos, op_pos;
    val **stack;
    size_t sp, stack_cap;
    size_t *marks; /* stack heights at each MARK */
    size_t n_marks, marks_cap;
    val **memo;
    size_t memo_cap, memo_count;
    val **all; /* every value made, freed together */
    size_t n_all, all_cap;
    const sd_zip *zip;
    const char *prefix; /* "<archive>/", (prefix_len) bytes */
    size_t prefix_len;
} vm;

/* Grow *arr (of elements of `size` bytes, capacity *cap) to hold `need`. */
static int grow(void *arr, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) {
        return 0;
    }
    size_t c = *cap < 16 ? 16 : *cap * 2;
    while (c < need) {
        c *= 2;
    }
    void *p = realloc(*(void **)arr, c * size);
    if (p == NULL) {
        return -1;
    }
    *(void **)arr = p;
    *cap = c;
    return 0;
}

static sd_status nomem(void) {
    return sd_set_error(SD_ERR_NOMEM, "out of memory reading a pickle");
}

static sd_status bad(const vm *v, const char *what) {
    return sd_set_error(SD_ERR_FORMAT, "malformed pickle at byte %zu: %s", v->op_pos, what);
}

static sd_status push(vm *v, val *x) {
    if (grow(&v->stack, &v->stack_cap, v->sp + 1, sizeof(*v->stack)) != 0) {
        return nomem();
    }
    v->stack[v->sp++] = x;
    return SD_OK;
}

/* A new value of kind k, pushed. */
static sd_status make(vm *v, vkind k, val **out) {
    val *x = calloc(1, sizeof(*x));
    if (x == NULL || grow(&v->all, &v->all_cap, v->n_all + 1, sizeof(*v->all)) != 0) {
        free(x);
        return nomem();
    }
    v->all[v->n_all++] = x;
    x->kind = k;
    *out = x;
    return push(v, x);
}

static size_t floor_sp(const vm *v) {
    return v->n_marks > 0 ? v->marks[v->n_marks - 1] : 0;
}

static sd_status pop(vm *v, val **out) {
    if (v->sp <= floor_sp(v)) {
        return bad(v, "the stack is empty");
    }
    *out = v->stack[--v->sp];
    return SD_OK;
}

static sd_status top(vm *v, val **out) {
    if (v->sp <= floor_sp(v)) {
        return bad(v, "the stack is empty");
    }
    *out = v->stack[v->sp - 1];
    return SD_OK;
}

/* Pop to the last MARK: its items are stack[*base, v->sp) until the next push. */
static sd_status pop_mark(vm *v, size_t *base) {
    if (v->n_marks == 0) {
        return bad(v, "no MARK to pop to");
    }
    *base = v->marks[--v->n_marks];
    return SD_OK;
}

static sd_status need(const vm *v, size_t k, const unsigned char **out) {
    if (v->n - v->pos < k) {
        return sd_set_error(SD_ERR_FORMAT, "the pickle is truncated at byte %zu", v->op_pos);
    }
    *out = v->p + v->pos;
    return SD_OK;
}

static int str_is(const val *x, const char *s) {
    return x->kind == V_STR && x->len == strlen(s) && memcmp(x->s, s, x->len) == 0;
}

/* The allowed globals; every other is refused, naming it. */
static sd_status make_global(vm *v, const char *mod, size_t ml, const char *name, size_t nl) {
    int which = -1;
    const torch_dtype *dt = NULL;
    if (ml == 11 && memcmp(mod, "collections", 11) == 0 && nl == 11 &&
        memcmp(name, "OrderedDict", 11) == 0) {
        which = G_ORDERED_DICT;
    } else if (ml == 12 && memcmp(mod, "torch._utils", 12) == 0) {
        if (nl == 18 && memcmp(name, "_rebuild_tensor_v2", 18) == 0) {
            which = G_REBUILD_TENSOR;
        } else if (nl == 18 && memcmp(name, "_rebuild_parameter", 18) == 0) {
            which = G_REBUILD_PARAMETER;
        }
    } else if (ml == 5 && memcmp(mod, "torch", 5) == 0) {
        for (size_t i = 0; i < sizeof(g_dtypes) / sizeof(g_dtypes[0]); i++) {
            if (nl == strlen(g_dtypes[i].storage) && memcmp(name, g_dtypes[i].storage, nl) == 0) {
                which = G_STORAGE;
                dt = &g_dtypes[i];
            }
        }
    }
    if (which < 0) {
        char a[96], b[96];
        return sd_set_error(
            SD_ERR_FORMAT, "refused: the pickle calls %s.%s; a checkpoint may hold only tensors",
            sd_zip_show(a, sizeof(a), mod, ml), sd_zip_show(b, sizeof(b), name, nl));
    }
    val *g = NULL;
    SD_TRY(make(v, V_GLOBAL, &g));
    g->which = which;
    g->dt = dt;
    return SD_OK;
}

/* BINPERSID: ('storage', torch.<T>Storage, key, location, numel) -> the entry data/<key>. */
static sd_status persistent_load(vm *v, const val *pid) {
    if (pid->kind != V_TUPLE || pid->n != 5 || !str_is(pid->items[0], "storage") ||
        pid->items[1]->kind != V_GLOBAL || pid->items[1]->which != G_STORAGE ||
        pid->items[2]->kind != V_STR || pid->items[3]->kind != V_STR ||
        pid->items[4]->kind != V_INT || pid->items[4]->i < 0) {
        return bad(v, "a persistent id that is not ('storage', torch.<T>Storage, key, "
                      "location, numel)");
    }
    const val *key = pid->items[2];
    const torch_dtype *dt = pid->items[1]->dt;
    char kb[96];
    sd_zip_show(kb, sizeof(kb), key->s, key->len);
    char *name = malloc(v->prefix_len + 5 + key->len + 1);
    if (name == NULL) {
        return nomem();
    }
    memcpy(name, v->prefix, v->prefix_len);
    memcpy(name + v->prefix_len, "data/", 5);
    memcpy(name + v->prefix_len + 5, key->s, key->len);
    const sd_zip_entry *e = sd_zip_find(v->zip, name, v->prefix_len + 5 + key->len);
    free(name);
    if (e == NULL) {
        return sd_set_error(SD_ERR_FORMAT,
                            "the pickle names storage '%s', but the archive has "
                            "no entry data/%s",
                            kb, kb);
    }
    const uint64_t numel = (uint64_t)pid->items[4]->i;
    if (numel > e->size / (uint64_t)dt->elem_size || numel * (uint64_t)dt->elem_size != e->size) {
        return sd_set_error(SD_ERR_FORMAT,
                            "storage '%s' holds %llu bytes, but the pickle says %llu elements "
                            "of %s (%d bytes each)",
                            kb, (unsigned long long)e->size, (unsigned long long)numel,
                            dt->type_name, dt->elem_size);
    }
    val *s = NULL;
    SD_TRY(make(v, V_STORAGE, &s));
    s->dt = dt;
    s->entry = e;
    s->i = (int64_t)numel;
    return SD_OK;
}

static int int_tuple(const val *t) {
    if (t->kind != V_TUPLE) {
        return 0;
    }
    for (size_t i = 0; i < t->n; i++) {
        if (t->items[i]->kind != V_INT) {
            return 0;
        }
    }
    return 1;
}

static int empty_dict_or_none(const val *x) {
    return x->kind == V_NONE || (x->kind == V_DICT && x->n == 0);
}

/* REDUCE: call one of the allowed callables on its argument tuple. */
static sd_status reduce(vm *v, const val *f, const val *args) {
    if (f->kind != V_GLOBAL || args->kind != V_TUPLE) {
        return bad(v, "REDUCE needs a callable and an argument tuple");
    }
    val *r = NULL;
    switch (f->which) {
    case G_ORDERED_DICT:
        if (args->n != 0) {
            return bad(v, "OrderedDict is called with arguments");
        }
        SD_TRY(make(v, V_DICT, &r));
        r->ordered = 1;
        return SD_OK;
    case G_REBUILD_TENSOR: {
        val *const *a = args->items;
        if ((args->n != 6 && args->n != 7) || a[0]->kind != V_STORAGE || a[1]->kind != V_INT ||
            a[1]->i < 0 || !int_tuple(a[2]) || !int_tuple(a[3]) || a[2]->n != a[3]->n ||
            a[4]->kind != V_BOOL || a[5]->kind != V_DICT) {
            return bad(v, "_rebuild_tensor_v2 needs (storage, offset, size, stride, "
                          "requires_grad, backward_hooks[, metadata])");
        }
        if (a[5]->n != 0 || (args->n == 7 && !empty_dict_or_none(a[6]))) {
            return sd_set_error(SD_ERR_UNSUPPORTED,
                                "a tensor with backward hooks or extra metadata is not supported");
        }
        SD_TRY(make(v, V_TENSOR, &r));
        r->storage = a[0];
        r->i = a[1]->i;
        r->size = a[2];
        r->stride = a[3];
        return SD_OK;
    }
    case G_REBUILD_PARAMETER:
        if (args->n != 3 || args->items[0]->kind != V_TENSOR || args->items[1]->kind != V_BOOL ||
            args->items[2]->kind != V_DICT || args->items[2]->n != 0) {
            return bad(v, "_rebuild_parameter needs (tensor, requires_grad, {})");
        }
        return push(v, args->items[0]);
    default:
        return sd_set_error(SD_ERR_FORMAT,
                            "refused: the pickle calls torch.%s; a checkpoint may call only "
                            "collections.OrderedDict and torch._utils' rebuild functions",
                            f->dt->storage);
    }
}

/* Append items [base, sp) of the stack to list/dict `c` (pairs for a dict). */
static sd_status extend(vm *v, val *c, size_t base) {
    const size_t k = v->sp - base;
    if ((c->kind != V_LIST && c->kind != V_DICT) || (c->kind == V_DICT && k % 2 != 0)) {
        return bad(v, "APPEND/SETITEM on something that is not a list or a dict");
    }
    if (grow(&c->items, &c->cap, c->n + k, sizeof(*c->items)) != 0) {
        return nomem();
    }
    memcpy(c->items + c->n, v->stack + base, k * sizeof(*c->items));
    c->n += k;
    v->sp = base;
    return SD_OK;
}

/* A tuple of the top k items (or of those above the last MARK when k < 0). */
static sd_status make_tuple(vm *v, int k) {
    size_t base = 0;
    if (k < 0) {
        SD_TRY(pop_mark(v, &base));
    } else if (v->sp - floor_sp(v) < (size_t)k) {
        return bad(v, "the stack is empty");
    } else {
        base = v->sp - (size_t)k;
    }
    const size_t n = v->sp - base;
    val **items = n > 0 ? malloc(n * sizeof(*items)) : NULL;
    if (n > 0 && items == NULL) {
        return nomem();
    }
    if (n > 0) {
        memcpy(items, v->stack + base, n * sizeof(*items));
    }
    v->sp = base;
    val *t = NULL;
    const sd_status st = make(v, V_TUPLE, &t);
    if (st != SD_OK) {
        free(items);
        return st;
    }
    t->items = items;
    t->n = t->cap = n;
    return SD_OK;
}

static sd_status memo_put(vm *v, uint64_t idx) {
    val *x = NULL;
    SD_TRY(top(v, &x));
    if (idx > v->n + 256) {
        return bad(v, "a memo index larger than the pickle could use");
    }
    if (idx >= v->memo_cap) {
        const size_t old = v->memo_cap;
        if (grow(&v->memo, &v->memo_cap, (size_t)idx + 1, sizeof(*v->memo)) != 0) {
            return nomem();
        }
        memset(v->memo + old, 0, (v->memo_cap - old) * sizeof(*v->memo));
    }
    v->memo_count += v->memo[idx] == NULL;
    v->memo[idx] = x;
    return SD_OK;
}

static sd_status memo_get(vm *v, uint64_t idx) {
    if (idx >= v->memo_cap || v->memo[idx] == NULL) {
        return bad(v, "a memo get of an index never put");
    }
    return push(v, v->memo[idx]);
}

/* Opcodes that exist but have no place in a checkpoint, named in the refusal. */
static const struct {
    unsigned char op;
    const char *name;
    int builds; /* imports or builds arbitrary objects */
} g_foreign[] = {
    {'i', "INST", 1},
    {'o', "OBJ", 1},
    {0x81, "NEWOBJ", 1},
    {0x92, "NEWOBJ_EX", 1},
    {0x82, "EXT1", 1},
    {0x83, "EXT2", 1},
    {0x84, "EXT4", 1},
    {'P', "PERSID", 0},
    {'I', "INT", 0},
    {'L', "LONG", 0},
    {0x8b, "LONG4", 0},
    {'F', "FLOAT", 0},
    {'S', "STRING", 0},
    {'T', "BINSTRING", 0},
    {'U', "SHORT_BINSTRING", 0},
    {'V', "UNICODE", 0},
    {'B', "BINBYTES", 0},
    {'C', "SHORT_BINBYTES", 0},
    {0x8e, "BINBYTES8", 0},
    {0x96, "BYTEARRAY8", 0},
    {0x97, "NEXT_BUFFER", 0},
    {0x98, "READONLY_BUFFER", 0},
    {0x8f, "EMPTY_SET", 0},
    {0x90, "ADDITEMS", 0},
    {0x91, "FROZENSET", 0},
    {'l', "LIST", 0},
    {'d', "DICT", 0},
    {'0', "POP", 0},
    {'1', "POP_MARK", 0},
    {'2', "DUP", 0},
    {'g', "GET", 0},
    {'p', "PUT", 0},
};

static sd_status foreign_op(const vm *v, unsigned char op) {
    for (size_t i = 0; i < sizeof(g_foreign) / sizeof(g_foreign[0]); i++) {
        if (g_foreign[i].op == op && g_foreign[i].builds) {
            return sd_set_error(SD_ERR_FORMAT,
                                "refused: the pickle uses %s at byte %zu, which builds arbitrary "
                                "objects; a checkpoint may hold only tensors",
                                g_foreign[i].name, v->op_pos);
        }
        if (g_foreign[i].op == op) {
            return sd_set_error(SD_ERR_FORMAT,
                                "pickle opcode %s (0x%02x) at byte %zu is not one torch.save "
                                "writes for a state dict",
                                g_foreign[i].name, op, v->op_pos);
        }
    }
    return sd_set_error(SD_ERR_FORMAT, "unknown pickle opcode 0x%02x at byte %zu", op, v->op_pos);
}

/* A string: the opcode's length field of `lb` bytes, then the bytes. */
static sd_status read_str(vm *v, size_t lb) {
    const unsigned char *a = NULL;
    SD_TRY(need(v, lb, &a));
    const uint64_t len = lb == 1 ? a[0] : lb == 4 ? sd_le32(a) : sd_le64(a);
    v->pos += lb;
    if (len > v->n - v->pos) {
        return sd_set_error(SD_ERR_FORMAT, "the pickle is truncated at byte %zu", v->op_pos);
    }
    val *s = NULL;
    SD_TRY(make(v, V_STR, &s));
    s->s = (const char *)v->p + v->pos;
    s->len = (size_t)len;
    v->pos += (size_t)len;
    return SD_OK;
}

static sd_status make_int(vm *v, int64_t x) {
    val *r = NULL;
    SD_TRY(make(v, V_INT, &r));
    r->i = x;
    return SD_OK;
}

/* One opcode; *stop set at STOP. */
static sd_status step(vm *v, int *stop) {
    const unsigned char *a = NULL;
    val *x = NULL, *y = NULL, *z = NULL;
    size_t base = 0;
    uint64_t bits = 0;
    v->op_pos = v->pos;
    SD_TRY(need(v, 1, &a));
    const unsigned char op = *a;
    v->pos++;
    switch (op) {
    case 0x80: /* PROTO */
        SD_TRY(need(v, 1, &a));
        v->pos++;
        if (a[0] < 2 || a[0] > 5) {
            return sd_set_error(SD_ERR_FORMAT, "pickle protocol %d is not supported", a[0]);
        }
        return SD_OK;
    case 0x95: /* FRAME: a length hint */
        SD_TRY(need(v, 8, &a));
        v->pos += 8;
        return SD_OK;
    case '.': /* STOP */ *stop = 1; return SD_OK;
    case '(': /* MARK */
        if (grow(&v->marks, &v->marks_cap, v->n_marks + 1, sizeof(*v->marks)) != 0) {
            return nomem();
        }
        v->marks[v->n_marks++] = v->sp;
        return SD_OK;
    case 'N': return make(v, V_NONE, &x);
    case 0x88: /* NEWTRUE */
    case 0x89: /* NEWFALSE */
        SD_TRY(make(v, V_BOOL, &x));
        x->i = op == 0x88;
        return SD_OK;
    case 'K': /* BININT1 */
        SD_TRY(need(v, 1, &a));
        v->pos += 1;
        return make_int(v, a[0]);
    case 'M': /* BININT2 */
        SD_TRY(need(v, 2, &a));
        v->pos += 2;
        return make_int(v, sd_le16(a));
    case 'J': /* BININT */
        SD_TRY(need(v, 4, &a));
        v->pos += 4;
        return make_int(v, (int32_t)sd_le32(a));
    case 0x8a: { /* LONG1: n bytes, two's complement, little-endian */
        SD_TRY(need(v, 1, &a));
        const size_t n = a[0];
        v->pos++;
        if (n > 8) {
            return bad(v, "an integer wider than 64 bits");
        }
        SD_TRY(need(v, n, &a));
        v->pos += n;
        uint64_t u = 0;
        for (size_t i = 0; i < n; i++) {
            u |= (uint64_t)a[i] << (8 * i);
        }
        if (n > 0 && n < 8 && (a[n - 1] & 0x80)) {
            u |= ~(uint64_t)0 << (8 * n);
        }
        return make_int(v, (int64_t)u);
    }
    case 'G': /* BINFLOAT: big-endian double, kept as its bits */
        SD_TRY(need(v, 8, &a));
        v->pos += 8;
        SD_TRY(make(v, V_FLOAT, &x));
        for (int i = 0; i < 8; i++) {
            bits = bits << 8 | a[i];
        }
        x->i = (int64_t)bits;
        return SD_OK;
    case 0x8c: return read_str(v, 1); /* SHORT_BINUNICODE */
    case 'X': return read_str(v, 4);  /* BINUNICODE */
    case 0x8d: return read_str(v, 8); /* BINUNICODE8 */
    case 'c': {                       /* GLOBAL: "module\nname\n" */
        const unsigned char *mod = v->p + v->pos;
        const unsigned char *nl1 = memchr(mod, '\n', v->n - v->pos);
        const unsigned char *nl2 =
            nl1 != NULL ? memchr(nl1 + 1, '\n', v->n - v->pos - (size_t)(nl1 + 1 - mod)) : NULL;
        if (nl2 == NULL) {
            return sd_set_error(SD_ERR_FORMAT, "the pickle is truncated at byte %zu", v->op_pos);
        }
        v->pos += (size_t)(nl2 + 1 - mod);
        return make_global(v, (const char *)mod, (size_t)(nl1 - mod), (const char *)nl1 + 1,
                           (size_t)(nl2 - nl1 - 1));
    }
    case 0x93: /* STACK_GLOBAL */
        SD_TRY(pop(v, &y));
        SD_TRY(pop(v, &x));
        if (x->kind != V_STR || y->kind != V_STR) {
            return bad(v, "STACK_GLOBAL needs two strings");
        }
        return make_global(v, x->s, x->len, y->s, y->len);
    case ')': return make_tuple(v, 0); /* EMPTY_TUPLE */
    case 0x85: return make_tuple(v, 1);
    case 0x86: return make_tuple(v, 2);
    case 0x87: return make_tuple(v, 3);
    case 't': return make_tuple(v, -1);
    case '}': return make(v, V_DICT, &x); /* EMPTY_DICT */
    case ']': return make(v, V_LIST, &x); /* EMPTY_LIST */
    case 'a':                             /* APPEND */
    case 's':                             /* SETITEM */
        base = v->sp - (op == 's' ? 2 : 1);
        if (v->sp < floor_sp(v) + (op == 's' ? 3 : 2)) {
            return bad(v, "the stack is empty");
        }
        return extend(v, v->stack[base - 1], base);
    case 'e': /* APPENDS */
    case 'u': /* SETITEMS */
        SD_TRY(pop_mark(v, &base));
        if (base <= floor_sp(v)) {
            return bad(v, "APPENDS/SETITEMS with nothing below the MARK");
        }
        return extend(v, v->stack[base - 1], base);
    case 'q': /* BINPUT */
        SD_TRY(need(v, 1, &a));
        v->pos += 1;
        return memo_put(v, a[0]);
    case 'r': /* LONG_BINPUT */
        SD_TRY(need(v, 4, &a));
        v->pos += 4;
        return memo_put(v, sd_le32(a));
    case 0x94: /* MEMOIZE */ return memo_put(v, v->memo_count);
    case 'h': /* BINGET */
        SD_TRY(need(v, 1, &a));
        v->pos += 1;
        return memo_get(v, a[0]);
    case 'j': /* LONG_BINGET */
        SD_TRY(need(v, 4, &a));
        v->pos += 4;
        return memo_get(v, sd_le32(a));
    case 'Q': /* BINPERSID */ SD_TRY(pop(v, &x)); return persistent_load(v, x);
    case 'R': /* REDUCE */
        SD_TRY(pop(v, &y));
        SD_TRY(pop(v, &x));
        return reduce(v, x, y);
    case 'b': /* BUILD: only an OrderedDict's attributes (a state dict's _metadata), ignored */
        SD_TRY(pop(v, &y));
        SD_TRY(top(v, &z));
        if (z->kind != V_DICT || !z->ordered || y->kind != V_DICT) {
            return sd_set_error(SD_ERR_FORMAT,
                                "refused: the pickle sets the state of a %s (BUILD at byte %zu); "
                                "a checkpoint may only set an OrderedDict's attributes",
                                g_kind_names[z->kind], v->op_pos);
        }
        return SD_OK;
    default: return foreign_op(v, op);
    }
}

static void vm_free(vm *v) {
    for (size_t i = 0; i < v->n_all; i++) {
        free(v->all[i]->items);
        free(v->all[i]);
    }
    free(v->all);
    free(v->stack);
    free(v->marks);
    free(v->memo);
}

/* ---- tensors ---- */

/* The checked view of tensor `name`. */
static sd_status tensor_view(sd_tensor_info *t, const val *x, const char *name,
                             const unsigned char *base) {
    const val *s = x->storage;
    const size_t nd = x->size->n;
    if (nd > SD_MAX_DIMS) {
        return sd_set_error(SD_ERR_UNSUPPORTED,
                            "tensor '%s' has %zu dimensions (at most %d supported)", name, nd,
                            SD_MAX_DIMS);
    }
    uint64_t numel = 1;
    for (size_t d = 0; d < nd; d++) {
        const int64_t e = x->size->items[d]->i;
        if (e < 0 || e > ((int64_t)1 << 40) ||
            (e > 0 && numel > ((uint64_t)1 << 50) / (uint64_t)e)) {
            return sd_set_error(SD_ERR_FORMAT, "tensor '%s' has an invalid shape", name);
        }
        t->shape[d] = e;
        numel *= (uint64_t)e;
    }
    /* contiguous row-major: stride[d] = prod(shape[d+1:]) wherever shape[d] > 1 */
    uint64_t want = 1;
    for (size_t d = nd; d-- > 0 && numel > 0;) {
        if (t->shape[d] != 1 && x->stride->items[d]->i != (int64_t)want) {
            return sd_set_error(SD_ERR_FORMAT,
                                "tensor '%s' is not contiguous: dimension %zu of size %lld has "
                                "stride %lld, row-major needs %llu (save tensor.contiguous())",
                                name, d, (long long)t->shape[d], (long long)x->stride->items[d]->i,
                                (unsigned long long)want);
        }
        want *= (uint64_t)t->shape[d];
    }
    const uint64_t off = (uint64_t)x->i, have = (uint64_t)s->i;
    if (numel > 0 && (off > have || numel > have - off)) {
        char kb[96];
        return sd_set_error(SD_ERR_FORMAT,
                            "tensor '%s' covers elements [%llu, %llu) of storage '%s', which "
                            "holds only %llu",
                            name, (unsigned long long)off, (unsigned long long)(off + numel),
                            sd_zip_show(kb, sizeof(kb), s->entry->name, s->entry->name_len),
                            (unsigned long long)have);
    }
    t->type = s->dt->type;
    snprintf(t->type_name, sizeof(t->type_name), "%s", s->dt->type_name);
    t->n_dims = (int)nd;
    t->nbytes = (size_t)numel * (size_t)s->dt->elem_size;
    t->data = base + s->entry->data_ofs + (numel > 0 ? off * (uint64_t)s->dt->elem_size : 0);
    return SD_OK;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp((*(const sd_tensor_info *const *)a)->name,
                  (*(const sd_tensor_info *const *)b)->name);
}

/* The top-level dict {name: tensor} into set->tensors. */
static sd_status collect(sd_st_set *set, const val *d, const unsigned char *base) {
    if (d->kind != V_DICT) {
        return sd_set_error(SD_ERR_FORMAT,
                            "the checkpoint holds a %s, not a dict of tensors (a state dict)",
                            g_kind_names[d->kind]);
    }
    const size_t n = d->n / 2;
    set->tensors = calloc(n + 1, sizeof(*set->tensors));
    const sd_tensor_info **sorted = calloc(n + 1, sizeof(*sorted));
    sd_status st = set->tensors == NULL || sorted == NULL ? nomem() : SD_OK;
    char kb[96];
    for (size_t i = 0; i < n && st == SD_OK; i++) {
        const val *k = d->items[2 * i], *x = d->items[2 * i + 1];
        if (k->kind != V_STR || memchr(k->s, '\0', k->len) != NULL) {
            st = sd_set_error(SD_ERR_FORMAT, "the checkpoint's dict has a key that is not a "
                                             "tensor name");
            break;
        }
        sd_zip_show(kb, sizeof(kb), k->s, k->len);
        if (x->kind != V_TENSOR) {
            st = sd_set_error(SD_ERR_FORMAT,
                              "the checkpoint's entry '%s' is a %s, not a tensor (nested dicts "
                              "are not supported)",
                              kb, g_kind_names[x->kind]);
            break;
        }
        sd_tensor_info *t = &set->tensors[set->n_tensors];
        t->name = malloc(k->len + 1);
        if (t->name == NULL) {
            st = nomem();
            break;
        }
        memcpy(t->name, k->s, k->len);
        t->name[k->len] = '\0';
        set->n_tensors++;
        st = tensor_view(t, x, kb, base);
        sorted[i] = t;
    }
    if (st == SD_OK && n > 1) {
        qsort(sorted, n, sizeof(*sorted), cmp_tensor_name);
        for (size_t i = 1; i < n && st == SD_OK; i++) {
            if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
                st = sd_set_error(
                    SD_ERR_FORMAT, "the checkpoint names tensor '%s' twice",
                    sd_zip_show(kb, sizeof(kb), sorted[i]->name, strlen(sorted[i]->name)));
            }
        }
    }
    free(sorted);
    return st;
}

/* Run data.pkl and collect its tensors. */
static sd_status run_pickle(sd_st_set *set, const sd_zip *z, const sd_zip_entry *pkl,
                            const unsigned char *base) {
    vm v;
    memset(&v, 0, sizeof(v));
    v.p = base + pkl->data_ofs;
    v.n = (size_t)pkl->size;
    v.zip = z;
    v.prefix = pkl->name;
    v.prefix_len = pkl->name_len - strlen("data.pkl");
    int stop = 0;
    sd_status st = SD_OK;
    while (st == SD_OK && !stop) {
        st = step(&v, &stop);
    }
    if (st == SD_OK && (v.sp != 1 || v.n_marks != 0)) {
        st = sd_set_error(SD_ERR_FORMAT,
                          "the pickle stops with %zu values and %zu marks on its "
                          "stack, not one value",
                          v.sp, v.n_marks);
    }
    if (st == SD_OK) {
        st = collect(set, v.stack[0], base);
    }
    vm_free(&v);
    return st;
}

/* The one entry "<archive>/data.pkl" (any archive name, one level deep). */
static sd_status find_pickle(const sd_zip *z, const sd_zip_entry **out) {
    *out = NULL;
    for (size_t i = 0; i < z->n; i++) {
        const sd_zip_entry *e = &z->entries[i];
        const char *slash = memchr(e->name, '/', e->name_len);
        if (slash != NULL && slash > e->name &&
            (size_t)(e->name + e->name_len - slash) == strlen("/data.pkl") &&
            memcmp(slash, "/data.pkl", strlen("/data.pkl")) == 0) {
            if (*out != NULL) {
                return sd_set_error(SD_ERR_FORMAT, "the archive holds more than one data.pkl");
            }
            *out = e;
        }
    }
    if (*out == NULL) {
        return sd_set_error(SD_ERR_FORMAT, "the archive has no <archive>/data.pkl entry: not a "
                                           "PyTorch checkpoint (torch.save's zip format)");
    }
    return SD_OK;
}

static sd_status open_checked(sd_st_set *set, const sd_mapping *m) {
    if (m->size < 4 || memcmp(m->data, "PK\3\4", 4) != 0) {
        if (m->size >= 2 && m->data[0] == 0x80) {
            return sd_set_error(SD_ERR_UNSUPPORTED,
                                "a bare pickle: the legacy torch.save format (before PyTorch "
                                "1.6) is not supported; save it again with a recent torch");
        }
        return sd_set_error(SD_ERR_FORMAT, "not a ZIP archive (torch.save's format)");
    }
    sd_zip z;
    SD_TRY(sd_zip_open(&z, m));
    const sd_zip_entry *pkl = NULL;
    sd_status st = find_pickle(&z, &pkl);
    if (st == SD_OK) {
        char name[600];
        const size_t pl = pkl->name_len - strlen("data.pkl");
        const sd_zip_entry *bo = NULL;
        if (pl + strlen("byteorder") < sizeof(name)) {
            memcpy(name, pkl->name, pl);
            memcpy(name + pl, "byteorder", strlen("byteorder"));
            bo = sd_zip_find(&z, name, pl + strlen("byteorder"));
        }
        if (bo != NULL && !(bo->size == 6 && memcmp(m->data + bo->data_ofs, "little", 6) == 0)) {
            st = sd_set_error(SD_ERR_UNSUPPORTED, "the checkpoint's byteorder is not 'little'");
        }
    }
    if (st == SD_OK) {
        st = run_pickle(set, &z, pkl, m->data);
    }
    sd_zip_close(&z);
    return st;
}

sd_status sd_torch_bin_open(sd_st_set **out, const char *path) {
    *out = NULL;
    sd_st_set *set = calloc(1, sizeof(*set));
    if (set == NULL || (set->maps = calloc(1, sizeof(*set->maps))) == NULL) {
        free(set);
        return sd_set_error(SD_ERR_NOMEM, "out of memory opening '%s'", path);
    }
    sd_status st = sd_map_file(&set->maps[0], path);
    if (st == SD_OK) {
        set->n_files = 1;
        st = open_checked(set, &set->maps[0]);
        if (st != SD_OK) {
            sd_error_prefix(st, "%s", path);
        }
    }
    if (st != SD_OK) {
        sd_st_close(set);
        return st;
    }
    *out = set;
    return SD_OK;
}

sd_status sd_tensor_set_open_file(sd_st_set **out, const char *path) {
    *out = NULL;
    sd_mapping m;
    SD_TRY(sd_map_file(&m, path));
    const int zip = m.size >= 4 && memcmp(m.data, "PK\3\4", 4) == 0;
    sd_unmap_file(&m);
    return zip ? sd_torch_bin_open(out, path) : sd_st_open_file(out, path);
}
