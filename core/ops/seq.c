/* seq.c - what a sequence asks for (seq.h); no math. */
#include <math.h>

#include "seq.h"

void attn_select_span(const attn_seq *s, int H, int *row0, int *row1, int *nheads) {
    int whole = s->sel.row0 == 0 && s->sel.row1 == 0;
    *row0 = whole ? 0 : s->sel.row0;
    *row1 = whole ? s->L : s->sel.row1;
    *nheads = s->sel.heads ? s->sel.n_heads : H;
}

size_t attn_select_floats(const attn_seq *s, int H) {
    int r0, r1, nh;
    if (s->weights == ATTN_WEIGHTS_NONE) return 0;
    attn_select_span(s, H, &r0, &r1, &nh);
    size_t n = (size_t)(r1 - r0) * (size_t)(s->sel.top_k ? s->sel.top_k : s->S);
    return s->weights == ATTN_WEIGHTS_HEADS ? n * (size_t)nh : n;
}

int attn_seq_selects(const attn_seq *s, int H) {
    if (s->weights == ATTN_WEIGHTS_NONE) return 0;
    if (s->sel.top_k || s->sel.row0 || s->sel.row1) return 1;
    if (!s->sel.heads) return 0;
    if (s->sel.n_heads != H) return 1;
    for (int h = 0; h < H; h++)
        if (s->sel.heads[h] != h) return 1;
    return 0;
}

float attn_scale(const attn_hparams *hp) {
    if (hp->scale == 1.0 / sqrt((double)hp->head_dim)) return 1.0f / sqrtf((float)hp->head_dim);
    return (float)hp->scale;
}

int attn_is_mha(const attn_hparams *hp) {
    return hp->num_kv_heads == hp->num_heads && hp->head_dim * hp->num_heads == hp->embed_dim &&
           hp->rope.dim == 0 && hp->scale == 1.0 / sqrt((double)hp->head_dim);
}
