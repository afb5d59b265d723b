/* selection.h - the part of the attention matrices a request asks for
 * (SPEC section 9): attention_heads, attention_rows, attention_top_k and
 * attention_dtype in a native body (and a session step's), their v2
 * `parameters` (attention_heads "0,3,5", attention_rows "start:end",
 * attention_top_k, attention_datatype), read as the body gives them, then
 * checked once against the model and the request's rows and keys into
 * attnd_job.sel (job.h). The field tables that hold these readers are
 * request.c's and v2.c's. No HTTP.
 */
#ifndef ATTND_SELECTION_H
#define ATTND_SELECTION_H

#include <stdint.h>

#include "../codec/jsonin.h"
#include "job.h"

/* The largest number a selection field reads (2^53, exact in a double);
 * past it a number is 400, out of range as any index past the model's. */
#define ATTND_SEL_MAX ((int64_t)1 << 53)

/* The selection as a body gave it, before any check. */
typedef struct {
    int64_t *heads; /* (n_heads) as given, owned; NULL when not given */
    int n_heads;
    int have_heads; /* 1: attention_heads was there (an empty list too) */
    int64_t rows[2];
    int have_rows;
    int64_t top_k; /* -1: not given */
    int dtype;     /* attnd_elem, or -1: not given */
    int v2;        /* 1: v2 parameters: messages name them "parameters.attention_..." */
} attnd_sel_in;

/* The words of "attention_dtype" (float32, float16, bfloat16) and of v2's
 * "attention_datatype" (FP32, FP16, BF16), into attnd_elem. */
extern const attnd_enum attnd_attention_dtypes;
extern const attnd_enum attnd_attention_datatypes;

void attnd_sel_in_init(attnd_sel_in *s, int v2);
void attnd_sel_in_free(attnd_sel_in *s);

/* Field readers (JF_CUSTOM) for the tables of request.c: each finds its
 * attnd_sel_in at f->offset in the table's destination.
 *   native attention_heads: an array of whole numbers
 *   native attention_rows:  [start, end], two whole numbers
 *   v2 attention_heads:     a string of whole numbers and commas, or one number
 *   v2 attention_rows:      a string "start:end" */
int attnd_sel_read_heads(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e);
/* attention_top_k, native and v2: a whole number */
int attnd_sel_read_top_k(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e);
int attnd_sel_read_rows(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e);
int attnd_sel_read_v2_heads(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e);
int attnd_sel_read_v2_rows(jin *j, const jfield *f, void *dst, jpath *path, attnd_error *e);

/* Checks in against model m and job (its L, S and weights set) and fills
 * job->sel, taking the heads. Refused with a 400 that names the field and
 * its value: any selection while no attention is asked for; heads empty,
 * out of range or given twice; rows reversed, empty or past L; top-k of 0,
 * or more than S unless step (a session step's S is known at admission:
 * attnd_check_top_k then). Returns 0, or -1 with e set. */
int attnd_sel_check(attnd_sel_in *in, const attnd_model_info *m, attnd_job *job, int step,
                    attnd_error *e);

/* job's attention_top_k against its S keys: 0, or -1 with the 400 naming
 * the value. The parsers check it, but a session step's S is known at its
 * admission (attnd_admit checks it then). */
int attnd_check_top_k(const attnd_job *job, attnd_error *e);

#endif
