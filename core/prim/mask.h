/* mask.h - the one routine that applies a sequence's masks to scores
 * (mask.c), for every attention kernel and precision: the additive mask,
 * the key padding mask, the boolean mask and causal, indexed by the row's
 * position (a cache step has none but causal).
 */
#ifndef ATTN_PRIM_MASK_H
#define ATTN_PRIM_MASK_H

#include <stddef.h>

#include "../attn.h"

/* How a kernel's scores take masks. */
typedef struct {
    int log2;     /* 1: scores in log2 units: the additive mask is scaled by log2(e) (below
                     -1e30 counted as -1e30, attn_bf16_mask_log2) and a -inf in it hides the key;
                     0: added as it is */
    float hidden; /* the score of a hidden key: -inf, or a finite stand-in */
} attn_mask_units;

/* Masks the scores x[c * stride], c in [0, n), of keys j0 + c for the row
 * at position pos of s: the additive mask first, then `hidden` where the key
 * padding mask, the boolean mask or causal (keys after pos) hide the key.
 * Returns at once when none of them reaches these keys. */
void attn_mask_scores(float *x, size_t stride, const attn_seq *s, int pos, int j0, int n,
                      const attn_mask_units *u);

#endif
