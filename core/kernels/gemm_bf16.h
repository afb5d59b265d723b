/* gemm_bf16.h - projections on bf16 weights packed once (gemm_bf16.c):
 * C (M,N) = bf16(A) (M,K) @ bf16(W)^T (K,N) + bias, on AMX tiles or
 * AVX512-BF16, and the formula in plain loops.
 */
#ifndef ATTN_KERNELS_GEMM_BF16_H
#define ATTN_KERNELS_GEMM_BF16_H

#include <stddef.h>

#include "../prim/bf16.h"
#include "gemm.h"

enum { ATTN_BF16_KSTEP = 32 }; /* K is padded with zeros to a multiple of this */

/* W packed for both kernels: panels of ATTN_PANEL (16) output columns, each
 * holding, pair of inputs by pair of inputs, the 16 columns' two weights side
 * by side ("VNNI pairs": an AMX B tile of 16 rows is 32 inputs x 16 columns):
 *   p[((j * kp + k/2) * 16 + n % 16) * 2 + k % 2] = bf16(W[16j + n % 16][k])
 * zeros past N and past K. One allocation, 64-byte aligned. */
typedef struct attn_packed_bf16 {
    int N, K;          /* W is (N,K): N outputs, K inputs */
    int panels;        /* ceil(N / 16) */
    int kp;            /* input pairs per panel: K rounded up to ATTN_BF16_KSTEP, halved */
    attn_bf16 *p;      /* (panels, kp, 16, 2); owned */
    const float *bias; /* (N), borrowed from the model (zeros when it has none) */
    float *bias16;     /* (panels * 16) the bias, zeros past N: AMX loads it as a tile; in p's
                          allocation */
} attn_packed_bf16;

/* W[n][k] in bf16, read from the packed layout above. */
static inline attn_bf16 attn_packed_bf16_at(const attn_packed_bf16 *pw, int n, int k) {
    size_t pair = ((size_t)(n / 16) * pw->kp + (size_t)(k / 2)) * 16 + (size_t)(n % 16);
    return pw->p[pair * 2 + (size_t)(k % 2)];
}

/* Rounds and packs W (N,K) once, and copies bias (N); again if either
 * changes. Returns 0 or -1 (out of memory). */
int attn_packed_bf16_init(attn_packed_bf16 *pw, const float *W, const float *bias, int N, int K);
void attn_packed_bf16_free(attn_packed_bf16 *pw); /* zeroed or NULL: no-op */
/* C[r0:r1, 16*j0 : 16*j1) clipped to N = bf16(A[r0:r1]) @ W^T + bias, on the
 * current path: gemm_tile's contract (gemm.h) on bf16 weights. A row's
 * outputs do not depend on the rows, panels or thread of the call (each path
 * sums a row alone and in one order), so projections stay batch-invariant. */
void gemm_bf16_tile(float *C, size_t ldc, const float *A, size_t lda, const attn_packed_bf16 *pw,
                    size_t r0, size_t r1, int j0, int j1);
/* The same on rows rounded already: A (M, K rounded up to ATTN_BF16_KSTEP) in
 * bf16 at row stride lda (elements), zeros past K (attn_bf16_round a row,
 * then zero its tail). A caller that projects the same rows on many column
 * tiles rounds them once this way instead of once per tile; the outputs are
 * those of gemm_bf16_tile on the fp32 rows, bit for bit. */
void gemm_bf16_tile_rounded(float *C, size_t ldc, const attn_bf16 *A, size_t lda,
                            const attn_packed_bf16 *pw, size_t r0, size_t r1, int j0, int j1);
/* The formula, plainly: rows [r0,r1) x columns [c0,c1); c = bias, then
 * c += bf16(a_k) * w_k for k = 0..K-1 in fp32. */
void gemm_bf16_ref(float *C, size_t ldc, const float *A, size_t lda, const attn_packed_bf16 *pw,
                   size_t r0, size_t r1, int c0, int c1);

#endif
