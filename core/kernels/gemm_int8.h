/* gemm_int8.h - projections on int8 weights quantized once (gemm_int8.c),
 * SPEC section 8's int8 formula:
 *   weights  s_w[n] = max_k |W[n][k]| / 127 (fp32), w~[n][k] = q(W[n][k], s_w[n])
 *   inputs   s_a[r] = max_k |A[r][k]| / 127 (fp32), a~[r][k] = q(A[r][k], s_a[r])
 *   q(x, s)  = rint(x / s) (fp32 division, ties to even), clamped to [-127, 127];
 *              0 when s is 0
 *   C[r][n]  = fma(float(acc), s_a[r] * s_w[n], bias[n]), acc = sum_k a~ w~ (int32, exact)
 * on AMX-INT8 tiles, AVX512-VNNI or AVX-VNNI. VPDPBUSD multiplies unsigned
 * by signed bytes, so the inputs are held as a~ + 128 (1..255) and each
 * output takes away 128 times its column's sum of w~. Every path sums the
 * same exact int32 and ends with the same three fp32 roundings (the
 * conversion, the product of scales, the fused multiply-add): the paths
 * give the same bits, and a row's bits never depend on the rows, panels or
 * thread of the call. Exact while K * 255 * 127 < 2^31: K <= ATTN_INT8_KMAX.
 */
#ifndef ATTN_KERNELS_GEMM_INT8_H
#define ATTN_KERNELS_GEMM_INT8_H

#include <stddef.h>
#include <stdint.h>

#include "gemm.h"

enum {
    ATTN_INT8_KSTEP = 64,   /* K is padded with zeros to a multiple of this (an AMX row) */
    ATTN_INT8_HEAD = 64,    /* bytes before a prepared row's inputs: its scale (a float) */
    ATTN_INT8_KMAX = 65536, /* inputs at most: the int32 sums stay exact */
    ATTN_INT8_ROWPAD = 16,  /* prepared rows are padded to a multiple of this (an AMX tile) */
};

/* W packed for every path: panels of 16 output columns, each holding, group
 * of four inputs by group, the 16 columns' four weights side by side (an
 * AMX B tile of 16 rows is 64 inputs x 16 columns; a VPDPBUSD's 64 bytes):
 *   p[((j * kq + k/4) * 16 + n % 16) * 4 + k % 4] = w~[16j + n % 16][k]
 * zeros past N and K. One allocation, 64-byte aligned. */
typedef struct attn_packed_int8 {
    int N, K;
    int panels;        /* ceil(N / 16) */
    int kq;            /* groups of four inputs: K rounded up to ATTN_INT8_KSTEP, over 4 */
    int8_t *p;         /* (panels, kq, 16, 4); owned */
    float *scale;      /* (panels * 16) s_w, zeros past N; in p's allocation */
    int32_t *fix;      /* (panels * 16) 128 * sum_k w~[n][k]; in p's allocation */
    float *bias16;     /* (panels * 16) the bias, zeros past N; in p's allocation */
    const float *bias; /* (N), borrowed from the model */
} attn_packed_int8;

/* The row quantizer of the formula: q (n) from x (n), returns s. */
float attn_int8_quantize(int8_t *q, const float *x, size_t n);

static inline int8_t attn_packed_int8_at(const attn_packed_int8 *pw, int n, int k) {
    return pw->p[(((size_t)(n / 16) * pw->kq + (size_t)(k / 4)) * 16 + (size_t)(n % 16)) * 4 +
                 (size_t)(k % 4)];
}

/* Quantizes and packs W (N,K) once. Returns 0 or -1 (out of memory). */
int attn_packed_int8_init(attn_packed_int8 *pw, const float *W, const float *bias, int N, int K);
void attn_packed_int8_free(attn_packed_int8 *pw); /* zeroed or NULL: no-op */
/* Bytes of one prepared row of K inputs: the head, then K rounded up. */
size_t attn_int8_row_bytes(int K);
/* Prepares row x (K) at dst (attn_int8_row_bytes(K)): its scale in the head,
 * a~ + 128 after it, zeros past K. */
void attn_int8_prepare_row(uint8_t *dst, const float *x, int K);
/* C[r0:r1, 16*j0 : 16*j1) clipped to N, from prepared rows A (row stride lda
 * bytes; rows up to r1 rounded up to ATTN_INT8_ROWPAD readable) on the
 * current path. */
void gemm_int8_tile(float *C, size_t ldc, const uint8_t *A, size_t lda, const attn_packed_int8 *pw,
                    size_t r0, size_t r1, int j0, int j1);
/* The same in plain loops (any CPU): the formula, columns [c0, c1). */
void gemm_int8_ref(float *C, size_t ldc, const uint8_t *A, size_t lda, const attn_packed_int8 *pw,
                   size_t r0, size_t r1, int c0, int c1);

#endif
