/* check.c - the checks of a batch against its model, shared by the fast
 * and the reference forward: shapes, lengths, cache steps, weights and
 * selections, each refused with a sentence that names the sequence.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../ops/ops.h"
#include "../ops/seq.h"
#include "check.h"

/* Sequence i's selection (attn_select) against H heads and its lengths. */
static int check_select(const attn_seq *s, int i, int H, char *err, size_t errlen) {
    const attn_select *sel = &s->sel;
    int whole_rows = sel->row0 == 0 && sel->row1 == 0;
    if (s->weights == ATTN_WEIGHTS_NONE && (sel->heads || sel->top_k || !whole_rows)) {
        snprintf(err, errlen, "sequence %d: a selection of attention weights needs weights", i);
        return -1;
    }
    if (!whole_rows && !(sel->row0 >= 0 && sel->row0 < sel->row1 && sel->row1 <= s->L)) {
        snprintf(err, errlen, "sequence %d: selected rows [%d, %d) are not within [0, %d)", i,
                 sel->row0, sel->row1, s->L);
        return -1;
    }
    if (sel->top_k < 0 || sel->top_k > s->S || (sel->top_k && !s->attn_idx)) {
        snprintf(err, errlen, "sequence %d: top-k %d needs 1 <= k <= S (%d) and an index buffer", i,
                 sel->top_k, s->S);
        return -1;
    }
    if (!sel->heads) return 0;
    if (sel->n_heads < 1 || sel->n_heads > H) {
        snprintf(err, errlen, "sequence %d: %d selected heads, the model has %d", i, sel->n_heads,
                 H);
        return -1;
    }
    uint8_t *seen = calloc((size_t)H, 1);
    int rc = seen ? 0 : -1;
    if (!seen) snprintf(err, errlen, "out of memory checking sequence %d's heads", i);
    for (int a = 0; seen && a < sel->n_heads && rc == 0; a++) {
        int h = sel->heads[a];
        if (h < 0 || h >= H || seen[h]) {
            snprintf(err, errlen, "sequence %d: selected head %d is out of [0, %d) or repeated", i,
                     h, H);
            rc = -1;
        } else {
            seen[h] = 1;
        }
    }
    free(seen);
    return rc;
}

/* The batch as a whole against the model. */
static int check_whole(const attn_model *m, const attn_batch *b, char *err, size_t errlen) {
    const attn_hparams *hp = &m->hp;
    if (!m->mem) {
        snprintf(err, errlen, "model has no weights");
        return -1;
    }
    if (b->B < 1 || !b->seqs || !b->query || !b->out) {
        snprintf(err, errlen, "batch needs at least one sequence, a query and an output");
        return -1;
    }
    if (!b->key && (hp->kdim != hp->embed_dim || hp->vdim != hp->embed_dim)) {
        snprintf(err, errlen,
                 "self-attention needs kdim == vdim == embed_dim (%d, %d, %d): give a key",
                 hp->kdim, hp->vdim, hp->embed_dim);
        return -1;
    }
    if (b->key && !b->value && hp->kdim != hp->vdim) {
        snprintf(err, errlen, "value defaults to key, which needs kdim == vdim (%d, %d)", hp->kdim,
                 hp->vdim);
        return -1;
    }
    if (b->key && hp->rope.dim) {
        snprintf(err, errlen,
                 "rotary positions need self-attention (no key): a key row's "
                 "position would be unknown");
        return -1;
    }
    return 0;
}

/* Sequence i's lengths, positions and cache step. */
static int check_lengths(const attn_model *m, const attn_batch *b, const attn_seq *s, int i,
                         char *err, size_t errlen) {
    for (int r = 0; s->positions && r < s->L; r++)
        if (s->positions[r] < 0) {
            snprintf(err, errlen, "sequence %d: position %d of row %d is negative", i,
                     (int)s->positions[r], r);
            return -1;
        }
    if (s->L < 1 || s->S < 1) {
        snprintf(err, errlen, "sequence %d: lengths must be positive (L=%d, S=%d)", i, s->L, s->S);
        return -1;
    }
    if (attn_seq_step(s) && (b->key || s->cached < 0 || s->S - s->L != s->cached || s->positions ||
                             s->key_padding_mask || s->attn_mask_bool || s->attn_mask_add)) {
        snprintf(err, errlen,
                 "sequence %d: a cache step is self-attention with S == cached + L "
                 "(S=%d, L=%d, cached=%d) and no positions or masks",
                 i, s->S, s->L, s->cached);
        return -1;
    }
    if (attn_seq_step(s) && (s->kv16 ? !m->attn16 || s->kv : m->attn16)) {
        snprintf(err, errlen,
                 "sequence %d: a cache step of this model keeps its cache in %s (attn_seq.%s)", i,
                 m->attn16 ? "bf16 pages" : "floats", m->attn16 ? "kv16" : "kv");
        return -1;
    }
    if (!b->key && !attn_seq_step(s) && s->S != s->L) {
        snprintf(err, errlen, "sequence %d: self-attention needs S == L (S=%d, L=%d)", i, s->S,
                 s->L);
        return -1;
    }
    return 0;
}

/* Sequence i's weights mode and selection. */
static int check_weights(const attn_seq *s, int i, int H, char *err, size_t errlen) {
    if (s->weights != ATTN_WEIGHTS_NONE && s->weights != ATTN_WEIGHTS_MEAN &&
        s->weights != ATTN_WEIGHTS_HEADS) {
        snprintf(err, errlen, "sequence %d: unknown attention weights mode %d", i, (int)s->weights);
        return -1;
    }
    if (s->weights != ATTN_WEIGHTS_NONE && !s->attn) {
        snprintf(err, errlen, "sequence %d: attention weights asked for but no buffer given", i);
        return -1;
    }
    return check_select(s, i, H, err, errlen);
}

int attn_check_batch(const attn_model *m, const attn_batch *b, size_t *T, size_t *U, char *err,
                     size_t errlen) {
    if (check_whole(m, b, err, errlen) < 0) return -1;
    size_t t = 0, u = 0;
    for (int i = 0; i < b->B; i++) {
        const attn_seq *s = &b->seqs[i];
        if (check_lengths(m, b, s, i, err, errlen) < 0 ||
            check_weights(s, i, m->hp.num_heads, err, errlen) < 0)
            return -1;
        t += (size_t)s->L;
        u += (size_t)s->S;
    }
    *T = t;
    *U = u;
    return 0;
}

int attn_check_packed(const attn_model *m, char *err, size_t errlen) {
    if (m->proj_ops && m->proj_ops->weights(m, 0)) return 0;
    snprintf(err, errlen, "model weights are not packed: call attn_model_pack once filled");
    return -1;
}
