/* tensor.c - nested-array and base64 tensors out of a request body. See
 * tensor.h. */
#include "tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/sizes.h"
#include "codec.h"

void tensor_free(tensor *t) {
    if (!t) return;
    free(t->f);
    free(t->u);
    memset(t, 0, sizeof(*t));
}

void tensor_index_name(char *buf, size_t cap, const char *field, int rank, const int *shape,
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

/* State of one nested-array read. */
typedef struct {
    jin *j;
    const char *field;
    tensor_kind kind; /* TK_ANY turns into TK_FLOAT or TK_BOOL at the first leaf */
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

static int grow(nested *c) {
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
    char at[128];
    int ch = jin_peek(c->j);
    int is_num = ch == '-' || (ch >= '0' && ch <= '9');
    int is_bool = ch == 't' || ch == 'f';
    if (c->kind == TK_ANY) {
        if (!is_num && !is_bool)
            return attnd_set_error(c->e, AERR_BAD_REQUEST,
                                   "%s: expected booleans or numbers, got %s",
                                   where(c, depth, at, sizeof(at)), jin_kind(c->j));
        c->kind = is_bool ? TK_BOOL : TK_FLOAT;
    }
    if (c->n == c->cap && grow(c) < 0)
        return attnd_set_error(c->e, AERR_INTERNAL, "out of memory reading %s", c->field);
    if (c->kind == TK_BOOL) {
        int v;
        if (!is_bool || jin_bool(c->j, &v) < 0)
            return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: not a boolean (got %s)",
                                   where(c, depth, at, sizeof(at)), jin_kind(c->j));
        c->u[c->n++] = (uint8_t)v;
        return 0;
    }
    float f;
    if (!is_num)
        return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: not a number (got %s)",
                               where(c, depth, at, sizeof(at)), jin_kind(c->j));
    if (jin_f32(c->j, &f) < 0)
        return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: %s", where(c, depth, at, sizeof(at)),
                               c->j->err);
    if (!isfinite(f))
        return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: number out of float32 range",
                               where(c, depth, at, sizeof(at)));
    c->f[c->n++] = f;
    return 0;
}

/* The common case, a row of numbers at the known innermost depth, read by
 * parse_f32_row in one tight loop. Returns 1 when the row closed, 0 to let
 * the general loop go on at element *count (something other than a number
 * is next, or the row is longer than the first), -1 on error. */
static int fast_row(nested *c, int depth, int *count) {
    jin *j = c->j;
    for (;;) {
        if (c->n == c->cap && grow(c) < 0)
            return attnd_set_error(c->e, AERR_INTERNAL, "out of memory reading %s", c->field);
        size_t max = c->cap - c->n, got = 0;
        if (c->shape[depth] && (size_t)(c->shape[depth] - *count) < max)
            max = (size_t)(c->shape[depth] - *count);
        j->p += parse_f32_row(j->p, (size_t)(j->end - j->p), c->f + c->n, max, &got);
        c->n += got;
        *count += (int)got;
        if (!got) return 0;
        int ch = jin_peek(j);
        if (ch == ']') {
            j->p++;
            return 1;
        }
        if (ch != ',') {
            int r = jin_next(j, ']');
            return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: %s", c->field,
                                   r < 0 ? j->err : "unexpected token");
        }
        j->p++;
        /* a full row (longer than the first), or no number next: the
         * general loop reads on and names what it finds */
        if (got < max || (c->shape[depth] && *count >= c->shape[depth])) return 0;
    }
}

/* Reads one array at depth (its '[' is next). */
static int level(nested *c, int depth) {
    char at[128];
    if (depth >= c->max_rank)
        return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: more than %d dimensions", c->field,
                               c->max_rank);
    c->j->p++; /* '[' */
    if (jin_peek(c->j) == ']')
        return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: empty",
                               where(c, depth, at, sizeof(at)));
    int count = 0;
    if (c->kind == TK_FLOAT && c->rank == depth + 1) {
        int r = fast_row(c, depth, &count);
        if (r < 0) return -1;
        if (r == 1) goto closed;
    }
    for (;;) {
        c->idx[depth] = count;
        int ch = jin_peek(c->j);
        if (ch == '[') {
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
                    c->shape[depth + 1 < c->rank ? depth + 1 : 0], jin_kind(c->j));
            if (leaf(c, depth + 1) < 0) return -1;
        }
        count++;
        if (c->shape[depth] && count > c->shape[depth]) break;
        int r = jin_next(c->j, ']');
        if (r < 0) return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: %s", c->field, c->j->err);
        if (r == 1) break;
    }
