/* jsonin.c - the pull reader for request bodies and the field-table walk.
 * See jsonin.h. */
#include "jsonin.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../base/utf8.h"
#include "floattext.h"

struct jin {
    const char *start; /* first byte of the body */
    const char *p;     /* next unread byte */
    const char *end;   /* one past the last byte */
    int depth;         /* arrays and objects open */
    char err[192];     /* the last failure's sentence */
};

static int fail(jin *j, const char *what) {
    snprintf(j->err, sizeof(j->err), "body is not valid JSON: %s at byte %zu", what,
             attnd_jin_offset(j));
    return -1;
}

jin *attnd_jin_new(const char *buf, size_t len) {
    jin *j = calloc(1, sizeof(*j));
    if (!j) return NULL;
    j->start = j->p = buf ? buf : "";
    j->end = j->start + (buf ? len : 0);
    return j;
}

void attnd_jin_free(jin *j) {
    free(j);
}

const char *attnd_jin_error(const jin *j) {
    return j->err;
}

size_t attnd_jin_offset(const jin *j) {
    return (size_t)(j->p - j->start);
}

const char *attnd_jin_body(const jin *j) {
    return j->start;
}

int attnd_jin_peek(jin *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t'))
        j->p++;
    return j->p < j->end ? (unsigned char)*j->p : -1;
}

/* The length of a NaN or infinity token at p ("NaN", "-Infinity", "inf",
 * any case), or 0. */
static size_t nonfinite_len(const char *p, const char *end) {
    const char *q = p + (p < end && *p == '-');
    static const char *const words[] = {"infinity", "nan", "inf"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(end - q) >= n && strncasecmp(q, words[i], n) == 0) return (size_t)(q - p) + n;
    }
    return 0;
}

jin_type attnd_jin_next_type(jin *j) {
    int c = attnd_jin_peek(j);
    switch (c) {
    case -1:
        return JT_END;
    case '{':
        return JT_OBJECT;
    case '[':
        return JT_ARRAY;
    case '"':
        return JT_STRING;
    case 't':
    case 'f':
        return JT_BOOL;
    case 'n':
        return nonfinite_len(j->p, j->end) ? JT_NONFINITE : JT_NULL;
    default:
        if (nonfinite_len(j->p, j->end)) return JT_NONFINITE;
        return c == '-' || (c >= '0' && c <= '9') ? JT_NUMBER : JT_INVALID;
    }
}

const char *attnd_jin_kind(jin *j) {
    static const char *const words[] = {"nothing",  "an object", "an array",
                                        "a string", "a number",  "a boolean",
                                        "null",     "NaN",       "an invalid token"};
    return words[attnd_jin_next_type(j)];
}

void attnd_jin_nonfinite_text(jin *j, char *buf, size_t cap) {
    attnd_jin_peek(j);
    snprintf(buf, cap, "%.*s", (int)nonfinite_len(j->p, j->end), j->p);
}

/* Fails on a NaN or infinity token at the cursor, saying why. */
static int fail_nonfinite(jin *j) {
    size_t n = nonfinite_len(j->p, j->end);
    snprintf(j->err, sizeof(j->err),
             "body is not valid JSON: %.*s at byte %zu: JSON has no NaN or Infinity, and attnd "
             "refuses non-finite numbers",
             (int)n, j->p, attnd_jin_offset(j));
    return -1;
}

int attnd_jin_expect(jin *j, char c) {
    if (attnd_jin_peek(j) != (unsigned char)c) {
        char what[32];
        snprintf(what, sizeof(what), "expected '%c'", c);
        return fail(j, what);
    }
    j->p++;
    return 0;
}

int attnd_jin_open(jin *j, char open) {
    if (attnd_jin_expect(j, open) < 0) return -1;
    if (j->depth >= JIN_MAX_DEPTH) {
        j->p--;
        char what[64];
        snprintf(what, sizeof(what), "nested deeper than %d levels", JIN_MAX_DEPTH);
        return fail(j, what);
    }
    j->depth++;
    if (attnd_jin_peek(j) == (open == '[' ? ']' : '}')) {
        j->p++;
        j->depth--;
        return 1;
    }
    return 0;
}

