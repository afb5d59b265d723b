/* tensor.c - nested-array and base64 tensors out of a request body. See
 * tensor.h. Nested arrays are read level by level, rows of numbers by the
 * reader's tight loop (attnd_jin_f32_row); a tensor object is one more field
 * table (TENSOR_OBJECT) walked by attnd_jin_object. */
#include "tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/sizes.h"
#include "base64.h"

void attnd_tensor_free(attnd_tensor *t) {
    if (!t) return;
    free(t->f);
    free(t->u);
    memset(t, 0, sizeof(*t));
}

void attnd_tensor_index_name(char *buf, size_t cap, const char *field, int rank, const int *shape,
                             size_t k) {
    size_t idx[TENSOR_MAX_RANK];
    for (int d = rank - 1; d >= 0; d--) {
        idx[d] = k % (size_t)shape[d];
        k /= (size_t)shape[d];
    }
    int n = snprintf(buf, cap, "%s", field);
    for (int d = 0; d < rank && n >= 0 && (size_t)n < cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, "[%zu]", idx[d]);
}

int attnd_tensor_size(const jshape *shape, size_t esz, const char *field, uint64_t *n,
                      uint64_t *bytes, attnd_error *e) {
    if (sz_prod(shape->dim, shape->rank, TENSOR_MAX_ELEMS, n) < 0)
        return attnd_set_error(e, AERR_TOO_LARGE, "%s.shape: too large: more than %llu elements",
                               field, (unsigned long long)TENSOR_MAX_ELEMS);
    sz_mul(*n, esz, UINT64_MAX, bytes); /* n <= 2^34, esz <= 8: cannot wrap */
    return 0;
}

/* Blocks of 64 are tested without a branch (the exponent's bits all set:
 * infinity or NaN), which the compiler vectorizes; only a block holding
 * one is searched one value at a time. Every request's input and output
 * pass through here. */
size_t attnd_first_nonfinite(const float *x, size_t n, int neg_inf_ok) {
    size_t k = 0;
    for (; k + 64 <= n; k += 64) {
        uint32_t any = 0;
        for (int i = 0; i < 64; i++) {
            uint32_t b;
            memcpy(&b, &x[k + i], sizeof b);
            any |= (b & 0x7f800000u) == 0x7f800000u;
        }
        if (!any) continue;
        for (size_t i = k; i < k + 64; i++)
            if (!isfinite(x[i]) && !(neg_inf_ok && isinf(x[i]) && x[i] < 0)) return i;
    }
    for (; k < n; k++)
        if (!isfinite(x[k]) && !(neg_inf_ok && isinf(x[k]) && x[k] < 0)) return k;
    return n;
}

int attnd_tensor_check_finite(attnd_tensor *t, const char *field, int neg_inf_ok, attnd_error *e) {
    size_t k = attnd_first_nonfinite(t->f, t->n, neg_inf_ok);
    if (k == t->n) return 0;
    char at[160];
    attnd_tensor_index_name(at, sizeof(at), field, t->rank, t->shape, k);
    float bad = t->f[k];
    attnd_tensor_free(t);
    return attnd_set_error(e, AERR_BAD_REQUEST, "%s: %s is not allowed", at,
                           isnan(bad) ? "NaN" : "infinity");
}

/* State of one nested-array read. */
typedef struct {
    jin *j;
    const char *field;
    attnd_tensor_kind kind; /* TK_ANY turns into TK_FLOAT or TK_BOOL at the first leaf */
    int max_rank;
    int rank;                       /* 0 until the first leaf fixes it */
    int shape[TENSOR_MAX_RANK + 1]; /* 0 until the first array of that depth closes */
    int idx[TENSOR_MAX_RANK + 1];   /* where we are, for messages */
    float *f;
    uint8_t *u;
    size_t n, cap;
    attnd_error *e;
} nested;

static const char *where(nested *c, int depth, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%s", c->field);
    for (int d = 0; d < depth && n >= 0 && (size_t)n < cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, "[%d]", c->idx[d]);
    return buf;
}

/* A syntax error inside the tensor, named at depth. */
static int jin_fail_at(nested *c, int depth) {
    char at[160];
    jpath p;
    attnd_jpath_init(&p, where(c, depth, at, sizeof(at)));
    return attnd_jin_fail(c->j, &p, c->e);
}

