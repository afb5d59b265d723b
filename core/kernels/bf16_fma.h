/* bf16_fma.h - the AVX512-BF16 path's products on fp32 FMAs (bf16_fma.c).
 *
 * VDPBF16PS is defined as two fp32 FMAs a lane, the odd element's product
 * first, with denormal inputs taken as zero, a denormal result flushed and
 * ties to even. Widened to fp32 (a bf16 is the top half of its fp32), the
 * same two FMAs under MXCSR's DAZ and FTZ give its bits exactly. A CPU that
 * issues two FMAs a cycle and VDPBF16PS every other one computes them faster
 * that way; one that issues VDPBF16PS as fast as an FMA does not. The block
 * and the GEMM (block_bf16.c, gemm_bf16.c) ask here which to run: the bits
 * are the same either way.
 */
#ifndef ATTN_KERNELS_BF16_FMA_H
#define ATTN_KERNELS_BF16_FMA_H

#include <immintrin.h>
#include <stddef.h>

#include "../prim/bf16.h"

/* 1: the AVX512-BF16 kernels multiply with FMAs. Measured once per
 * process (attn_bf16_fma_gain above 1.25), unless forced. */
int attn_bf16_fma(void);
/* Tests, benches: 1 FMAs, 0 VDPBF16PS, -1 as measured; returns the previous. */
int attn_bf16_fma_force(int on);
/* The measure: VDPBF16PS's time over the FMAs' for the same products in the
 * kernels' pattern, best of a few rounds each; 0 on a CPU without
 * AVX512-BF16 (nothing measured). */
double attn_bf16_fma_gain(void);

/* MXCSR with DAZ and FTZ set, for the FMAs; returns the MXCSR to restore. */
unsigned attn_flush_begin(void);
void attn_flush_end(unsigned mxcsr);

#define ATTN_FMA_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,prfchw")))

/* The even (low) and odd (high) bf16 of each 32-bit lane, as fp32. */
ATTN_FMA_TARGET static inline __m512 attn_bf16_even(__m512i x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}
ATTN_FMA_TARGET static inline __m512 attn_bf16_odd(__m512i x) {
    return _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xFFFF0000u)));
}
/* acc + x1 * k1 + x0 * k0, in VDPBF16PS's order (under attn_flush_begin). */
ATTN_FMA_TARGET static inline __m512 attn_bf16_pair_fma(__m512 acc, __m512 x0, __m512 x1, __m512 k0,
                                                        __m512 k1) {
    return _mm512_fmadd_ps(x0, k0, _mm512_fmadd_ps(x1, k1, acc));
}

#endif
