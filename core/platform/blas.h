/* blas.h - OpenBLAS's cblas_sgemm, loaded by attn_blas_init (blas.c) with
 * the kernel set the CPU's features allow, and kept single-threaded.
 */
#ifndef ATTN_PLATFORM_BLAS_H
#define ATTN_PLATFORM_BLAS_H

#include <cblas.h>

extern __typeof__(cblas_sgemm) *blas_sgemm;

#endif