/* Doubles the room of the elements read so far (c->f or c->u). */
static int grow_elements(nested *c) {
    size_t cap = c->cap ? c->cap * 2 : 1024;
    if (c->kind == TK_BOOL) {
        uint8_t *u = realloc(c->u, cap);
        if (!u) return -1;
        c->u = u;
    } else {
        float *f = realloc(c->f, cap * sizeof(float));
        if (!f) return -1;
        c->f = f;
    }
    c->cap = cap;
    return 0;
}

static int leaf(nested *c, int depth) {
    char at[160];
    jin_type type = attnd_jin_next_type(c->j);
    int is_num = type == JT_NUMBER, is_bool = type == JT_BOOL;
    if (type == JT_NONFINITE) {
        char word[16];
        attnd_jin_nonfinite_text(c->j, word, sizeof word);
        return attnd_set_error(c->e, AERR_BAD_REQUEST,
                               "%s: %s is not a JSON number: JSON has no NaN or Infinity, and "
                               "attnd refuses non-finite numbers",
                               where(c, depth, at, sizeof(at)), word);
    }
    if (c->kind == TK_ANY) {
        if (!is_num && !is_bool)
            return attnd_set_error(c->e, AERR_BAD_REQUEST,
                                   "%s: expected booleans or numbers, got %s",
                                   where(c, depth, at, sizeof(at)), attnd_jin_kind(c->j));
        c->kind = is_bool ? TK_BOOL : TK_FLOAT;
    }
    if (c->n == c->cap && grow_elements(c) < 0)
        return attnd_set_error(c->e, AERR_INTERNAL, "out of memory reading %s", c->field);
    if (c->kind == TK_BOOL) {
        int v;
        if (!is_bool)
            return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: not a boolean (got %s)",
                                   where(c, depth, at, sizeof(at)), attnd_jin_kind(c->j));
        if (attnd_jin_bool(c->j, &v) < 0) return jin_fail_at(c, depth);
        c->u[c->n++] = (uint8_t)v;
        return 0;
    }
    float f;
    if (!is_num)
        return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: not a number (got %s)",
                               where(c, depth, at, sizeof(at)), attnd_jin_kind(c->j));
    if (attnd_jin_f32(c->j, &f) < 0) return jin_fail_at(c, depth);
    if (!isfinite(f))
        return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: number out of float32 range",
                               where(c, depth, at, sizeof(at)));
    c->f[c->n++] = f;
    return 0;
}

/* The common case, a row of numbers at the known innermost depth, read by
 * the reader's tight loop. Returns 1 when the row closed, 0 to let the
 * general loop go on at element *count (something other than a number is
 * next, or the row is longer than the first), -1 on error. */
static int fast_row(nested *c, int depth, int *count) {
    jin *j = c->j;
    for (;;) {
        if (c->n == c->cap && grow_elements(c) < 0)
            return attnd_set_error(c->e, AERR_INTERNAL, "out of memory reading %s", c->field);
        size_t max = c->cap - c->n;
        if (c->shape[depth] && (size_t)(c->shape[depth] - *count) < max)
            max = (size_t)(c->shape[depth] - *count);
        if ((size_t)(TENSOR_MAX_DIM - *count) < max) /* past it, the general loop refuses */
            max = (size_t)(TENSOR_MAX_DIM - *count);
        size_t got = attnd_jin_f32_row(j, c->f + c->n, max);
        c->n += got;
        *count += (int)got;
        if (!got) return 0;
        int r = attnd_jin_next(j, ']');
        if (r < 0) return jin_fail_at(c, depth);
        if (r == 1) return 1;
        /* a full row (longer than the first), or no number next: the
         * general loop reads on and names what it finds */
        if (got < max || (c->shape[depth] && *count >= c->shape[depth])) return 0;
    }
}

/* An array at depth closed after count elements: the first of its depth
 * sets the length, the others must have it (else "ragged"). */
static int closed_with(nested *c, int depth, int count) {
    if (!c->shape[depth]) {
        c->shape[depth] = count;
        return 0;
    }
    if (c->shape[depth] == count) return 0;
    char at[160], first[160];
    int n = snprintf(first, sizeof(first), "%s", c->field);
    for (int d = 0; d < depth && n >= 0 && (size_t)n < sizeof(first); d++)
        n += snprintf(first + n, sizeof(first) - (size_t)n, "[0]");
    where(c, depth, at, sizeof(at));
    if (count > c->shape[depth])
        return attnd_set_error(c->e, AERR_BAD_REQUEST,
                               "%s: ragged: more than %d elements where %s has %d", at,
                               c->shape[depth], first, c->shape[depth]);
    return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: ragged: %d elements where %s has %d", at,
                           count, first, c->shape[depth]);
}

