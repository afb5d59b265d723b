/* block.h - the fp32 attention block in AVX-512 registers (block.c): the
 * online softmax of a group of query rows over one key/value head.
 */
#ifndef ATTN_KERNELS_BLOCK_H
#define ATTN_KERNELS_BLOCK_H

#include <stddef.h>

#include "../attn.h"

/* 1 when the CPU has AVX-512F, D is a multiple of 16 up to 128, and
 * attn_set_fused has not turned it off. */
int attn_fused_supported(int D);
size_t attn_fused_floats(int D); /* scratch floats one call needs */
enum { ATTN_FUSED_ROWS = 512 };  /* lanes (query rows x heads) one call may take */
/* For `rows` query rows at positions pos0.. of sequence s, each with R query
 * heads (D floats apart, rows ldq apart) that read one key/value head k, v
 * (S,D) at stride ldkv: q = softmax(q k^T * scale + masks) v, in place.
 * rows * R <= ATTN_FUSED_ROWS. */
void attn_fused_block(float *q, size_t ldq, int R, const float *k, const float *v, size_t ldkv,
                      const attn_seq *s, int pos0, int rows, int D, float scale, float *scratch);

#endif
