/* seq.h - what a sequence of a batch asks for, read the same way by every
 * layer above (seq.c): a cache step or not, a selection of its attention
 * matrices or all of them, and the model's scale as the forward applies it.
 */
#ifndef ATTN_OPS_SEQ_H
#define ATTN_OPS_SEQ_H

#include "../attn.h"

/* 1 when s is a KV-cache step: its cache in floats (kv) or bf16 pages (kv16). */
static inline int attn_seq_step(const attn_seq *s) {
    return s->kv || s->kv16;
}
/* 1 when s asks for a part of its attention matrices (attn_select), not all
 * of them (heads 0..H-1 in order, every row and whole rows are all of
 * them); 0 without weights. */
int attn_seq_selects(const attn_seq *s, int H);
/* The selected rows [*row0, *row1) and heads (n) of s, its selection's
 * defaults filled in. */
void attn_select_span(const attn_seq *s, int H, int *row0, int *row1, int *nheads);
/* Scores' scale in float, as the forward multiplies by it: the default
 * 1/sqrt(D) in float, as attnd has always computed it, or the model's own. */
float attn_scale(const attn_hparams *hp);
/* 1 when hp (filled by attn_model_init) is plain nn.MultiheadAttention: no
 * grouped heads, head_dim, scale or rope. */
int attn_is_mha(const attn_hparams *hp);

#endif