/* Reads one array at depth (its '[' is next). */
static int level(nested *c, int depth) {
    char at[160];
    if (depth >= c->max_rank)
        return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: more than %d dimensions", c->field,
                               c->max_rank);
    int r = attnd_jin_open(c->j, '[');
    if (r < 0) return jin_fail_at(c, depth);
    if (r == 1)
        return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: empty",
                               where(c, depth, at, sizeof(at)));
    int count = 0;
    if (c->kind == TK_FLOAT && c->rank == depth + 1) {
        r = fast_row(c, depth, &count);
        if (r < 0) return -1;
        if (r == 1) goto closed;
    }
    for (;;) {
        if (count >= TENSOR_MAX_DIM) /* a body over 2 GB could hold more than an int counts */
            return attnd_set_error(c->e, AERR_TOO_LARGE, "%s: more than %d elements",
                                   where(c, depth, at, sizeof(at)), TENSOR_MAX_DIM);
        c->idx[depth] = count;
        jin_type type = attnd_jin_next_type(c->j);
        if (type == JT_ARRAY) {
            if (c->rank && depth + 1 >= c->rank)
                return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: expected %s, got an array",
                                       where(c, depth + 1, at, sizeof(at)),
                                       c->kind == TK_BOOL ? "a boolean" : "a number");
            if (level(c, depth + 1) < 0) return -1;
        } else {
            if (!c->rank) c->rank = depth + 1;
            if (depth + 1 != c->rank)
                return attnd_set_error(
                    c->e, AERR_BAD_REQUEST, "%s: expected an array of %d, got %s",
                    where(c, depth + 1, at, sizeof(at)),
                    c->shape[depth + 1 < c->rank ? depth + 1 : 0], attnd_jin_kind(c->j));
            if (leaf(c, depth + 1) < 0) return -1;
        }
        count++;
        if (c->shape[depth] && count > c->shape[depth]) break;
        r = attnd_jin_next(c->j, ']');
        if (r < 0) return jin_fail_at(c, depth + 1);
        if (r == 1) break;
    }
closed:
    return closed_with(c, depth, count);
}

static int read_nested(jin *j, const char *field, attnd_tensor_kind kind, int max_rank,
                       attnd_tensor *t, attnd_error *e) {
    nested c;
    memset(&c, 0, sizeof(c));
    c.j = j;
    c.field = field;
    c.kind = kind;
    c.max_rank = max_rank;
    c.e = e;
    if (level(&c, 0) < 0) goto fail;
    t->rank = c.rank;
    for (int d = 0; d < c.rank; d++)
        t->shape[d] = c.shape[d];
    t->n = c.n;
    t->is_bool = c.kind == TK_BOOL;
    t->f = c.f;
    t->u = c.u;
    return 0;
fail:
    free(c.f);
    free(c.u);
    return -1;
}

/* ---- tensor objects: {"shape": [...], "dtype": "float32"|"bool", "b64": "..."} ---- */

typedef struct {
    jshape shape;
    int dtype;        /* a DTYPE_* of DTYPES */
    const char *text; /* the base64 text: a span of the body, or copy */
    size_t len;
    char *copy; /* the decoded string, when it held escapes; owned */
} tensor_object;

enum { DTYPE_FLOAT32 = 0, DTYPE_BOOL = 1 };
static const attnd_enum_row DTYPE_WORDS[] = {{"float32", DTYPE_FLOAT32}, {"bool", DTYPE_BOOL}};
static const attnd_enum DTYPES = ATTND_ENUM(DTYPE_WORDS);

static int read_b64_text(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e) {
    (void)f;
    tensor_object *o = dst;
    int rs = attnd_jin_string_span(j, &o->text, &o->len);
    if (rs == 1) { /* escapes: decode a copy */
        rs = attnd_jin_string(j, &o->copy, &o->len);
        o->text = o->copy;
    }
    return rs < 0 ? attnd_jin_fail(j, path, e) : 0;
}

static const jfield TENSOR_OBJECT_FIELDS[] = {
    {.name = "shape",
     .type = JF_SHAPE,
     .required = 1,
     .offset = offsetof(tensor_object, shape),
     .max = TENSOR_MAX_DIM},
    {.name = "dtype", .type = JF_WORD, .offset = offsetof(tensor_object, dtype), .words = &DTYPES},
    {.name = "b64",
     .type = JF_CUSTOM,
     .required = 1,
     .read = read_b64_text,
     .accepts = 1u << JT_STRING,
     .expects = "a base64 string"},
};
static const jtable TENSOR_OBJECT = JTABLE("key of a tensor object", TENSOR_OBJECT_FIELDS, 0);