closed:
    if (!c->shape[depth]) {
        c->shape[depth] = count;
    } else if (c->shape[depth] != count) {
        char first[128];
        int n = snprintf(first, sizeof(first), "%s", c->field);
        for (int d = 0; d < depth && n >= 0 && (size_t)n < sizeof(first); d++)
            n += snprintf(first + n, sizeof(first) - (size_t)n, "[0]");
        where(c, depth, at, sizeof(at));
        if (count > c->shape[depth])
            return attnd_set_error(c->e, AERR_BAD_REQUEST,
                                   "%s: ragged: more than %d elements where %s has %d", at,
                                   c->shape[depth], first, c->shape[depth]);
        return attnd_set_error(c->e, AERR_BAD_REQUEST, "%s: ragged: %d elements where %s has %d",
                               at, count, first, c->shape[depth]);
    }
    return 0;
}

static int read_nested(jin *j, const char *field, tensor_kind kind, int max_rank, tensor *t,
                       attnd_error *e) {
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

/* {"shape": [...], "dtype": "float32"|"bool", "b64": "..."} */
static int read_b64(jin *j, const char *field, tensor_kind kind, int neg_inf_ok, tensor *t,
                    attnd_error *e) {
    char key[32], dtype[32] = "float32";
    char *b64 = NULL;        /* decoded copy, when the string held escapes */
    const char *b64s = NULL; /* the base64 text: a span of the body or b64 */
    size_t b64n = 0;
    int have_shape = 0, rank = 0, shape[TENSOR_MAX_RANK] = {0};
    int ret = -1;
    j->p++; /* '{' */
    if (jin_peek(j) == '}') {
        attnd_set_error(e, AERR_BAD_REQUEST, "%s: a tensor object needs \"shape\" and \"b64\"",
                        field);
        goto cleanup;
    }
    for (;;) {
        int cut;
        if (jin_string_buf(j, key, sizeof(key), &cut) < 0 || jin_expect(j, ':') < 0) {
            attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
            goto cleanup;
        }
        if (!cut && strcmp(key, "shape") == 0) {
            if (jin_peek(j) != '[') {
                attnd_set_error(e, AERR_BAD_REQUEST, "%s.shape: expected an array of sizes, got %s",
                                field, jin_kind(j));
                goto cleanup;
            }
            j->p++;
            rank = 0;
            if (jin_peek(j) != ']') {
                for (;;) {
                    double d;
                    if (rank == TENSOR_MAX_RANK) {
                        attnd_set_error(e, AERR_BAD_REQUEST, "%s.shape: more than %d dimensions",
                                        field, TENSOR_MAX_RANK);
                        goto cleanup;
                    }
                    if (jin_peek(j) == '[' || jin_number(j, &d) < 0 || d != floor(d) || d < 1) {
                        attnd_set_error(e, AERR_BAD_REQUEST,
                                        "%s.shape[%d]: expected a positive integer", field, rank);
                        goto cleanup;
                    }
                    if (d > TENSOR_MAX_DIM) {
                        attnd_set_error(e, AERR_TOO_LARGE,
                                        "%s.shape[%d]: %.0f is too large (at most %d)", field,
                                        rank, d, TENSOR_MAX_DIM);
                        goto cleanup;
                    }
                    shape[rank++] = (int)d;
                    int r = jin_next(j, ']');
                    if (r < 0) {
                        attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
                        goto cleanup;
                    }
                    if (r == 1) break;
                }
            } else {
                j->p++;
            }
            if (rank == 0) {
                attnd_set_error(e, AERR_BAD_REQUEST, "%s.shape: empty", field);
                goto cleanup;
            }
            have_shape = 1;
        } else if (!cut && strcmp(key, "dtype") == 0) {
            if (jin_peek(j) != '"' || jin_string_buf(j, dtype, sizeof(dtype), &cut) < 0 || cut ||
                (strcmp(dtype, "float32") != 0 && strcmp(dtype, "bool") != 0)) {
                attnd_set_error(e, AERR_BAD_REQUEST, "%s.dtype: expected \"float32\" or \"bool\"",
                                field);
                goto cleanup;
            }
        } else if (!cut && strcmp(key, "b64") == 0) {
            free(b64);
            b64 = NULL;
            int rs = jin_peek(j) == '"' ? jin_string_span(j, &b64s, &b64n) : -1;
            if (rs == 1 && jin_string(j, &b64, &b64n) == 0) {
                b64s = b64;
                rs = 0;
            }
            if (rs != 0) {
                attnd_set_error(e, AERR_BAD_REQUEST, "%s.b64: expected a base64 string, got %s",
                                field, jin_kind(j));
                goto cleanup;
            }
        } else {
            attnd_set_error(e, AERR_BAD_REQUEST,
                            "%s: unknown key \"%s\" in a tensor object (shape, dtype, b64)", field,
                            key);
            goto cleanup;
        }
        int r = jin_next(j, '}');
        if (r < 0) {
            attnd_set_error(e, AERR_BAD_REQUEST, "%s", j->err);
            goto cleanup;
        }
        if (r == 1) break;
    }
    if (!have_shape || !b64s) {
        attnd_set_error(e, AERR_BAD_REQUEST, "%s: a tensor object needs \"shape\" and \"b64\"",
                        field);
        goto cleanup;
    }
    int is_bool = strcmp(dtype, "bool") == 0;
    if (kind == TK_FLOAT && is_bool) {
        attnd_set_error(e, AERR_BAD_REQUEST, "%s.dtype: must be \"float32\"", field);
        goto cleanup;
    }
    if (kind == TK_BOOL && !is_bool) {
        attnd_set_error(e, AERR_BAD_REQUEST, "%s.dtype: must be \"bool\"", field);
        goto cleanup;
    }
    int64_t dims[TENSOR_MAX_RANK];
    for (int d = 0; d < rank; d++)
        dims[d] = shape[d];
    uint64_t n, need;
    if (sz_prod(dims, rank, TENSOR_MAX_ELEMS, &n) < 0) {
        attnd_set_error(e, AERR_TOO_LARGE, "%s.shape: too large: more than %llu elements", field,
                        (unsigned long long)TENSOR_MAX_ELEMS);
        goto cleanup;
    }
    sz_mul(n, is_bool ? 1 : sizeof(float), UINT64_MAX, &need); /* n <= 2^34: cannot wrap */
    size_t cap = b64_decoded_max(b64n), got = 0;
    if (need > cap) {
        attnd_set_error(e, AERR_BAD_REQUEST,
                        "%s.b64: %zu characters cannot hold the %zu bytes shape and dtype need",
                        field, b64n, need);
        goto cleanup;
    }
    void *buf = malloc(cap);
    if (!buf) {
        attnd_set_error(e, AERR_INTERNAL, "out of memory reading %s", field);
        goto cleanup;
    }
    if (b64_decode(b64s, b64n, buf, cap, &got) < 0) {
        free(buf);
        attnd_set_error(e, AERR_BAD_REQUEST, "%s.b64: not valid base64", field);
        goto cleanup;
    }
    if (got != need) {
        free(buf);
        attnd_set_error(e, AERR_BAD_REQUEST, "%s.b64: %zu bytes where shape and dtype need %zu",
                        field, got, need);
        goto cleanup;
    }
    memset(t, 0, sizeof(*t));
    t->rank = rank;
    memcpy(t->shape, shape, sizeof(shape));
    t->n = n;
    t->is_bool = is_bool;
    if (is_bool) {
        t->u = buf;
        for (size_t k = 0; k < n; k++)
            t->u[k] = t->u[k] != 0;
    } else {
        t->f = buf;
        for (size_t k = 0; k < n; k++) {
            float v = t->f[k];
            if (isfinite(v) || (neg_inf_ok && isinf(v) && v < 0)) continue;
            char at[128];
            tensor_index_name(at, sizeof(at), field, rank, shape, k);
            attnd_set_error(e, AERR_BAD_REQUEST, "%s: %s is not allowed", at,
                            isnan(v) ? "NaN" : "infinity");
            tensor_free(t);
            goto cleanup;
        }
    }
    ret = 0;
cleanup:
    free(b64);
    return ret;
}

int tensor_read(jin *j, const char *field, tensor_kind kind, int max_rank, int neg_inf_ok,
                tensor *t, attnd_error *e) {
    memset(t, 0, sizeof(*t));
    int c = jin_peek(j);
    if (c == '[') return read_nested(j, field, kind, max_rank, t, e);
    if (c == '{') return read_b64(j, field, kind, neg_inf_ok, t, e);
    return attnd_set_error(e, AERR_BAD_REQUEST,
                           "%s: expected nested arrays or a tensor object, got %s", field,
                           jin_kind(j));
}