int attnd_jin_next(jin *j, char close) {
    int c = attnd_jin_peek(j);
    if (c == ',') {
        j->p++;
        return 0;
    }
    if (c == (unsigned char)close) {
        j->p++;
        j->depth--;
        return 1;
    }
    char what[32];
    snprintf(what, sizeof(what), "expected ',' or '%c'", close);
    return fail(j, what);
}

static int hex4(const char *s, unsigned *v) {
    unsigned r = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        r <<= 4;
        if (c >= '0' && c <= '9')
            r |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            r |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            r |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *v = r;
    return 0;
}

/* Where decode_string writes: out, cap bytes with the NUL, or nowhere
 * (out NULL: the string is only checked and skipped). */
typedef struct {
    char *out;
    size_t cap, k; /* room, bytes written */
    int *cut;      /* set when something did not fit; may be NULL */
} strout;

/* Appends n bytes of plain ASCII, as many as fit. */
static void put_run(strout *o, const char *s, size_t n) {
    if (!o->out || !n) return;
    if (o->k + n < o->cap) {
        memcpy(o->out + o->k, s, n);
        o->k += n;
        return;
    }
    size_t fit = o->cap > o->k + 1 ? o->cap - o->k - 1 : 0;
    memcpy(o->out + o->k, s, fit);
    o->k += fit;
    if (o->cut) *o->cut = 1;
}

/* Appends one character's n bytes, whole or not at all. */
static void put_char(strout *o, const char *s, size_t n) {
    if (!o->out) return;
    if (o->k + n < o->cap) {
        memcpy(o->out + o->k, s, n);
        o->k += n;
    } else if (o->cut) {
        *o->cut = 1;
    }
}

/* The code point of a \u escape at j->p (past the "\u"), a surrogate pair
 * joined, into tmp as UTF-8; returns its bytes or -1. */
static long read_u_escape(jin *j, char *tmp) {
    unsigned cp, lo;
    if (j->end - j->p < 4 || hex4(j->p, &cp) < 0) return fail(j, "bad \\u escape");
    j->p += 4;
    if (cp >= 0xd800 && cp <= 0xdbff) {
        if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || hex4(j->p + 2, &lo) < 0 ||
            lo < 0xdc00 || lo > 0xdfff)
            return fail(j, "unpaired surrogate in \\u escape");
        j->p += 6;
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    } else if (cp >= 0xdc00 && cp <= 0xdfff) {
        return fail(j, "unpaired surrogate in \\u escape");
    }
    if (cp == 0) return fail(j, "\\u0000 in string");
    return (long)attnd_utf8_put(tmp, cp);
}

/* The escape at j->p (its backslash) into tmp; returns its bytes or -1. */
static long read_escape(jin *j, char *tmp) {
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    if (j->end - j->p < 2) return fail(j, "unterminated string");
    char e = j->p[1];
    j->p += 2;
    if (e == 'u') return read_u_escape(j, tmp);
    const char *at = e ? strchr(from, e) : NULL;
    if (!at) return fail(j, "bad escape in string");
    tmp[0] = to[at - from];
    return 1;
}

/* Decodes the string at j->p into out (which has room for the raw length,
 * the decoded text is never longer). Returns decoded length or -1. */
static long decode_string(jin *j, char *out, size_t cap, int *cut) {
    strout o = {out, cap, 0, cut};
    if (attnd_jin_expect(j, '"') < 0) return -1;
    for (;;) {
        /* fast path: a run of plain ASCII (base64 text is all of it) */
        const char *run = j->p;
        while (j->p < j->end) {
            unsigned char a = (unsigned char)*j->p;
            if (a < 0x20 || a >= 0x80 || a == '"' || a == '\\') break;
            j->p++;
        }
        put_run(&o, run, (size_t)(j->p - run));
        if (j->p >= j->end) return fail(j, "unterminated string");
        unsigned char c = (unsigned char)*j->p;
        if (c == '"') {
            j->p++;
            break;
        }
        if (c < 0x20) return fail(j, "control character in string");
        char tmp[4];
        long tn;
        if (c == '\\') {
            tn = read_escape(j, tmp);
        } else { /* one UTF-8 sequence */
            tn = (long)attnd_utf8_seq_len((const unsigned char *)j->p,
                                          (const unsigned char *)j->end);
            if (!tn) return fail(j, "invalid UTF-8 in string");
            memcpy(tmp, j->p, (size_t)tn);
            j->p += tn;
        }
        if (tn < 0) return -1;
        put_char(&o, tmp, (size_t)tn);
    }
    if (out) out[o.k] = '\0';
    return (long)o.k;
}

