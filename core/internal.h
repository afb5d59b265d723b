/* internal.h - helpers shared inside core/ only; not part of the API. */
#ifndef ATTN_INTERNAL_H
#define ATTN_INTERNAL_H

#include <stddef.h>

#include <cblas.h>

#include "attn.h"

/* blas.c: OpenBLAS's cblas_sgemm, loaded by attn_blas_init (never linked). */
extern __typeof__(cblas_sgemm) *blas_sgemm;

/* Checks shapes and options of a batch; fills T (query tokens) and U (key
 * tokens). Returns 0, or -1 with a sentence in err. */
int attn_check_batch(const attn_model *m, const attn_batch *b, size_t *T, size_t *U, char *err,
                     size_t errlen);
/* 1 when hp (filled by attn_model_init) is plain nn.MultiheadAttention: no
 * grouped heads, head_dim, scale or rope. attn_forward hands the others to
 * attn_forward_decoder (decode.c). */
int attn_is_mha(const attn_hparams *hp);

/* A fixed set of threads that run one parallel loop at a time. The caller's
 * thread takes part as tid 0; with one thread nothing is spawned. */
typedef struct attn_pool attn_pool;
typedef void (*attn_task_fn)(void *arg, int task, int tid);

attn_pool *attn_pool_new(int nthreads);
void attn_pool_free(attn_pool *p);
/* Runs fn(arg, i, tid) for every i in [0, ntasks), tasks taken in order,
 * and returns when all are done. */
void attn_pool_run(attn_pool *p, int ntasks, attn_task_fn fn, void *arg);

/* fused.c: the AVX-512 online-softmax block (see there). Supported when the
 * CPU has AVX-512F and D is a multiple of 16 up to 128. */
int attn_fused_supported(int D);
size_t attn_fused_floats(int D); /* scratch floats one block needs */
enum { ATTN_FUSED_ROWS = 512 };  /* query rows one call may take */
/* out (Lb,D) at stride ldo = softmax(q k^T * scale + masks) v for query
 * rows [i0, i0+Lb) of sequence s, Lb <= ATTN_FUSED_ROWS; out may be q. */
void attn_fused_block(float *out, size_t ldo, const float *q, size_t ldq, const float *k,
                      size_t ldk, const float *v, size_t ldv, const attn_seq *s, int i0, int Lb,
                      int D, float scale, float *scratch);

#endif
