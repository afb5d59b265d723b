/* mask.c - a sequence's masks on one row of scores (mask.h). Every kernel
 * calls it, whatever its layout (stride) and units (natural or log2), so
 * that a mask means the same in every path.
 */
#include <math.h>

#include "bf16.h"
#include "mask.h"

void attn_mask_scores(float *x, size_t stride, const attn_seq *s, int pos, int j0, int n,
                      const attn_mask_units *u) {
    const float *add = s->attn_mask_add ? s->attn_mask_add + (size_t)pos * s->S + j0 : NULL;
    const uint8_t *hide = s->attn_mask_bool ? s->attn_mask_bool + (size_t)pos * s->S + j0 : NULL;
    const uint8_t *pad = s->key_padding_mask ? s->key_padding_mask + j0 : NULL;
    int causal = s->causal && j0 + n - 1 > pos;
    if (!add && !hide && !pad && !causal) return;
    for (int c = 0; add && !u->log2 && c < n; c++)
        x[c * stride] += add[c];
    for (int c = 0; add && u->log2 && c < n; c++) {
        float a = attn_bf16_mask_log2(add[c]);
        x[c * stride] = a == -INFINITY ? u->hidden : x[c * stride] + a;
    }
    for (int c = 0; pad && c < n; c++)
        if (pad[c]) x[c * stride] = u->hidden;
    for (int c = 0; hide && c < n; c++)
        if (hide[c]) x[c * stride] = u->hidden;
    for (int c = pos + 1 - j0 > 0 ? pos + 1 - j0 : 0; causal && c < n; c++)
        x[c * stride] = u->hidden;
}
