/* ref.c - the naive reference forward: plain loops over the formula of
 * SPEC section 1, one sequence and one head at a time, with double sums.
 * Slow on purpose; the tests hold the fast path to it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "internal.h"

/* y (n, out) = x (n, in) @ w^T (in, out) + b (out) */
static void linear_ref(float *y, const float *x, const float *w, const float *b, size_t n,
                       int in, int out)
{
    for (size_t i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double acc = b[o];
            for (int k = 0; k < in; k++)
                acc += (double)x[i * in + k] * w[(size_t)o * in + k];
            y[i * out + o] = (float)acc;
        }
}

static int hidden_ref(const attn_seq *s, int i, int j)
{
    if (s->causal && j > i) return 1;
    if (s->key_padding_mask && s->key_padding_mask[j]) return 1;
    if (s->attn_mask_bool && s->attn_mask_bool[(size_t)i * s->S + j]) return 1;
    if (s->attn_mask_add && isinf(s->attn_mask_add[(size_t)i * s->S + j]) &&
        s->attn_mask_add[(size_t)i * s->S + j] < 0)
        return 1;
    return 0;
}

/* One sequence: q (L,E), k (S,E), v (S,E) projected; ctx (L,E) out. */
static void attend_ref(float *ctx, const float *q, const float *k, const float *v,
                       const attn_seq *s, int E, int H, double *p)
{
    int D = E / H, L = s->L, S = s->S;
    double scale = 1.0 / sqrt((double)D);
    if (s->weights == ATTN_WEIGHTS_MEAN) memset(s->attn, 0, sizeof(float) * (size_t)L * S);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < L; i++) {
            double mx = -INFINITY;
            for (int j = 0; j < S; j++) {
                if (hidden_ref(s, i, j)) {
                    p[j] = -INFINITY;
                    continue;
                }
                double dot = 0;
                for (int d = 0; d < D; d++)
                    dot += (double)q[(size_t)i * E + h * D + d] * k[(size_t)j * E + h * D + d];
                p[j] = dot * scale;
                if (s->attn_mask_add) p[j] += s->attn_mask_add[(size_t)i * S + j];
                if (p[j] > mx) mx = p[j];
            }
            double sum = 0;
            for (int j = 0; j < S; j++) {
                p[j] = mx == -INFINITY ? 0.0 : exp(p[j] - mx);
                sum += p[j];
            }
            for (int j = 0; j < S; j++) p[j] = sum > 0 ? p[j] / sum : 0.0;
            for (int d = 0; d < D; d++) {
                double acc = 0;
                for (int j = 0; j < S; j++) acc += p[j] * v[(size_t)j * E + h * D + d];
                ctx[(size_t)i * E + h * D + d] = (float)acc;
            }
            for (int j = 0; j < S; j++) {
                if (s->weights == ATTN_WEIGHTS_HEADS)
                    s->attn[((size_t)h * L + i) * S + j] = (float)p[j];
                else if (s->weights == ATTN_WEIGHTS_MEAN)
                    s->attn[(size_t)i * S + j] += (float)(p[j] / H);
            }
        }
}

int attn_forward_ref(const attn_model *m, attn_batch *b, char *err, size_t errlen)
{
    size_t T, U;
    if (attn_check_batch(m, b, &T, &U, err, errlen) < 0) return -1;
    int E = m->hp.embed_dim, H = m->hp.num_heads, Kd = m->hp.kdim, Vd = m->hp.vdim;
    int rc = -1;
    size_t maxL = 0, maxS = 0;
    for (int i = 0; i < b->B; i++) {
        if ((size_t)b->seqs[i].L > maxL) maxL = b->seqs[i].L;
        if ((size_t)b->seqs[i].S > maxS) maxS = b->seqs[i].S;
    }
    float *q = malloc(sizeof(float) * maxL * E);   /* (L,E) */
    float *k = malloc(sizeof(float) * maxS * E);   /* (S,E) */
    float *v = malloc(sizeof(float) * maxS * E);   /* (S,E) */
    float *ctx = malloc(sizeof(float) * maxL * E); /* (L,E) */
    double *p = malloc(sizeof(double) * maxS);     /* (S) one row of scores */
    if (!q || !k || !v || !ctx || !p) {
        snprintf(err, errlen, "out of memory in the reference forward");
        goto cleanup;
    }
    size_t qo = 0, ko = 0;
    for (int i = 0; i < b->B; i++) {
        const attn_seq *s = &b->seqs[i];
        const float *xq = b->query + qo * E;
        const float *xk = b->key ? b->key + ko * Kd : xq;
        const float *xv = b->value ? b->value + ko * Vd : xk;
        linear_ref(q, xq, m->q_w, m->q_b, s->L, E, E);
        linear_ref(k, xk, m->k_w, m->k_b, s->S, Kd, E);
        linear_ref(v, xv, m->v_w, m->v_b, s->S, Vd, E);
        attend_ref(ctx, q, k, v, s, E, H, p);
        linear_ref(b->out + qo * E, ctx, m->out_w, m->out_b, s->L, E, E);
        qo += s->L;
        ko += s->S;
    }
    rc = 0;
cleanup:
    free(q);
    free(k);
    free(v);
    free(ctx);
    free(p);
    return rc;
}
