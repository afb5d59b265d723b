/* tensor.h - one tensor out of a request body: nested JSON arrays
 * ([[1,2],[3,4]]) or a base64 object ({"shape":[2,2],"dtype":"float32",
 * "b64":"..."}), read straight into a packed row-major array. Every refusal
 * names the field and the index: "query[2][5]: not a number (got a string)".
 * NaN and infinities are refused (JSON numbers that overflow float32
 * included); the one exception is -inf in a base64 float mask, which means
 * "hidden" when the caller allows it.
 */
#ifndef ATTND_TENSOR_H
#define ATTND_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "../base/reply.h"
#include "jsonin.h"

#define TENSOR_MAX_RANK 4
/* A dimension above this is refused as too large (413), and so is a shape
 * whose element count passes TENSOR_MAX_ELEMS, before anything is
 * allocated: no body under any max_body_bytes can carry more. */
#define TENSOR_MAX_DIM 1000000000
#define TENSOR_MAX_ELEMS ((uint64_t)1 << 34)

typedef enum {
    TK_FLOAT, /* numbers only */
    TK_BOOL,  /* booleans only (base64: dtype "bool", one byte each) */
    TK_ANY    /* booleans or numbers, all alike; the first element decides */
} attnd_tensor_kind;

typedef struct {
    int rank;                   /* 1..TENSOR_MAX_RANK */
    int shape[TENSOR_MAX_RANK]; /* dims, each >= 1 */
    size_t n;                   /* elements: product of shape */
    int is_bool;                /* 1: u holds the elements; 0: f does */
    int shaped;                 /* 1: the body gave the shape apart from the data (a base64
                                   object, a v2 input): messages name shape[d] */
    float *f;                   /* (n) float32, owned, or NULL */
    uint8_t *u;                 /* (n) 0 or 1, owned, or NULL */
} attnd_tensor;

/* Reads the next value of j as the tensor `field`. Nested arrays may be at
 * most max_rank deep. neg_inf_ok lets base64 float32 data hold -inf.
 * Returns 0, or -1 with e set (400; 500 when out of memory); t holds nothing
 * to free after a failure. */
int attnd_tensor_read(jin *j, const char *field, attnd_tensor_kind kind, int max_rank,
                      int neg_inf_ok, attnd_tensor *t, attnd_error *e);
void attnd_tensor_free(attnd_tensor *t); /* NULL and zeroed tensors are fine */

/* The elements of shape (each dimension at most TENSOR_MAX_DIM, as the
 * body's reader allows) and the bytes they take at esz bytes each. Returns
 * 0, or -1 with the 413 "<field>.shape: too large" past TENSOR_MAX_ELEMS
 * elements. */
int attnd_tensor_size(const jshape *shape, size_t esz, const char *field, uint64_t *n,
                      uint64_t *bytes, attnd_error *e);

/* The index of the first of x[0..n) that is NaN or infinite (-inf passes
 * with neg_inf_ok), n when every one is finite. */
size_t attnd_first_nonfinite(const float *x, size_t n, int neg_inf_ok);

/* Refuses a float tensor (rank and shape set) holding NaN or an infinity
 * (-inf passes with neg_inf_ok): 0, or -1 with the 400 naming the first
 * ("query[1][3]: NaN is not allowed") and t freed. */
int attnd_tensor_check_finite(attnd_tensor *t, const char *field, int neg_inf_ok, attnd_error *e);

/* "field[i][j]" for the flat index k of a tensor of this shape. */
void attnd_tensor_index_name(char *buf, size_t cap, const char *field, int rank, const int *shape,
                             size_t k);

#endif
