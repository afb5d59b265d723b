/* block_bf16.h - the attention block with bf16 operands (block_bf16.c):
 * the online softmax over a head's keys and values in bf16 pages, on AMX
 * tiles or AVX512-BF16, and its plain reference.
 */
#ifndef ATTN_KERNELS_BLOCK_BF16_H
#define ATTN_KERNELS_BLOCK_BF16_H

#include <stddef.h>

#include "../attn.h"
#include "kv_pages.h"

enum { ATTN_BF16_ROWS = 512 }; /* rows (positions x heads) a block takes in one pass */
enum { ATTN_BF16_DMAX = 256 }; /* the widest head the block and its reference take */

/* 1 when the bf16 block runs D on the current path: D a multiple of 32 up to
 * 256, and AMX or AVX512-BF16 present. Other widths, and CPUs without either,
 * take the fp32 kernels. */
int attn_bf16_supported(int D);
size_t attn_bf16_scratch_bytes(int D); /* one thread's scratch for one block */

/* The online-softmax attention of Lb positions [i0, i0+Lb) of sequence s,
 * for the R query heads that share one key/value head (1 <= R <=
 * ATTN_BF16_ROWS; a call of more than ATTN_BF16_ROWS rows runs as several):
 * the block's rows are (position, head) pairs, row r at position i0 + r / R,
 * its query at q + (r / R) * ldq + (r % R) * D, its output at
 * out + (r / R) * ldo + (r % R) * D (out (Lb, R*D) at stride ldo; out may
 * be q). kv holds the head's s->S keys and values. Masks are s's, read at
 * the row's position (prim/mask.h); a row with every key hidden gets zeros. With k_j, v_j the bf16
 * keys and values, in log2 units:
 *   q~  = bf16(q * (scale * log2(e)))         (the product in fp32)
 *   x_j = q~ . k_j + m_j * log2(e)            (fp32 sums of exact products; m_j the
 *                                              additive mask, below -1e30 counted as -1e30)
 *   p_j = 2^(x_j - c), c an integer >= max_j x_j, 0 for a hidden key   (fp32)
 *   out = sum_j bf16(p_j) v_j / sum_j p_j     (fp32 sums)
 * c is the running maximum (the ceiling of the largest score so far), so
 * rescaling by 2^(c_old - c_new) is exact and bf16(p_j) does not depend on
 * where the key blocks fall: the result is that of one c for all keys, up
 * to fp32 rounding. scratch: attn_bf16_scratch_bytes(D), 64-byte aligned,
 * the calling thread's. On the NONE path (or a width attn_bf16_supported
 * refuses) it runs attn_bf16_block_ref, which takes any even D up to
 * ATTN_BF16_DMAX. */
void attn_bf16_block(float *out, size_t ldo, const float *q, size_t ldq, const attn_kv_bf16 *kv,
                     const attn_seq *s, int i0, int Lb, int R, int D, float scale, void *scratch);
/* attn_bf16_block, plainly: one row at a time, libm's exp2, no scratch. Both
 * take an even D up to ATTN_BF16_DMAX; kv may be at any alignment. */
void attn_bf16_block_ref(float *out, size_t ldo, const float *q, size_t ldq, const attn_kv_bf16 *kv,
                         const attn_seq *s, int i0, int Lb, int R, int D, float scale);

#endif
