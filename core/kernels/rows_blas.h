/* rows_blas.h - fp32 attention of M query rows on OpenBLAS calls
 * (rows_blas.c): the path where the fp32 block (block.h) does not run, and
 * the one that gives whole rows of weights.
 */
#ifndef ATTN_KERNELS_ROWS_BLAS_H
#define ATTN_KERNELS_ROWS_BLAS_H

#include <stddef.h>

#include "../attn.h"

/* M query rows that one OpenBLAS call takes, and the key/value head they read. */
typedef struct {
    float *q; /* (M,D) at stride ldq: queries in, the rows' head outputs out */
    size_t ldq;
    int M;
    int pos, dpos;  /* row m at position pos + m * dpos (causal and masks) */
    const float *k; /* (S,D) at stride ldkv */
    const float *v; /* (S,D) at stride ldkv */
    size_t ldkv;
    int jend; /* keys [jend, S) are hidden from every row (causal) */
} attn_qrows;

enum { ATTN_ROWS_KB = 256 }; /* keys per tile of the online softmax */

/* Scratch floats of attn_rows_online for up to cap rows of width D. */
size_t attn_rows_online_floats(int cap, int D);
/* The rows r of sequence s over key tiles with an online softmax, never
 * more than an (M, KB) block of scores: outputs over the queries. */
void attn_rows_online(const attn_qrows *r, const attn_seq *s, int D, float scale, int cap,
                      float *scratch);
/* P (M, jend) at stride ldP = the scaled scores q k^T of the rows r. */
void attn_rows_scores(const attn_qrows *r, int D, float scale, float *P, int ldP);
/* Rows [m0, m1) of P (scores of the rows r of sequence s) become their
 * attention weights: masked, softmax, zeros from jend to S. Each row's bits
 * are its own: they do not depend on the other rows. */
void attn_rows_weigh(const attn_qrows *r, const attn_seq *s, float *P, int ldP, int m0, int m1);
/* The rows' outputs over their queries from their weights P (M, jend). */
void attn_rows_values(const attn_qrows *r, int D, const float *P, int ldP);

#endif
