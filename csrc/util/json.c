/* json.c — strict recursive-descent JSON parser over a bounded buffer (see json.h).
 * Every read checks the position against the length; recursion is bounded by
 * SD_JSON_MAX_DEPTH; every error path frees what it built. Linear time in the input size. */
#include "util/json.h"

#include <locale.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/status.h"

typedef struct {
    const unsigned char *text;
    size_t len;
    size_t pos;
} parser;

static sd_status parse_value(parser *p, sd_json *out, int depth);

/* ---- errors ---------------------------------------------------------------------------------- */

/* Describe byte `c` for a message: 'x' when printable ASCII, 0xNN otherwise. */
static const char *describe_byte(unsigned char c, char buf[8]) {
    static const char hex[] = "0123456789ABCDEF";
    if (c > 0x20 && c < 0x7f && c != '\'') {
        buf[0] = '\'';
        buf[1] = (char)c;
        buf[2] = '\'';
        buf[3] = '\0';
    } else {
        buf[0] = '0';
        buf[1] = 'x';
        buf[2] = hex[c >> 4];
        buf[3] = hex[c & 0xf];
        buf[4] = '\0';
    }
    return buf;
}

/* The byte at p->pos is not allowed here (or the input ended); `expected` says what was. */
static sd_status err_unexpected(const parser *p, const char *expected) {
    char buf[8];
    if (p->pos >= p->len) {
        return sd_set_error(SD_ERR_FORMAT,
                            "json: unexpected end of input at byte %zu (expected %s)", p->pos,
                            expected);
    }
    return sd_set_error(SD_ERR_FORMAT, "json: unexpected character %s at byte %zu (expected %s)",
                        describe_byte(p->text[p->pos], buf), p->pos, expected);
}

static sd_status err_nomem(void) {
    return sd_set_error(SD_ERR_NOMEM, "json: out of memory");
}

/* ---- small helpers --------------------------------------------------------------------------- */

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        unsigned char c = p->text[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            break;
        }
        p->pos++;
    }
}

static int is_digit(unsigned char c) {
    return c >= '0' && c <= '9';
}

/* Return `buf` (holding `n` elements of `elem` bytes, capacity *cap) with room for one more,
 * possibly moved; NULL when out of memory, in which case `buf` is unchanged and still owned. */
static void *grow(void *buf, size_t *cap, size_t n, size_t elem) {
    size_t new_cap;
    void *nb;
    if (n < *cap) {
        return buf;
    }
    new_cap = *cap ? *cap * 2 : 4;
    if (new_cap < *cap || new_cap > (size_t)-1 / elem) {
        return NULL;
    }
    nb = realloc(buf, new_cap * elem);
    if (nb != NULL) {
        *cap = new_cap;
    }
    return nb;
}

/* Give back the unused tail of a finished buffer (a failed shrink keeps the old block). */
static void *shrink(void *buf, size_t n, size_t cap, size_t elem) {
    void *nb;
    if (n == 0 || n == cap) {
        return buf;
    }
    nb = realloc(buf, n * elem);
    return nb != NULL ? nb : buf;
}

/* Free everything `v` owns (not `v` itself). Recursion depth is bounded by the parser. */
static void free_contents(sd_json *v) {
    size_t i;
    switch (v->type) {
    case SD_JSON_STRING: free(v->string); break;
    case SD_JSON_ARRAY:
    case SD_JSON_OBJECT:
        for (i = 0; i < v->n; i++) {
            free_contents(&v->items[i]);
            if (v->keys != NULL) {
                free(v->keys[i]);
            }
        }
        free(v->items);
        free(v->keys);
        break;
    default: break;
    }
    memset(v, 0, sizeof(*v));
}

/* ---- literals -------------------------------------------------------------------------------- */

static sd_status parse_literal(parser *p, const char *word) {
    size_t i;
    for (i = 0; word[i] != '\0'; i++) {
        if (p->pos >= p->len || p->text[p->pos] != (unsigned char)word[i]) {
            return err_unexpected(p, word);
        }
        p->pos++;
    }
    return SD_OK;
}

/* ---- numbers --------------------------------------------------------------------------------- */