int attnd_jin_string(jin *j, char **out, size_t *len) {
    *out = NULL;
    if (attnd_jin_peek(j) != '"') return fail(j, "expected a string");
    /* the raw length bounds the decoded one */
    const char *q = j->p + 1;
    while (q < j->end && *q != '"')
        q += (*q == '\\' && q + 1 < j->end) ? 2 : 1;
    size_t raw = (size_t)(q - j->p);
    char *buf = malloc(raw + 1);
    if (!buf) return fail(j, "out of memory");
    long n = decode_string(j, buf, raw + 1, NULL);
    if (n < 0) {
        free(buf);
        return -1;
    }
    *out = buf;
    if (len) *len = (size_t)n;
    return 0;
}

int attnd_jin_string_span(jin *j, const char **s, size_t *n) {
    if (attnd_jin_peek(j) != '"') return fail(j, "expected a string");
    const char *start = j->p + 1;
    const char *q = memchr(start, '"', (size_t)(j->end - start));
    if (!q) return fail(j, "unterminated string");
    if (memchr(start, '\\', (size_t)(q - start))) return 1;
    *s = start;
    *n = (size_t)(q - start);
    j->p = q + 1;
    return 0;
}

int attnd_jin_string_buf(jin *j, char *buf, size_t cap, int *cut) {
    if (cut) *cut = 0;
    int dummy = 0;
    return decode_string(j, buf, cap, cut ? cut : &dummy) < 0 ? -1 : 0;
}

int attnd_jin_key(jin *j, char *buf, size_t cap, int *cut) {
    if (attnd_jin_peek(j) != '"') return fail(j, "expected a key (a string)");
    if (attnd_jin_string_buf(j, buf, cap, cut) < 0) return -1;
    return attnd_jin_expect(j, ':');
}

static int number_start(jin *j) {
    int c = attnd_jin_peek(j);
    if (c != '-' && (c < '0' || c > '9')) return fail(j, "expected a number");
    return 0;
}

int attnd_jin_number(jin *j, double *v) {
    if (number_start(j) < 0) return -1;
    size_t n = attnd_parse_number(j->p, (size_t)(j->end - j->p), v);
    if (!n) return nonfinite_len(j->p, j->end) ? fail_nonfinite(j) : fail(j, "bad number");
    j->p += n;
    return 0;
}

int attnd_jin_f32(jin *j, float *v) {
    if (number_start(j) < 0) return -1;
    size_t n = attnd_parse_f32(j->p, (size_t)(j->end - j->p), v);
    if (!n) return nonfinite_len(j->p, j->end) ? fail_nonfinite(j) : fail(j, "bad number");
    j->p += n;
    return 0;
}

size_t attnd_jin_f32_row(jin *j, float *out, size_t max) {
    size_t got = 0;
    j->p += attnd_parse_f32_row(j->p, (size_t)(j->end - j->p), out, max, &got);
    return got;
}

static int literal(jin *j, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0) return -1;
    j->p += n;
    return 0;
}

int attnd_jin_bool(jin *j, int *v) {
    int c = attnd_jin_peek(j);
    if (c == 't' && literal(j, "true") == 0) {
        *v = 1;
        return 0;
    }
    if (c == 'f' && literal(j, "false") == 0) {
        *v = 0;
        return 0;
    }
    return fail(j, "expected true or false");
}

int attnd_jin_null(jin *j) {
    if (attnd_jin_peek(j) == 'n' && literal(j, "null") == 0) return 0;
    return fail(j, "expected null");
}

int attnd_jin_skip(jin *j) {
    int b;
    double d;
    switch (attnd_jin_next_type(j)) {
    case JT_STRING:
        return decode_string(j, NULL, 0, NULL) < 0 ? -1 : 0;
    case JT_BOOL:
        return attnd_jin_bool(j, &b);
    case JT_NULL:
        return attnd_jin_null(j);
    case JT_NUMBER:
        return attnd_jin_number(j, &d);
    case JT_ARRAY:
    case JT_OBJECT: {
        char open = (char)*j->p, close = open == '[' ? ']' : '}';
        int r = attnd_jin_open(j, open);
        while (r == 0) {
            if (close == '}' &&
                (decode_string(j, NULL, 0, NULL) < 0 || attnd_jin_expect(j, ':') < 0))
                return -1;
            if (attnd_jin_skip(j) < 0) return -1;
            r = attnd_jin_next(j, close);
        }
        return r < 0 ? -1 : 0;
    }
    case JT_NONFINITE:
        return fail_nonfinite(j);
    case JT_END:
        return fail(j, "unexpected end");
    default:
        return fail(j, "unexpected character");
    }
}

