/* gemm.h - projections on fp32 weights packed once (gemm.c):
 * C (M,N) = A (M,K) @ W^T (K,N) + bias, the same bits whatever the tile.
 */
#ifndef ATTN_KERNELS_GEMM_H
#define ATTN_KERNELS_GEMM_H

#include <stddef.h>

enum {
    ATTN_PANEL = 16,   /* output columns per packed panel */
    ATTN_GEMM_RUN = 64 /* inputs summed apart before they join an output (gemm.c) */
};
typedef struct attn_packed {
    int N, K;          /* W is (N,K): N outputs, K inputs */
    int panels;        /* ceil(N / ATTN_PANEL) */
    int kc;            /* K block of the layout (gemm.c) */
    float *p;          /* (panels, K, ATTN_PANEL), 64-byte aligned, zeros past N; owned */
    const float *bias; /* (N), borrowed from the model */
} attn_packed;

/* Packs W (N,K). Returns 0 or -1 (out of memory). */
int attn_packed_init(attn_packed *pw, const float *W, const float *bias, int N, int K);
void attn_packed_free(attn_packed *pw); /* zeroed or NULL: no-op */
/* C[r0:r1, 16*j0 : 16*j1) = A[r0:r1] (.,K) @ W^T + bias, clipped to N; the
 * fastest kernel the CPU runs. Rows of C and A at strides ldc and lda. */
void gemm_tile(float *C, size_t ldc, const float *A, size_t lda, const attn_packed *pw, size_t r0,
               size_t r1, int j0, int j1);
/* The same, plain C with fmaf: what every FMA kernel must equal bit for bit. */
void gemm_ref(float *C, size_t ldc, const float *A, size_t lda, const attn_packed *pw, size_t r0,
              size_t r1, int c0, int c1);
int gemm_level(void);            /* ATTN_ISA_* of the kernel the CPU runs */
int gemm_force_level(int level); /* tests: -1 = the CPU's; returns the previous */
/* tests: weights packed from now on in K blocks of kc (a multiple of
 * ATTN_GEMM_RUN, at most 256; anything else = the CPU's choice, from its
 * L1 size); returns the previous. */
int gemm_force_kc(int kc);
/* tests: 1 = rows 4 KiB apart copied before the kernel reads them, 0 = read
 * where they are, -1 = as the CPU's L1 needs (gemm.c); returns the previous
 * setting. */
int gemm_force_copy(int copy);

#endif
