/* jsonin.h - how attnd reads request bodies: a pull reader over the body's
 * bytes, and the one loop that walks any JSON object against a field
 * table.
 *
 * The reader walks the body once, in place: strings are copied only when
 * asked, numbers go straight into float arrays (attnd_jin_f32_row), nothing is
 * allocated per value. Strict RFC 8259: UTF-8, no comments, no trailing
 * commas, no NaN. Its cursor is private to jsonin.c; nesting depth is
 * counted in one place (attnd_jin_open, attnd_jin_next) and refused past
 * JIN_MAX_DEPTH. Every failure leaves one sentence (attnd_jin_error) with the
 * byte offset. The field table that attnd_jin_object walks: above jfield.
 */
#ifndef ATTND_JSONIN_H
#define ATTND_JSONIN_H

#include <stddef.h>
#include <stdint.h>

#include "../../config/enums.h"
#include "../base/reply.h"

#define JIN_MAX_DEPTH 64

typedef struct jin jin; /* the reader; its fields are jsonin.c's own */

/* The kind of the next value, from its first byte. */
typedef enum {
    JT_END = 0,   /* nothing left */
    JT_OBJECT,    /* { */
    JT_ARRAY,     /* [ */
    JT_STRING,    /* " */
    JT_NUMBER,    /* - or a digit */
    JT_BOOL,      /* t or f */
    JT_NULL,      /* n */
    JT_NONFINITE, /* NaN, Infinity, -Infinity (not JSON) */
    JT_INVALID    /* anything else */
} jin_type;

/* A reader over buf[0..len), which must outlive it. NULL when out of
 * memory. */
jin *attnd_jin_new(const char *buf, size_t len);
void attnd_jin_free(jin *j); /* NULL is fine */
/* The sentence of the last failure ("body is not valid JSON: ... at byte
 * N"), "" before any. */
const char *attnd_jin_error(const jin *j);
/* Byte offset of the next unread byte; the body the reader was made on. */
size_t attnd_jin_offset(const jin *j);
const char *attnd_jin_body(const jin *j);

/* Skips whitespace; returns the next byte, or -1 at the end. */
int attnd_jin_peek(jin *j);
jin_type attnd_jin_next_type(jin *j);
/* The kind of the next value in words, for messages: "a string", "an
 * array", "a number", "an object", "a boolean", "null", "NaN", "nothing",
 * "an invalid token". */
const char *attnd_jin_kind(jin *j);
/* The text of the NaN or Infinity (any case, signed) at the cursor, at most
 * cap - 1 bytes, into buf; "" when the value is none. */
void attnd_jin_nonfinite_text(jin *j, char *buf, size_t cap);

/* Enters the array or object whose open ('[' or '{') is next: 0 when an
 * element follows, 1 when it was empty (and is left again), -1 on error
 * (not that bracket, or nested deeper than JIN_MAX_DEPTH). */
int attnd_jin_open(jin *j, char open);
/* After an element: 0 after a comma (another element follows), 1 when
 * `close` ended the container (which is left), -1 on anything else. */
int attnd_jin_next(jin *j, char close);
/* An object's key and its ':' into buf (cap bytes with the NUL); a longer
 * key is cut to fit and *cut set. */
int attnd_jin_key(jin *j, char *buf, size_t cap, int *cut);
/* Consumes c after whitespace, or fails. */
int attnd_jin_expect(jin *j, char c);

/* A string, decoded (escapes, \u surrogates) and checked as UTF-8, into a
 * new NUL-terminated buffer the caller frees. Strings holding NUL (\u0000)
 * are refused. */
int attnd_jin_string(jin *j, char **out, size_t *len);
/* A string without escapes, as a span of the body (not NUL-terminated, not
 * checked for UTF-8 or control characters: for base64 text, whose decoder
 * refuses anything else). Returns 0, 1 when the string holds escapes (the
 * reader has not moved: read it with attnd_jin_string), -1 on error. */
int attnd_jin_string_span(jin *j, const char **s, size_t *n);
/* A string into buf (cap bytes with the NUL); longer ones are cut to fit
 * and *cut is set. */
int attnd_jin_string_buf(jin *j, char *buf, size_t cap, int *cut);
/* A number, the double nearest it. */
int attnd_jin_number(jin *j, double *v);
/* A number, the float32 nearest it (+-inf past its range). */
int attnd_jin_f32(jin *j, float *v);
/* A run of finite numbers "a, b, c" into out (at most max): the rows of a
 * tensor. Stops before the comma after the last one read, or before what
 * is not one; returns how many were read. */
size_t attnd_jin_f32_row(jin *j, float *out, size_t max);
/* true/false; 0 or -1. */
int attnd_jin_bool(jin *j, int *v);
/* null */
int attnd_jin_null(jin *j);
/* Skips any value. */
int attnd_jin_skip(jin *j);
/* Only whitespace is left. */
int attnd_jin_end(jin *j);

/* ---- paths, for messages ---- */

/* Where the reader is, as a client reads it: inputs[2].shape[1]. */
typedef struct {
    char s[128]; /* NUL-terminated; cut (never overrun) past its room */
    size_t n;
} jpath;