int attnd_jin_end(jin *j) {
    if (attnd_jin_peek(j) != -1) return fail(j, "trailing characters");
    return 0;
}

/* ---- paths ---- */

void attnd_jpath_init(jpath *p, const char *root) {
    p->n = 0;
    p->s[0] = '\0';
    int k = snprintf(p->s, sizeof(p->s), "%s", root);
    p->n = k < 0 ? 0 : (size_t)k < sizeof(p->s) ? (size_t)k : sizeof(p->s) - 1;
}

static size_t jpath_add(jpath *p, const char *fmt, const char *key, long i) {
    size_t before = p->n;
    int k = key ? snprintf(p->s + p->n, sizeof(p->s) - p->n, fmt, key)
                : snprintf(p->s + p->n, sizeof(p->s) - p->n, fmt, i);
    if (k > 0) p->n += (size_t)k < sizeof(p->s) - p->n ? (size_t)k : sizeof(p->s) - 1 - p->n;
    return before;
}

size_t attnd_jpath_key(jpath *p, const char *key) {
    return jpath_add(p, p->n ? ".%s" : "%s", key, 0);
}

size_t attnd_jpath_index(jpath *p, long i) {
    return jpath_add(p, "[%ld]", NULL, i);
}

void attnd_jpath_cut(jpath *p, size_t n) {
    if (n < p->n) {
        p->n = n;
        p->s[n] = '\0';
    }
}

int attnd_jin_fail(jin *j, const jpath *path, attnd_error *e) {
    if (path && path->n) return attnd_set_error(e, AERR_BAD_REQUEST, "%s: %s", path->s, j->err);
    return attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
}

/* ---- field tables ---- */

/* The JSON types a field takes, and how messages say them. */
static unsigned accepts(const jfield *f) {
    switch (f->type) {
    case JF_STRING:
    case JF_STRDUP:
    case JF_WORD:
        return 1u << JT_STRING;
    case JF_BOOL:
        return 1u << JT_BOOL;
    case JF_BOOL_NULL:
        return 1u << JT_BOOL | 1u << JT_NULL;
    case JF_SIZE:
        return 1u << JT_NUMBER;
    case JF_SHAPE:
    case JF_LIST:
        return 1u << JT_ARRAY;
    case JF_OBJECT:
        return 1u << JT_OBJECT;
    case JF_CUSTOM:
        return f->accepts;
    }
    return 0;
}

static void expects(const jfield *f, char *buf, size_t cap) {
    switch (f->type) {
    case JF_STRING:
    case JF_STRDUP:
        snprintf(buf, cap, "a string");
        return;
    case JF_BOOL:
        snprintf(buf, cap, "true or false");
        return;
    case JF_BOOL_NULL:
        snprintf(buf, cap, "true, false or null");
        return;
    case JF_SIZE:
        snprintf(buf, cap, "a size (a whole number)");
        return;
    case JF_SHAPE:
        snprintf(buf, cap, "an array of sizes");
        return;
    case JF_LIST:
        snprintf(buf, cap, "an array");
        return;
    case JF_OBJECT:
        snprintf(buf, cap, "an object");
        return;
    case JF_CUSTOM:
        snprintf(buf, cap, "%s", f->expects);
        return;
    case JF_WORD:
        break;
    }
    char words[160];
    snprintf(buf, cap, "one of %s", attnd_enum_list(f->words, ", ", words, sizeof words));
}

/* The text of the number at the cursor, for messages (at most 24 bytes). */
static void number_text(jin *j, char *buf, size_t cap) {
    attnd_jin_peek(j);
    const char *q = j->p;
    while (q < j->end && (size_t)(q - j->p) < cap - 1 && strchr("+-.eE0123456789", *q))
        q++;
    snprintf(buf, cap, "%.*s", (int)(q - j->p), j->p);
}

