/* softmax.h - the softmax of rows of scores (softmax.c), for the kernels
 * that hold scores row by row: an online update over tiles of keys, whole
 * rows (fp32, e^x), and a row of weights in log2 units (the bf16 paths'
 * 2^t). The blocks of kernels/ keep their own in-register updates, with
 * the same exponentials (exp.h).
 */
#ifndef ATTN_PRIM_SOFTMAX_H
#define ATTN_PRIM_SOFTMAX_H

#include <stddef.h>

/* One tile of an online softmax: sc (M,n) at row stride ld holds scaled,
 * masked scores; mx and sum (M) are each row's running max and sum, acc
 * (M,D) its unnormalised output. On return sc holds e^(s - max) (zeros where
 * a row sees nothing yet) and acc is rescaled to the new max. */
void attn_softmax_online(float *sc, int ld, int M, int n, float *mx, float *sum, float *acc, int D);
/* Softmax of each of M rows of P (stride ld) over its first n entries, zeros
 * in [n, width); a row that sees nothing is all zeros. */
void attn_softmax_rows(float *P, size_t ld, int M, int n, int width);

/* One row's attention weights by the block's formula, in place: its scores
 * x (n, log2 units, -inf where a key is hidden) become p_j / sum_j p_j with
 * p_j = 2^(x_j - c), c = ceil(max_j x_j), the block's 2^t, sums in fp32;
 * all zeros when every key is hidden. */
void attn_bf16_weights_row(float *x, int n);
#endif
