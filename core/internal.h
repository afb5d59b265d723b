/* internal.h - helpers shared inside core/ only; not part of the API. */
#ifndef ATTN_INTERNAL_H
#define ATTN_INTERNAL_H

#include <stddef.h>

#include "attn.h"

/* Checks shapes and options of a batch; fills T (query tokens) and U (key
 * tokens). Returns 0, or -1 with a sentence in err. */
int attn_check_batch(const attn_model *m, const attn_batch *b, size_t *T, size_t *U, char *err,
                     size_t errlen);

/* A fixed set of threads that run one parallel loop at a time. The caller's
 * thread takes part as tid 0; with one thread nothing is spawned. */
typedef struct attn_pool attn_pool;
typedef void (*attn_task_fn)(void *arg, int task, int tid);

attn_pool *attn_pool_new(int nthreads);
void attn_pool_free(attn_pool *p);
/* Runs fn(arg, i, tid) for every i in [0, ntasks), tasks taken in order,
 * and returns when all are done. */
void attn_pool_run(attn_pool *p, int ntasks, attn_task_fn fn, void *arg);

#endif