int attnd_jin_whole(jin *j, int64_t min, int64_t max, int64_t *out, jpath *path, attnd_error *e) {
    char text[32];
    double d;
    if (attnd_jin_next_type(j) != JT_NUMBER) {
        if (attnd_jin_next_type(j) == JT_NONFINITE) {
            fail_nonfinite(j);
            return attnd_jin_fail(j, path, e);
        }
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: expected a whole number, got %s", path->s,
                               attnd_jin_kind(j));
    }
    number_text(j, text, sizeof(text));
    if (attnd_jin_number(j, &d) < 0) return attnd_jin_fail(j, path, e);
    if (d != floor(d) || d < (double)min)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: expected a whole number of at least %lld, got %s", path->s,
                               (long long)min, text);
    if (d > (double)max)
        return attnd_set_error(e, AERR_TOO_LARGE, "%s: %s is too large (at most %lld)", path->s,
                               text, (long long)max);
    *out = (int64_t)d;
    return 0;
}

static int read_shape(jin *j, const jfield *f, jshape *s, jpath *path, attnd_error *e) {
    s->rank = 0;
    int r = attnd_jin_open(j, '[');
    if (r < 0) return attnd_jin_fail(j, path, e);
    if (r == 1)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: empty (a tensor has 1 or more dimensions)",
                               path->s);
    while (r == 0) {
        if (s->rank == JSHAPE_MAX)
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s: more than %d dimensions", path->s,
                                   JSHAPE_MAX);
        size_t mark = attnd_jpath_index(path, s->rank);
        if (attnd_jin_whole(j, 1, f->max, &s->dim[s->rank], path, e) < 0) return -1;
        attnd_jpath_cut(path, mark);
        s->rank++;
        r = attnd_jin_next(j, ']');
        if (r < 0) return attnd_jin_fail(j, path, e);
    }
    return 0;
}

static int read_list(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e) {
    int r = attnd_jin_open(j, '[');
    if (r < 0) return attnd_jin_fail(j, path, e);
    for (int idx = 0; r == 0; idx++) {
        size_t mark = attnd_jpath_index(path, idx);
        if (f->each(j, idx, dst, path, e) < 0) return -1;
        attnd_jpath_cut(path, mark);
        r = attnd_jin_next(j, ']');
        if (r < 0) return attnd_jin_fail(j, path, e);
    }
    return 0;
}

/* The refusal of a value whose JSON type f does not take. */
static int wrong_type(jin *j, const jfield *f, jin_type type, jpath *path, attnd_error *e) {
    char want[160];
    expects(f, want, sizeof(want));
    if (type == JT_NONFINITE)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s: expected %s, got NaN: JSON has no NaN or Infinity, and "
                               "attnd refuses non-finite numbers",
                               path->s, want);
    return attnd_set_error(e, AERR_BAD_REQUEST, "%s: expected %s, got %s", path->s, want,
                           attnd_jin_kind(j));
}

/* JF_STRING: into char[f->size] at `at`; a longer one is refused. */
static int read_string_field(jin *j, const jfield *f, char *at, jpath *path, attnd_error *e) {
    int cut = 0;
    if (attnd_jin_string_buf(j, at, f->size, &cut) < 0) return attnd_jin_fail(j, path, e);
    if (cut)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: longer than %zu bytes", path->s,
                               f->size - 1);
    return 0;
}

/* JF_BOOL, JF_BOOL_NULL: 1, 0, or -1 for null, into the int at `at`. */
static int read_bool_field(jin *j, jin_type type, int *at, jpath *path, attnd_error *e) {
    int b;
    if (type == JT_NULL) {
        if (attnd_jin_null(j) < 0) return attnd_jin_fail(j, path, e);
        *at = -1;
        return 0;
    }
    if (attnd_jin_bool(j, &b) < 0) return attnd_jin_fail(j, path, e);
    *at = b;
    return 0;
}

/* JF_WORD: the value of one of f->words into the int at `at`. */
static int read_word(jin *j, const jfield *f, int *at, jpath *path, attnd_error *e) {
    char word[32];
    int cut = 0;
    if (attnd_jin_string_buf(j, word, sizeof(word), &cut) < 0) return attnd_jin_fail(j, path, e);
    if (!cut && attnd_enum_value(f->words, word, at) == 0) return 0;
    char want[160];
    expects(f, want, sizeof(want));
    return attnd_set_error(e, AERR_BAD_REQUEST, "%s: expected %s, got \"%s%s\"", path->s, want,
                           word, cut ? "..." : "");
}

