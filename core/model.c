/* model.c - the model's one allocation, and the batch checks shared by the
 * fast and the reference forward. No math here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "internal.h"

int attn_model_init(attn_model *m, const attn_hparams *hp, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    int E = hp->embed_dim, H = hp->num_heads;
    if (E < 1 || H < 1) {
        snprintf(err, errlen, "embed_dim and num_heads must be positive (got %d and %d)", E, H);
        return -1;
    }
    if (E % H != 0) {
        snprintf(err, errlen, "embed_dim %d is not divisible by num_heads %d", E, H);
        return -1;
    }
    if (hp->kdim < 1 || hp->vdim < 1) {
        snprintf(err, errlen, "kdim and vdim must be positive (got %d and %d)", hp->kdim, hp->vdim);
        return -1;
    }
    size_t e = (size_t)E;
    size_t n = e * e + e * hp->kdim + e * hp->vdim + 3 * e + e * e + e;
    float *mem = calloc(n, sizeof(float));
    if (!mem) {
        snprintf(err, errlen, "out of memory for %zu weights", n);
        return -1;
    }
    m->hp = *hp;
    m->mem = mem;
    m->n_floats = n;
    m->q_w = mem;
    m->k_w = m->q_w + e * e;
    m->v_w = m->k_w + e * hp->kdim;
    m->q_b = m->v_w + e * hp->vdim;
    m->k_b = m->q_b + e;
    m->v_b = m->k_b + e;
    m->out_w = m->v_b + e;
    m->out_b = m->out_w + e * e;
    return 0;
}

void attn_model_free(attn_model *m)
{
    if (!m) return;
    free(m->mem);
    memset(m, 0, sizeof *m);
}

int attn_check_batch(const attn_model *m, const attn_batch *b, size_t *T, size_t *U, char *err,
                     size_t errlen)
{
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
    size_t t = 0, u = 0;
    for (int i = 0; i < b->B; i++) {
        const attn_seq *s = &b->seqs[i];
        if (s->L < 1 || s->S < 1) {
            snprintf(err, errlen, "sequence %d: lengths must be positive (L=%d, S=%d)", i, s->L,
                     s->S);
            return -1;
        }
        if (!b->key && s->S != s->L) {
            snprintf(err, errlen, "sequence %d: self-attention needs S == L (S=%d, L=%d)", i, s->S,
                     s->L);
            return -1;
        }
        if (s->weights != ATTN_WEIGHTS_NONE && s->weights != ATTN_WEIGHTS_MEAN &&
            s->weights != ATTN_WEIGHTS_HEADS) {
            snprintf(err, errlen, "sequence %d: unknown attention weights mode %d", i,
                     (int)s->weights);
            return -1;
        }
        if (s->weights != ATTN_WEIGHTS_NONE && !s->attn) {
            snprintf(err, errlen, "sequence %d: attention weights asked for but no buffer given", i);
            return -1;
        }
        t += (size_t)s->L;
        u += (size_t)s->S;
    }
    *T = t;
    *U = u;
    return 0;
}