static sd_status parse_number(parser *p, sd_json *out) {
    const size_t start = p->pos;
    int negative = 0, integral = 1, fits = 1;
    uint64_t mag = 0;
    /* |INT64_MIN| = 2^63; the limit for positive values is one less. */
    const uint64_t limit_neg = (uint64_t)INT64_MAX + 1u;
    char small[64];
    char *buf = small;
    char *end = NULL;
    char dp = '.';
    const struct lconv *lc;
    size_t n, i;
    double d;

    if (p->pos < p->len && p->text[p->pos] == '-') {
        negative = 1;
        p->pos++;
    }
    if (p->pos >= p->len || !is_digit(p->text[p->pos])) {
        return err_unexpected(p, "digit");
    }
    if (p->text[p->pos] == '0') {
        p->pos++;
        if (p->pos < p->len && is_digit(p->text[p->pos])) {
            return sd_set_error(SD_ERR_FORMAT, "json: leading zero in number at byte %zu", start);
        }
    } else {
        while (p->pos < p->len && is_digit(p->text[p->pos])) {
            uint64_t digit = (uint64_t)(p->text[p->pos] - '0');
            uint64_t limit = negative ? limit_neg : (uint64_t)INT64_MAX;
            if (fits && mag <= (limit - digit) / 10u) {
                mag = mag * 10u + digit;
            } else {
                fits = 0;
            }
            p->pos++;
        }
    }
    if (p->pos < p->len && p->text[p->pos] == '.') {
        integral = 0;
        p->pos++;
        if (p->pos >= p->len || !is_digit(p->text[p->pos])) {
            return err_unexpected(p, "digit after '.'");
        }
        while (p->pos < p->len && is_digit(p->text[p->pos])) {
            p->pos++;
        }
    }
    if (p->pos < p->len && (p->text[p->pos] == 'e' || p->text[p->pos] == 'E')) {
        integral = 0;
        p->pos++;
        if (p->pos < p->len && (p->text[p->pos] == '+' || p->text[p->pos] == '-')) {
            p->pos++;
        }
        if (p->pos >= p->len || !is_digit(p->text[p->pos])) {
            return err_unexpected(p, "digit in exponent");
        }
        while (p->pos < p->len && is_digit(p->text[p->pos])) {
            p->pos++;
        }
    }

    /* strtod needs a NUL-terminated copy; it also honours the locale's decimal point, so the
     * '.' of the lexeme is translated to it (a multi-byte decimal point is left as '.'). */
    lc = localeconv();
    if (lc != NULL && lc->decimal_point != NULL && lc->decimal_point[0] != '\0' &&
        lc->decimal_point[1] == '\0') {
        dp = lc->decimal_point[0];
    }
    n = p->pos - start;
    if (n >= sizeof(small)) {
        buf = malloc(n + 1);
        if (buf == NULL) {
            return err_nomem();
        }
    }
    for (i = 0; i < n; i++) {
        char c = (char)p->text[start + i];
        buf[i] = c == '.' ? dp : c;
    }
    buf[n] = '\0';
    d = strtod(buf, &end);
    i = (size_t)(end - buf);
    if (buf != small) {
        free(buf);
    }
    if (i != n) {
        return sd_set_error(SD_ERR_FORMAT, "json: cannot convert number at byte %zu", start);
    }
    /* Overflow gives +-HUGE_VAL (infinity); reject it rather than hand out a non-finite value.
     * Underflow to a subnormal or zero is accepted. */
    if (!isfinite(d)) {
        return sd_set_error(SD_ERR_FORMAT, "json: number out of range at byte %zu", start);
    }

    out->type = SD_JSON_NUMBER;
    out->number = d;
    if (integral && fits) {
        out->is_integer = 1;
        if (negative) {
            /* -(2^63) is representable; compute without overflowing a signed type. */
            out->integer = mag == limit_neg ? INT64_MIN : -(int64_t)mag;
        } else {
            out->integer = (int64_t)mag;
        }
    }
    return SD_OK;
}

/* ---- strings --------------------------------------------------------------------------------- */