/* One field's value, of a type f takes, into dst. */
static int read_field(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e) {
    char *at = (char *)dst + f->offset;
    jin_type type = attnd_jin_next_type(j);
    if (!(accepts(f) & 1u << type)) return wrong_type(j, f, type, path, e);
    switch (f->type) {
    case JF_STRING:
        return read_string_field(j, f, at, path, e);
    case JF_STRDUP:
        free(*(char **)at);
        *(char **)at = NULL;
        return attnd_jin_string(j, (char **)at, NULL) < 0 ? attnd_jin_fail(j, path, e) : 0;
    case JF_BOOL:
    case JF_BOOL_NULL:
        return read_bool_field(j, type, (int *)at, path, e);
    case JF_WORD:
        return read_word(j, f, (int *)at, path, e);
    case JF_SIZE:
        return attnd_jin_whole(j, 0, f->max, (int64_t *)at, path, e);
    case JF_SHAPE:
        return read_shape(j, f, (jshape *)at, path, e);
    case JF_OBJECT:
        return attnd_jin_object(j, f->table, dst, path, NULL, e);
    case JF_LIST:
        return read_list(j, f, dst, path, e);
    case JF_CUSTOM:
        return f->read(j, f, dst, path, e);
    }
    return attnd_set_error(e, AERR_INTERNAL, "%s: no reader for this field", path->s);
}

static int find_field(const jtable *t, const char *key) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->fields[i].name, key) == 0) return i;
    return -1;
}

static int unknown_key(const jtable *t, jpath *path, attnd_error *e) {
    char names[200];
    size_t n = 0;
    names[0] = '\0';
    for (int i = 0; i < t->n && n < sizeof(names); i++)
        n += (size_t)snprintf(names + n, sizeof(names) - n, "%s%s", i ? ", " : "",
                              t->fields[i].name);
    return attnd_set_error(e, AERR_BAD_REQUEST, "%s: unknown %s (%s)", path->s, t->what, names);
}

int attnd_jin_object(jin *j, const jtable *t, void *dst, jpath *path, unsigned *given,
                     attnd_error *e) {
    unsigned seen = 0, keys = 0; /* fields given; keys met, null ones too */
    if (attnd_jin_next_type(j) != JT_OBJECT)
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s: expected an object, got %s",
                               path->n ? path->s : "body", attnd_jin_kind(j));
    int r = attnd_jin_open(j, '{');
    if (r < 0) return attnd_jin_fail(j, path, e);
    while (r == 0) {
        char key[64];
        int cut = 0;
        if (attnd_jin_key(j, key, sizeof(key), &cut) < 0) return attnd_jin_fail(j, path, e);
        if (cut) memcpy(key + sizeof(key) - 4, "...", 4);
        size_t mark = attnd_jpath_key(path, key);
        int fi = cut ? -1 : find_field(t, key);
        if (fi < 0) {
            if (!t->skip_unknown) return unknown_key(t, path, e);
            if (attnd_jin_skip(j) < 0) return attnd_jin_fail(j, path, e);
        } else {
            if (keys & 1u << fi)
                return attnd_set_error(e, AERR_BAD_REQUEST, "%s: given twice", path->s);
            keys |= 1u << fi;
            if (t->null_absent && attnd_jin_next_type(j) == JT_NULL &&
                !(accepts(&t->fields[fi]) & 1u << JT_NULL)) {
                if (attnd_jin_skip(j) < 0) return attnd_jin_fail(j, path, e); /* left out */
            } else {
                seen |= 1u << fi;
                if (read_field(j, &t->fields[fi], dst, path, e) < 0) return -1;
            }
        }
        attnd_jpath_cut(path, mark);
        r = attnd_jin_next(j, '}');
        if (r < 0) return attnd_jin_fail(j, path, e);
    }
    for (int i = 0; i < t->n; i++)
        if (t->fields[i].required && !(seen & 1u << i)) {
            attnd_jpath_key(path, t->fields[i].name);
            return attnd_set_error(e, AERR_BAD_REQUEST, "%s: required", path->s);
        }
    if (given) *given = seen;
    return 0;
}