void attnd_jpath_init(jpath *p, const char *root); /* "" for a body's top level */
/* Appends ".key" (or "key" at the top) or "[i]"; return the length before,
 * which attnd_jpath_cut restores. */
size_t attnd_jpath_key(jpath *p, const char *key);
size_t attnd_jpath_index(jpath *p, long i);
void attnd_jpath_cut(jpath *p, size_t n);

/* ---- field tables ---- */

typedef enum {
    JF_STRING,    /* a string into char[size] at offset; a longer one is refused */
    JF_STRDUP,    /* a string into a new char * at offset (the destination owns it) */
    JF_BOOL,      /* true/false into int at offset: 1 or 0 */
    JF_BOOL_NULL, /* true/false/null into int at offset: 1, 0, or -1 for null */
    JF_WORD,      /* one of the words of a table into int at offset: its value */
    JF_SIZE,      /* a whole number 0..max into int64_t at offset */
    JF_SHAPE,     /* 1..JSHAPE_MAX whole numbers, each 1..max, into jshape */
    JF_OBJECT,    /* an object, walked against table into the same destination */
    JF_LIST,      /* an array; each(...) reads every element, path "name[i]" */
    JF_CUSTOM     /* read(...) reads the value; accepts says which JSON types */
} jf_type;

#define JSHAPE_MAX 4 /* the most dimensions any tensor takes (TENSOR_MAX_RANK) */

/* A shape as the body gave it. */
typedef struct {
    int rank;                /* 1..JSHAPE_MAX */
    int64_t dim[JSHAPE_MAX]; /* each 1..max */
} jshape;

/* The field table: one jtable per kind of object (native request, v2
 * request, v2 input, tensor object, parameters, outputs) says each field's
 * name, JSON type, whether it is required, and where it lands in a
 * destination struct. attnd_jin_object walks an object against its table; it
 * alone refuses unknown keys (or skips them, where a table allows
 * extensions), keys given twice, wrong types and missing fields, and its
 * messages name the path ("inputs[2].shape[1]: ..."). Adding a field is
 * one line in a table. It does not know HTTP or what a tensor means.
 */
typedef struct jfield jfield;
typedef struct jtable jtable;
/* Reads the value (its type already checked) into dst; path names it. */
typedef int (*jf_read_fn)(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e);
/* Reads element idx of a JF_LIST (path names it). */
typedef int (*jf_each_fn)(jin *j, int idx, void *dst, jpath *path, attnd_error *e);

struct jfield {
    const char *name;
    jf_type type;
    int required;
    size_t offset;           /* where it lands in the destination struct */
    size_t size;             /* JF_STRING: the buffer's bytes */
    const attnd_enum *words; /* JF_WORD: the table of words (config/enums.h) */
    int64_t max;             /* JF_SIZE, JF_SHAPE: the largest value; past it, 413 */
    const jtable *table;     /* JF_OBJECT */
    jf_each_fn each;         /* JF_LIST */
    jf_read_fn read;         /* JF_CUSTOM */
    unsigned accepts;        /* JF_CUSTOM: bits 1 << jin_type it takes */
    const char *expects;     /* JF_CUSTOM: those types in words, for messages */
    int arg;                 /* free for read (a tensor's role) */
};

struct jtable {
    const char *what;     /* what a key is called in messages: "field", "key" */
    const jfield *fields; /* at most 32 */
    int n;
    int skip_unknown; /* 1: unknown keys are skipped (extensions); 0: refused */
    int null_absent;  /* 1: a null value of a field that takes no null is as if the field
                         were left out (what Jackson and Go write for an unset field) */
};

/* The table of an array of fields: JTABLE("field", FIELDS, 0). */
#define JTABLE(what, fields, skip_unknown)                                                         \
    { (what), (fields), (int)countof(fields), (skip_unknown), 0 }
/* The same, a null field left out (a request body's optional fields). */
#define JTABLE_NULL_ABSENT(what, fields, skip_unknown)                                             \
    { (what), (fields), (int)countof(fields), (skip_unknown), 1 }

/* Walks the object next in j against t, into dst. Refuses, naming the
 * path: anything but an object; a key not in t (unless t skips them); a
 * key given twice; a value of the wrong type; a required field missing.
 * With t->null_absent, a null where a field takes none is skipped, the
 * field not given.
 * Sets *given (bit i: t->fields[i] was there) when given is not NULL.
 * Returns 0, or -1 with e set (400; 413 for a size past its max; what a
 * read function sets). */
int attnd_jin_object(jin *j, const jtable *t, void *dst, jpath *path, unsigned *given,
                     attnd_error *e);

/* A whole number from min to max at the cursor into *out (min >= 0, max
 * below 2^53); the path names it in refusals: not a number or not whole or
 * below min (400), past max (413, "too large"). */
int attnd_jin_whole(jin *j, int64_t min, int64_t max, int64_t *out, jpath *path, attnd_error *e);

/* e = "<path>: <attnd_jin_error>" (400): a syntax error where path says. */
int attnd_jin_fail(jin *j, const jpath *path, attnd_error *e);

#endif
