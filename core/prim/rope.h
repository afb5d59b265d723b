/* rope.h - rotary positions on projected rows (rope.c). */
#ifndef ATTN_PRIM_ROPE_H
#define ATTN_PRIM_ROPE_H

#include "../attn.h"

void attn_rope_freqs(const attn_rope *r, double *inv); /* inv (dim/2), scaling applied */
/* Rotates the first r->dim columns of each of `heads` heads (D floats
 * apart) of one row x at position pos (and scales them by the attention
 * factor). */
void attn_rope_row(float *x, int heads, int D, const attn_rope *r, const double *inv, double pos);

#endif
