/* json.h — a small, strict JSON reader (RFC 8259) for safetensors headers and Hugging Face
 * config files. Input is untrusted: every error (malformed, truncated, too deep, out of memory)
 * is reported through sd_set_error, never by crashing or reading past the given length. */
#ifndef SD_JSON_H
#define SD_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "specdec.h"

/* Arrays and objects nested deeper than this are rejected (bounds the parser's recursion). */
#define SD_JSON_MAX_DEPTH 64

typedef enum {
    SD_JSON_NULL,
    SD_JSON_BOOL,
    SD_JSON_NUMBER,
    SD_JSON_STRING,
    SD_JSON_ARRAY,
    SD_JSON_OBJECT
} sd_json_type;

typedef struct sd_json sd_json;
struct sd_json {
    sd_json_type type;
    int boolean;       /* SD_JSON_BOOL: 0 or 1 */
    double number;     /* SD_JSON_NUMBER: the value, correctly rounded by strtod (always set) */
    int is_integer;    /* SD_JSON_NUMBER written without fraction/exponent and fits int64 */
    int64_t integer;   /* exact value when is_integer */
    char *string;      /* SD_JSON_STRING: decoded UTF-8, NUL-terminated, never holds a NUL */
    size_t string_len; /* bytes, excluding the NUL */
    size_t n;          /* SD_JSON_ARRAY / SD_JSON_OBJECT: number of items */
    sd_json *items;    /* array elements, or object values (n of them), in document order */
    char **keys;       /* SD_JSON_OBJECT: decoded keys (n of them), NUL-terminated */
};

/* Parse exactly one JSON value from text[0..len); surrounding whitespace is allowed, anything
 * else after the value is an error. `text` need not be NUL-terminated. On success *out owns the
 * whole tree; free it with sd_json_free. On failure *out is NULL and the recorded message says
 * what went wrong and at which 0-based byte offset, e.g. "json: unexpected character 'x' at
 * byte 17", "json: unterminated string at byte 3", "json: nesting deeper than 64 at byte 90".
 * Strictness: strings must be valid UTF-8 without raw control characters; lone or mismatched
 * UTF-16 surrogates in \u escapes and the escape \u0000 are rejected (so every decoded string
 * and key is a plain C string); numbers follow the RFC grammar (no leading zeros, no '+', no
 * NaN/Infinity) and must be finite as doubles; duplicate object keys are kept.
 * Returns SD_OK, SD_ERR_FORMAT (bad input), SD_ERR_NOMEM or SD_ERR_INVALID_ARG (out is NULL, or
 * text is NULL with len > 0). */
sd_status sd_json_parse(sd_json **out, const char *text, size_t len);

/* Free a tree returned by sd_json_parse. Accepts NULL. */
void sd_json_free(sd_json *v);

/* Value of `key` in object `obj` (linear search; the last one if the key is duplicated).
 * NULL if obj or key is NULL, obj is not an object, or it has no such key. */
const sd_json *sd_json_get(const sd_json *obj, const char *key);

/* Convenience getters: return 1 and store the value in *out if `key` exists in `obj` with a
 * compatible type, else return 0 and leave *out untouched. */

/* Integer: a number written as an integer that fits int64, or any number whose double value is
 * integral and within int64 range (e.g. 1e3 or 4096.0). */
int sd_json_get_int(const sd_json *obj, const char *key, int64_t *out);
/* Any number, as a double. */
int sd_json_get_double(const sd_json *obj, const char *key, double *out);
/* true / false only (numbers are not booleans). */
int sd_json_get_bool(const sd_json *obj, const char *key, int *out);
/* The decoded string (owned by the tree), or NULL if missing or not a string. */
const char *sd_json_get_string(const sd_json *obj, const char *key);

#endif /* SD_JSON_H */