/* The object's base64 decoded into buf (cap bytes): exactly need bytes,
 * or -1 with e set. */
static int decode_b64(const tensor_object *o, const char *field, void *buf, size_t cap,
                      uint64_t need, attnd_error *e) {
    size_t got = 0;
    /* line breaks come as \n escapes, so only a decoded copy can hold them */
    if (attnd_b64_decode(o->text, o->len, buf, cap, &got, o->copy != NULL) < 0) {
        char why[200];
        attnd_b64_explain(o->text, o->len, o->copy != NULL, why, sizeof(why));
        return attnd_set_error(e, AERR_BAD_REQUEST, "%s.b64: %s", field, why);
    }
    if (got != need)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s.b64: %zu bytes where shape and dtype need %llu", field, got,
                               (unsigned long long)need);
    return 0;
}

/* Decodes the object's base64 into t, checking it against shape and dtype. */
static int decode_object(const tensor_object *o, const char *field, int neg_inf_ok, attnd_tensor *t,
                         attnd_error *e) {
    int is_bool = o->dtype == DTYPE_BOOL, rank = o->shape.rank, rc = -1;
    uint64_t n, need;
    void *buf = NULL;
    if (attnd_tensor_size(&o->shape, is_bool ? 1 : sizeof(float), field, &n, &need, e) < 0)
        return -1;
    size_t cap = attnd_b64_decoded_max(o->len);
    if (need > cap)
        return attnd_set_error(e, AERR_BAD_REQUEST,
                               "%s.b64: %zu characters cannot hold the %llu bytes shape and dtype "
                               "need",
                               field, o->len, (unsigned long long)need);
    if (!(buf = malloc(cap ? cap : 1)))
        return attnd_set_error(e, AERR_INTERNAL, "out of memory reading %s", field);
    if (decode_b64(o, field, buf, cap, need, e) < 0) goto cleanup;
    memset(t, 0, sizeof(*t));
    t->rank = rank;
    t->shaped = 1;
    for (int d = 0; d < rank; d++)
        t->shape[d] = (int)o->shape.dim[d];
    t->n = (size_t)n;
    t->is_bool = is_bool;
    if (is_bool) {
        t->u = buf;
        for (size_t k = 0; k < t->n; k++)
            t->u[k] = t->u[k] != 0;
        rc = 0;
    } else {
        t->f = buf;
        rc = attnd_tensor_check_finite(t, field, neg_inf_ok, e);
    }
    buf = NULL; /* t's now */
cleanup:
    free(buf);
    return rc;
}

static int read_object(jin *j, const char *field, attnd_tensor_kind kind, int max_rank,
                       int neg_inf_ok, attnd_tensor *t, attnd_error *e) {
    tensor_object o;
    memset(&o, 0, sizeof(o));
    jpath path;
    attnd_jpath_init(&path, field);
    int ret = -1;
    if (attnd_jin_object(j, &TENSOR_OBJECT, &o, &path, NULL, e) < 0) goto cleanup;
    if (kind == TK_FLOAT && o.dtype == DTYPE_BOOL) {
        attnd_set_error(e, AERR_BAD_REQUEST, "%s.dtype: must be \"float32\"", field);
        goto cleanup;
    }
    if (kind == TK_BOOL && o.dtype != DTYPE_BOOL) {
        attnd_set_error(e, AERR_BAD_REQUEST, "%s.dtype: must be \"bool\"", field);
        goto cleanup;
    }
    if (o.shape.rank > max_rank) {
        attnd_set_error(e, AERR_BAD_REQUEST, "%s.shape: more than %d dimensions", field, max_rank);
        goto cleanup;
    }
    ret = decode_object(&o, field, neg_inf_ok, t, e);
cleanup:
    free(o.copy);
    return ret;
}

int attnd_tensor_read(jin *j, const char *field, attnd_tensor_kind kind, int max_rank,
                      int neg_inf_ok, attnd_tensor *t, attnd_error *e) {
    memset(t, 0, sizeof(*t));
    jin_type type = attnd_jin_next_type(j);
    if (type == JT_ARRAY) return read_nested(j, field, kind, max_rank, t, e);
    if (type == JT_OBJECT) return read_object(j, field, kind, max_rank, neg_inf_ok, t, e);
    return attnd_set_error(e, AERR_BAD_REQUEST,
                           "%s: expected nested arrays or a tensor object, got %s", field,
                           attnd_jin_kind(j));
}