static int hex_value(unsigned char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/* Read the 4 hex digits of a \u escape whose backslash is at `at` (the span is known to hold the
 * bytes up to `end`, the closing quote). */
static sd_status read_u_escape(const parser *p, size_t at, size_t end, unsigned *cp) {
    size_t k;
    unsigned v = 0;
    if (end - at < 6) {
        return sd_set_error(SD_ERR_FORMAT, "json: truncated \\u escape at byte %zu", at);
    }
    for (k = 2; k < 6; k++) {
        int h = hex_value(p->text[at + k]);
        if (h < 0) {
            return sd_set_error(SD_ERR_FORMAT, "json: invalid \\u escape at byte %zu", at);
        }
        v = v * 16u + (unsigned)h;
    }
    *cp = v;
    return SD_OK;
}

static size_t put_utf8(char *dst, unsigned cp) {
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        dst[0] = (char)(0xC0 | (cp >> 6));
        dst[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        dst[0] = (char)(0xE0 | (cp >> 12));
        dst[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        dst[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    dst[0] = (char)(0xF0 | (cp >> 18));
    dst[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    dst[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    dst[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the well-formed UTF-8 sequence starting at text[i] (lead byte >= 0x80) that ends
 * before `end`, or 0 if it is ill-formed (Unicode table 3-7: no overlongs, no surrogates,
 * nothing above U+10FFFF). */
static size_t utf8_seq_len(const unsigned char *t, size_t i, size_t end) {
    unsigned char c = t[i];
    unsigned char lo = 0x80, hi = 0xBF;
    size_t need, k;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) {
            lo = 0xA0;
        } else if (c == 0xED) {
            hi = 0x9F;
        }
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) {
            lo = 0x90;
        } else if (c == 0xF4) {
            hi = 0x8F;
        }
    } else {
        return 0;
    }
    if (end - i <= need) {
        return 0;
    }
    for (k = 1; k <= need; k++) {
        unsigned char b = t[i + k];
        if (b < lo || b > hi) {
            return 0;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

/* Parse a string whose opening quote is at p->pos into a fresh NUL-terminated buffer. */
static sd_status parse_string(parser *p, char **out, size_t *out_len) {
    const size_t start = p->pos;
    size_t end, i, o = 0;
    char *s;
    sd_status st;

    /* Pass 1: find the closing quote (skipping escaped bytes) and reject control characters. */
    end = start + 1;
    for (;;) {
        unsigned char c;
        if (end >= p->len) {
            return sd_set_error(SD_ERR_FORMAT, "json: unterminated string at byte %zu", start);
        }
        c = p->text[end];
        if (c == '"') {
            break;
        }
        if (c < 0x20) {
            return sd_set_error(SD_ERR_FORMAT,
                                "json: control character 0x%02X in string at byte %zu", (unsigned)c,
                                end);
        }
        end += c == '\\' ? 2 : 1;
    }

    /* Pass 2: decode. Every escape is at least as long as its UTF-8 output, so the raw span
     * length bounds the decoded length. */
    s = malloc(end - start);
    if (s == NULL) {
        return err_nomem();
    }
    i = start + 1;
    while (i < end) {
        unsigned char c = p->text[i];
        if (c == '\\') {
            unsigned char e = p->text[i + 1]; /* i + 1 < end: pass 1 skipped over it */
            unsigned cp = 0;
            switch (e) {
            case '"':
            case '\\':
            case '/':
                s[o++] = (char)e;
                i += 2;
                continue;
            case 'b':
                s[o++] = '\b';
                i += 2;
                continue;
            case 'f':
                s[o++] = '\f';
                i += 2;
                continue;
            case 'n':
                s[o++] = '\n';
                i += 2;
                continue;
            case 'r':
                s[o++] = '\r';
                i += 2;
                continue;
            case 't':
                s[o++] = '\t';
                i += 2;
                continue;
            case 'u': break;
            default:
                free(s);
                return sd_set_error(SD_ERR_FORMAT, "json: invalid escape '\\%c' at byte %zu",
                                    e >= 0x20 && e < 0x7f ? (char)e : '?', i);
            }
            st = read_u_escape(p, i, end, &cp);
            if (st != SD_OK) {
                free(s);
                return st;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo = 0;
                if (end - i < 8 || p->text[i + 6] != '\\' || p->text[i + 7] != 'u') {
                    free(s);
                    return sd_set_error(SD_ERR_FORMAT, "json: lone surrogate \\u%04X at byte %zu",
                                        cp, i);
                }
                st = read_u_escape(p, i + 6, end, &lo);
                if (st != SD_OK) {
                    free(s);
                    return st;
                }
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    free(s);
                    return sd_set_error(SD_ERR_FORMAT, "json: lone surrogate \\u%04X at byte %zu",
                                        cp, i);
                }
                cp = 0x10000u + ((cp - 0xD800u) << 10) + (lo - 0xDC00u);
                i += 12;
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                free(s);
                return sd_set_error(SD_ERR_FORMAT, "json: lone surrogate \\u%04X at byte %zu", cp,
                                    i);
            } else if (cp == 0) {
                free(s);
                return sd_set_error(SD_ERR_FORMAT, "json: \\u0000 in string at byte %zu", i);
            } else {
                i += 6;
            }
            o += put_utf8(s + o, cp);
        } else if (c < 0x80) {
            s[o++] = (char)c;
            i++;
        } else {
            size_t k = utf8_seq_len(p->text, i, end);
            if (k == 0) {
                free(s);
                return sd_set_error(SD_ERR_FORMAT, "json: invalid UTF-8 in string at byte %zu", i);
            }
            memcpy(s + o, p->text + i, k);
            o += k;
            i += k;
        }
    }
    s[o] = '\0';
    p->pos = end + 1;
    *out = s;
    *out_len = o;
    return SD_OK;
}

/* ---- arrays and objects ---------------------------------------------------------------------- */

static sd_status check_depth(const parser *p, int depth) {
    if (depth >= SD_JSON_MAX_DEPTH) {
        return sd_set_error(SD_ERR_FORMAT, "json: nesting deeper than %d at byte %zu",
                            SD_JSON_MAX_DEPTH, p->pos);
    }
    return SD_OK;
}

/* `depth` counts the arrays/objects enclosing this one. */
static sd_status parse_array(parser *p, sd_json *out, int depth) {
    sd_json *items = NULL;
    size_t n = 0, cap = 0, i;
    sd_status st;

    SD_TRY(check_depth(p, depth));
    p->pos++; /* '[' */
    skip_ws(p);
    if (p->pos < p->len && p->text[p->pos] == ']') {
        p->pos++;
        out->type = SD_JSON_ARRAY;
        return SD_OK;
    }
    for (;;) {
        sd_json *grown = grow(items, &cap, n, sizeof(*items));
        if (grown == NULL) {
            st = err_nomem();
            goto fail;
        }
        items = grown;
        memset(&items[n], 0, sizeof(items[n]));
        skip_ws(p);
        SD_TRY_GOTO(st, parse_value(p, &items[n], depth + 1), fail);
        n++;
        skip_ws(p);
        if (p->pos < p->len && p->text[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->text[p->pos] == ']') {
            p->pos++;
            break;
        }
        st = err_unexpected(p, "',' or ']'");
        goto fail;
    }
    out->type = SD_JSON_ARRAY;
    out->n = n;
    out->items = shrink(items, n, cap, sizeof(*items));
    return SD_OK;

fail:
    for (i = 0; i < n; i++) {
        free_contents(&items[i]);
    }
    free(items);
    return st;
}

static sd_status parse_object(parser *p, sd_json *out, int depth) {
    sd_json *items = NULL;
    char **keys = NULL;
    size_t n = 0, cap_items = 0, cap_keys = 0, i;
    sd_status st;

    SD_TRY(check_depth(p, depth));
    p->pos++; /* '{' */
    skip_ws(p);
    if (p->pos < p->len && p->text[p->pos] == '}') {
        p->pos++;
        out->type = SD_JSON_OBJECT;
        return SD_OK;
    }
    for (;;) {
        size_t key_len;
        sd_json *grown_items = grow(items, &cap_items, n, sizeof(*items));
        char **grown_keys;
        if (grown_items == NULL) {
            st = err_nomem();
            goto fail;
        }
        items = grown_items;
        grown_keys = grow(keys, &cap_keys, n, sizeof(*keys));
        if (grown_keys == NULL) {
            st = err_nomem();
            goto fail;
        }
        keys = grown_keys;
        memset(&items[n], 0, sizeof(items[n]));
        keys[n] = NULL;
        skip_ws(p);
        if (p->pos >= p->len || p->text[p->pos] != '"') {
            st = err_unexpected(p, "object key");
            goto fail;
        }
        SD_TRY_GOTO(st, parse_string(p, &keys[n], &key_len), fail);
        skip_ws(p);
        if (p->pos >= p->len || p->text[p->pos] != ':') {
            st = err_unexpected(p, "':'");
            free(keys[n]);
            goto fail;
        }
        p->pos++;
        skip_ws(p);
        st = parse_value(p, &items[n], depth + 1);
        if (st != SD_OK) {
            free(keys[n]);
            goto fail;
        }
        n++;
        skip_ws(p);
        if (p->pos < p->len && p->text[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->text[p->pos] == '}') {
            p->pos++;
            break;
        }
        st = err_unexpected(p, "',' or '}'");
        goto fail;
    }
    out->type = SD_JSON_OBJECT;
    out->n = n;
    out->items = shrink(items, n, cap_items, sizeof(*items));
    out->keys = shrink(keys, n, cap_keys, sizeof(*keys));
    return SD_OK;

fail:
    for (i = 0; i < n; i++) {
        free_contents(&items[i]);
        free(keys[i]);
    }
    free(items);
    free(keys);
    return st;
}

/* ---- values ---------------------------------------------------------------------------------- */

/* Parse one value at p->pos (no leading whitespace) into *out, which is zeroed. On failure *out
 * owns nothing. */
static sd_status parse_value(parser *p, sd_json *out, int depth) {
    unsigned char c;
    if (p->pos >= p->len) {
        return err_unexpected(p, "value");
    }
    c = p->text[p->pos];
    switch (c) {
    case '{': return parse_object(p, out, depth);
    case '[': return parse_array(p, out, depth);
    case '"': out->type = SD_JSON_STRING; return parse_string(p, &out->string, &out->string_len);
    case 't':
        out->type = SD_JSON_BOOL;
        out->boolean = 1;
        return parse_literal(p, "true");
    case 'f':
        out->type = SD_JSON_BOOL;
        out->boolean = 0;
        return parse_literal(p, "false");
    case 'n': out->type = SD_JSON_NULL; return parse_literal(p, "null");
    default:
        if (c == '-' || is_digit(c)) {
            return parse_number(p, out);
        }
        return err_unexpected(p, "value");
    }
}

/* ---- public API ------------------------------------------------------------------------------ */

sd_status sd_json_parse(sd_json **out, const char *text, size_t len) {
    parser p;
    sd_json *root;
    sd_status st;

    if (out == NULL) {
        return sd_set_error(SD_ERR_INVALID_ARG, "json: output pointer is NULL");
    }
    *out = NULL;
    if (text == NULL && len > 0) {
        return sd_set_error(SD_ERR_INVALID_ARG, "json: text is NULL");
    }
    p.text = (const unsigned char *)text;
    p.len = len;
    p.pos = 0;

    root = calloc(1, sizeof(*root));
    if (root == NULL) {
        return err_nomem();
    }
    skip_ws(&p);
    st = parse_value(&p, root, 0);
    if (st != SD_OK) {
        free_contents(root);
        free(root);
        return st;
    }
    skip_ws(&p);
    if (p.pos < p.len) {
        free_contents(root);
        free(root);
        return err_unexpected(&p, "end of input");
    }
    *out = root;
    return SD_OK;
}

void sd_json_free(sd_json *v) {
    if (v == NULL) {
        return;
    }
    free_contents(v);
    free(v);
}

const sd_json *sd_json_get(const sd_json *obj, const char *key) {
    size_t i;
    if (obj == NULL || key == NULL || obj->type != SD_JSON_OBJECT) {
        return NULL;
    }
    for (i = obj->n; i > 0; i--) {
        if (strcmp(obj->keys[i - 1], key) == 0) {
            return &obj->items[i - 1];
        }
    }
    return NULL;
}

int sd_json_get_int(const sd_json *obj, const char *key, int64_t *out) {
    const sd_json *v = sd_json_get(obj, key);
    double d;
    if (v == NULL || v->type != SD_JSON_NUMBER) {
        return 0;
    }
    if (v->is_integer) {
        *out = v->integer;
        return 1;
    }
    d = v->number;
    /* [-2^63, 2^63): both bounds are exact doubles; the cast is then defined. */
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) {
        return 0;
    }
    if ((double)(int64_t)d != d) {
        return 0;
    }
    *out = (int64_t)d;
    return 1;
}

int sd_json_get_double(const sd_json *obj, const char *key, double *out) {
    const sd_json *v = sd_json_get(obj, key);
    if (v == NULL || v->type != SD_JSON_NUMBER) {
        return 0;
    }
    *out = v->number;
    return 1;
}

int sd_json_get_bool(const sd_json *obj, const char *key, int *out) {
    const sd_json *v = sd_json_get(obj, key);
    if (v == NULL || v->type != SD_JSON_BOOL) {
        return 0;
    }
    *out = v->boolean;
    return 1;
}

const char *sd_json_get_string(const sd_json *obj, const char *key) {
    const sd_json *v = sd_json_get(obj, key);
    if (v == NULL || v->type != SD_JSON_STRING) {
        return NULL;
    }
    return v->string;
}
