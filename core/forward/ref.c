/* ref.c - the naive reference forward: plain loops over the formulas of
 * SPEC sections 1 and 7, one sequence and one head at a time, with double
 * sums. Slow on purpose; the tests hold the fast path to it.
 *
 * Beyond nn.MultiheadAttention it follows the decoder options of attn.h:
 * query head h reads key/value head h / (H / G); D is hp.head_dim; scores
 * are scaled by hp.scale; with rotary positions, q and k are rotated after
 * projection (and bias) at each row's position, angles in double. A cache
 * step (attn_seq.kv) reads its earlier keys and values from its cache,
 * appends its own rows there, and its row i (position cached + i) sees keys
 * 0 .. cached + i. A selection (attn_select) keeps the heads, rows and
 * top-k it asks for out of the whole weights, which are computed for every
 * head and row alike.
 *
 * A model that computes in bf16 (attn_model.precision) has the formula of
 * SPEC section 8 here, still with double sums: projection inputs and
 * weights rounded to bf16; with attn_model.attn16, the attention of
 * the bf16 block's (kernels/block_bf16.h) (queries scaled by scale * log2(e) and rounded, keys and
 * values rounded, scores in log2 units, c = ceil(max), p = 2^(x - c), the
 * output sum_j bf16(p_j) v~_j / sum_j p_j, weights p_j / sum_j p_j) and a
 * cache of bf16 pages (attn_seq.kv16). A model that computes in int8 has
 * its projections' int8 formula (kernels/gemm_int8.h): each input row
 * quantized with its own scale, times the packed int8 weights, the sum
 * scaled back and the bias added in double.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/gemm_bf16.h"
#include "../kernels/gemm_int8.h"
#include "../kernels/kv_pages.h"
#include "../ops/seq.h"
#include "check.h"

/* x, or x rounded to bf16 (bf16 != 0), widened. */
static double op(float x, int bf16) {
    return bf16 ? (double)attn_bf16_to_f32(attn_bf16_of_ftz(x)) : (double)x;
}

/* y (n, out) = x (n, in) @ w^T (in, out) + b (out) for projection `which`
 * of m (0 q, 1 k, 2 v, 3 out); for a BF16 model x rounded to bf16 and w
 * its bf16 weights (as packed: its fp32 ones are gone). */
/* The int8 formula on x (n, K) for projection `which` of an INT8 model. */
static void linear_int8_ref(float *y, const float *x, const attn_model *m, int which, size_t n) {
    const attn_packed_int8 *pw = &m->packed8[which];
    int8_t *q = malloc((size_t)pw->K + 1);
    if (!q) return;
    for (size_t i = 0; i < n; i++) {
        double sa = attn_int8_quantize(q, x + i * (size_t)pw->K, (size_t)pw->K);
        for (int o = 0; o < pw->N; o++) {
            double acc = 0;
            for (int k = 0; k < pw->K; k++)
                acc += (double)q[k] * attn_packed_int8_at(pw, o, k);
            y[i * (size_t)pw->N + o] = (float)(acc * sa * pw->scale[o] + pw->bias[o]);
        }
    }
    free(q);
}

static void linear_ref(float *y, const float *x, const attn_model *m, int which, size_t n) {
    if (m->packed8) {
        linear_int8_ref(y, x, m, which, n);
        return;
    }
    const attn_hparams *hp = &m->hp;
    int QW = hp->num_heads * hp->head_dim, KW = hp->num_kv_heads * hp->head_dim;
    const int ins[4] = {hp->embed_dim, hp->kdim, hp->vdim, QW},
              outs[4] = {QW, KW, KW, hp->embed_dim};
    const float *ws[4] = {m->q_w, m->k_w, m->v_w, m->out_w},
                *bs[4] = {m->q_b, m->k_b, m->v_b, m->out_b};
    const attn_packed_bf16 *pw = m->packed16 ? &m->packed16[which] : NULL;
    int in = ins[which], out = outs[which], b16 = pw != NULL;
    for (size_t i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double acc = bs[which][o];
            for (int k = 0; k < in; k++)
                acc +=
                    op(x[i * in + k], b16) * (pw ? attn_bf16_to_f32(attn_packed_bf16_at(pw, o, k))
                                                 : (double)ws[which][(size_t)o * in + k]);
            y[i * out + o] = (float)acc;
        }
}

/* YaRN (Hugging Face's _compute_yarn_parameters): the correction range of
 * pairs between beta_fast and beta_slow turns over the trained context,
 * inv_freq / factor weighted by a linear ramp across it. */
static double yarn_freq_ref(const attn_rope *r, int i, double f) {
    double fast = r->beta_fast > 0 ? r->beta_fast : 32, slow = r->beta_slow > 0 ? r->beta_slow : 1;
    double lo = r->dim * log(r->original_max_position / (fast * 2 * M_PI)) / (2 * log(r->theta));
    double hi = r->dim * log(r->original_max_position / (slow * 2 * M_PI)) / (2 * log(r->theta));
    if (!r->exact_range) lo = floor(lo), hi = ceil(hi);
    if (lo < 0) lo = 0;
    if (hi > r->dim - 1) hi = r->dim - 1;
    if (lo == hi) hi += 0.001;
    double t = (i - lo) / (hi - lo), ramp = t < 0 ? 0 : t > 1 ? 1 : t;
    return (1 - ramp) * f + ramp * f / r->factor;
}

/* YaRN's multiplier of cos and sin: given, or from factor and mscale. */
static double yarn_af_ref(const attn_rope *r) {
    if (r->scaling != ATTN_ROPE_SCALE_YARN) return 1;
    if (r->attention_factor > 0) return r->attention_factor;
    double l = r->factor > 1 ? 0.1 * log(r->factor) : 0;
    if (r->mscale > 0 && r->mscale_all_dim > 0)
        return (l * r->mscale + 1) / (l * r->mscale_all_dim + 1);
    return l + 1;
}

/* The rotation frequency of pair i of dim/2, with the scaling rule of r
 * (attn.h; Hugging Face's _compute_llama3_parameters for LLAMA3). */
static double rope_freq_ref(const attn_rope *r, int i) {
    double f = pow(r->theta, -2.0 * i / r->dim);
    if (r->scaling == ATTN_ROPE_SCALE_LINEAR) return f / r->factor;
    if (r->scaling == ATTN_ROPE_SCALE_YARN) return yarn_freq_ref(r, i, f);
    if (r->scaling != ATTN_ROPE_SCALE_LLAMA3) return f;
    double wavelen = 2 * M_PI / f;
    double low_wavelen = r->original_max_position / r->low_freq_factor;
    double high_wavelen = r->original_max_position / r->high_freq_factor;
    if (wavelen < high_wavelen) return f;
    if (wavelen > low_wavelen) return f / r->factor;
    double smooth = (r->original_max_position / wavelen - r->low_freq_factor) /
                    (r->high_freq_factor - r->low_freq_factor);
    return (1 - smooth) * f / r->factor + smooth * f;
}

/* Rotates the first r->dim columns of each of the `heads` heads of x
 * (n, heads*D) in place, row i at position pos[i] (or pos0 + i when pos is
 * NULL). */
static void rope_ref(float *x, size_t n, int heads, int D, const attn_rope *r, const int32_t *pos,
                     int pos0) {
    int half = r->dim / 2;
    double af = yarn_af_ref(r);
    for (size_t i = 0; i < n; i++) {
        double p = pos ? (double)pos[i] : (double)pos0 + (double)i;
        for (int h = 0; h < heads; h++) {
            float *row = x + (i * heads + h) * D;
            for (int j = 0; j < half; j++) {
                double a = p * rope_freq_ref(r, j);
                int i0 = r->style == ATTN_ROPE_HALF ? j : 2 * j;
                int i1 = r->style == ATTN_ROPE_HALF ? j + half : 2 * j + 1;
                double x0 = row[i0], x1 = row[i1];
                row[i0] = (float)(af * (x0 * cos(a) - x1 * sin(a)));
                row[i1] = (float)(af * (x1 * cos(a) + x0 * sin(a)));
            }
        }
    }
}

/* Key j hidden from query row i; a step's row i is at position cached + i. */
static int hidden_ref(const attn_seq *s, int i, int j) {
    if ((s->kv || s->kv16) && j > s->cached + i) return 1;
    if (s->causal && j > i) return 1;
    if (s->key_padding_mask && s->key_padding_mask[j]) return 1;
    if (s->attn_mask_bool && s->attn_mask_bool[(size_t)i * s->S + j]) return 1;
    if (s->attn_mask_add && isinf(s->attn_mask_add[(size_t)i * s->S + j]) &&
        s->attn_mask_add[(size_t)i * s->S + j] < 0)
        return 1;
    return 0;
}

/* Scores p (S) of query row qr (D) against key head g of k (S, G*D at
 * stride kw) for row i of s: -inf where hidden; for attn16 in log2 units,
 * from rounded operands. Returns the largest. */
static double scores_ref(double *p, const float *qr, const float *k, size_t kw, int g,
                         const attn_seq *s, int i, const attn_model *m) {
    int D = m->hp.head_dim, b16 = m->attn16;
    float qs = attn_scale(&m->hp) * ATTN_LOG2E; /* attn16: q's factor, in float */
    double mx = -INFINITY;
    for (int j = 0; j < s->S; j++) {
        if (hidden_ref(s, i, j)) {
            p[j] = -INFINITY;
            continue;
        }
        double dot = 0;
        for (int d = 0; d < D; d++)
            dot +=
                (b16 ? op(qr[d] * qs, 1) : (double)qr[d]) * op(k[j * kw + (size_t)g * D + d], b16);
        float add = s->attn_mask_add ? s->attn_mask_add[(size_t)i * s->S + j] : 0.0f;
        p[j] = b16 ? dot + attn_bf16_mask_log2(add) : dot * m->hp.scale + add;
        if (p[j] > mx) mx = p[j];
    }
    return mx;
}

/* Row i of head h: scores p (S) become its weights, out (D) its output
 * from value head g of v. fp32: softmax; attn16: c = ceil(max), p = 2^(x-c),
 * out = sum_j bf16(p_j) v~_j / sum_j p_j. */
static void softmax_ref(double *p, float *out, double mx, const float *v, size_t kw, int g, int S,
                        const attn_model *m) {
    int D = m->hp.head_dim, b16 = m->attn16;
    double c = b16 ? ceil(mx) : mx, sum = 0;
    for (int j = 0; j < S; j++) {
        p[j] = mx == -INFINITY ? 0.0 : b16 ? exp2(p[j] - c) : exp(p[j] - c);
        sum += p[j];
    }
    for (int d = 0; d < D; d++) {
        double acc = 0;
        for (int j = 0; j < S; j++)
            acc += (b16 ? op((float)p[j], 1) / sum : p[j] / sum) *
                   op(v[j * kw + (size_t)g * D + d], b16);
        out[d] = sum > 0 ? (float)acc : 0.0f;
    }
    for (int j = 0; j < S; j++)
        p[j] = sum > 0 ? p[j] / sum : 0.0;
}

/* out, idx (k) = the k largest of w (S), descending, the lower key first
 * among equals: k passes over w, each taking the largest not yet taken. */
static void top_k_ref(float *out, int32_t *idx, const float *w, int S, int k, uint8_t *taken) {
    memset(taken, 0, (size_t)S);
    for (int m = 0; m < k; m++) {
        int best = -1;
        for (int j = 0; j < S; j++)
            if (!taken[j] && (best < 0 || w[j] > w[best])) best = j;
        taken[best] = 1;
        out[m] = w[best];
        idx[m] = best;
    }
}

/* The place of head h among s's selected heads, or -1. */
static int head_slot(const attn_seq *s, int h) {
    if (!s->sel.heads) return h;
    for (int c = 0; c < s->sel.n_heads; c++)
        if (s->sel.heads[c] == h) return c;
    return -1;
}

/* Weights w (S) of head place `slot` (0 for a mean) at query row i into
 * s's answer: whole, or its top-k; rows outside the selection are left. */
static void answer_row_ref(const attn_seq *s, int H, int slot, int i, const float *w,
                           uint8_t *taken) {
    int row0, row1, nh, k = s->sel.top_k, W = k ? k : s->S;
    attn_select_span(s, H, &row0, &row1, &nh);
    if (i < row0 || i >= row1) return;
    size_t at = ((size_t)slot * (row1 - row0) + (size_t)(i - row0)) * W;
    if (k)
        top_k_ref(s->attn + at, s->attn_idx + at, w, s->S, k, taken);
    else
        memcpy(s->attn + at, w, sizeof(float) * (size_t)s->S);
}

/* s's answer from its weights: mean (L,S) summed over its selected heads
 * (or each head's rows, given one at a time by attend_ref). */
static void answer_mean_ref(const attn_seq *s, int H, const double *mean, float *w,
                            uint8_t *taken) {
    int row0, row1, nh;
    attn_select_span(s, H, &row0, &row1, &nh);
    for (int i = row0; i < row1; i++) {
        for (int j = 0; j < s->S; j++)
            w[j] = (float)(mean[(size_t)i * s->S + j] / nh);
        answer_row_ref(s, H, 0, i, w, taken);
    }
}

/* Scratch of attend_ref for S keys and L query rows. */
typedef struct {
    double *p;      /* (S) one row of scores */
    float *w;       /* (S) one row of weights in float */
    uint8_t *taken; /* (S) top-k */
    double *mean;   /* (L,S) a mean's sums */
} ref_rows;

/* One sequence: q (L,H*D), k (S,G*D), v (S,G*D) projected; ctx (L,H*D) out. */
static void attend_ref(float *ctx, const float *q, const float *k, const float *v,
                       const attn_seq *s, const attn_model *m, const ref_rows *rr) {
    const attn_hparams *hp = &m->hp;
    int H = hp->num_heads, G = hp->num_kv_heads, D = hp->head_dim, L = s->L, S = s->S;
    size_t qw = (size_t)H * D, kw = (size_t)G * D;
    double *p = rr->p;
    if (s->weights == ATTN_WEIGHTS_MEAN) memset(rr->mean, 0, sizeof(double) * (size_t)L * S);
    for (int h = 0; h < H; h++) {
        int g = h / (H / G); /* the key/value head this query head reads */
        for (int i = 0; i < L; i++) {
            double mx = scores_ref(p, q + i * qw + (size_t)h * D, k, kw, g, s, i, m);
            softmax_ref(p, ctx + i * qw + (size_t)h * D, mx, v, kw, g, S, m);
            int slot = head_slot(s, h);
            if (slot < 0) continue;
            for (int j = 0; j < S; j++) {
                rr->w[j] = (float)p[j];
                if (s->weights == ATTN_WEIGHTS_MEAN) rr->mean[(size_t)i * S + j] += p[j];
            }
            if (s->weights == ATTN_WEIGHTS_HEADS) answer_row_ref(s, H, slot, i, rr->w, rr->taken);
        }
    }
    if (s->weights == ATTN_WEIGHTS_MEAN) answer_mean_ref(s, H, rr->mean, rr->w, rr->taken);
}

/* Token j of a cache step s: its key and value rows read from the cache
 * (j < cached) or appended to it. */
static void cache_ref(const attn_seq *s, int j, float *kj, float *vj, int G, int D) {
    size_t KW = (size_t)G * D;
    float *row = s->kv ? s->kv + (size_t)j * 2 * KW : NULL; /* key (G*D), then value (G*D) */
    if (j < s->cached && row) {
        memcpy(kj, row, sizeof(float) * KW);
        memcpy(vj, row + KW, sizeof(float) * KW);
    } else if (j < s->cached) {
        attn_kv_bf16_get(s->kv16, G, D, (size_t)j, kj, vj);
    } else if (row) {
        memcpy(row, kj, sizeof(float) * KW);
        memcpy(row + KW, vj, sizeof(float) * KW);
    } else {
        attn_kv_bf16_put(s->kv16, G, D, (size_t)j, kj, vj);
    }
}

/* One sequence's q (L,H*D), k and v (S,G*D), rotated: from its inputs xq,
 * xk, xv, or for a cache step from its cache and its new rows (which it
 * appends to the cache). */
static void project_ref(float *q, float *k, float *v, const attn_model *m, const attn_seq *s,
                        const float *xq, const float *xk, const float *xv) {
    const attn_hparams *hp = &m->hp;
    int D = hp->head_dim, H = hp->num_heads, G = hp->num_kv_heads, KW = G * D;
    int c = s->kv || s->kv16 ? s->cached : 0, n = s->S - c; /* rows [c, S) are projected here */
    linear_ref(q, xq, m, 0, (size_t)s->L);
    linear_ref(k + (size_t)c * KW, xk, m, 1, (size_t)n);
    linear_ref(v + (size_t)c * KW, xv, m, 2, (size_t)n);
    if (hp->rope.dim) { /* self-attention only (attn_check_batch): new k rows are q's rows */
        rope_ref(q, s->L, H, D, &hp->rope, s->positions, c);
        rope_ref(k + (size_t)c * KW, n, G, D, &hp->rope, s->positions, c);
    }
    for (int j = 0; (s->kv || s->kv16) && j < s->S; j++)
        cache_ref(s, j, k + (size_t)j * KW, v + (size_t)j * KW, G, D);
}

int attn_forward_ref(const attn_model *m, attn_batch *b, char *err, size_t errlen) {
    size_t T, U;
    if (attn_check_batch(m, b, &T, &U, err, errlen) < 0) return -1;
    const attn_hparams *hp = &m->hp;
    int E = hp->embed_dim, Kd = hp->kdim, Vd = hp->vdim, D = hp->head_dim;
    int QW = hp->num_heads * D, KW = hp->num_kv_heads * D;
    int rc = -1;
    size_t maxL = 0, maxS = 0;
    for (int i = 0; i < b->B; i++) {
        if ((size_t)b->seqs[i].L > maxL) maxL = b->seqs[i].L;
        if ((size_t)b->seqs[i].S > maxS) maxS = b->seqs[i].S;
    }
    float *q = malloc(sizeof(float) * maxL * QW);   /* (L,H*D) */
    float *k = malloc(sizeof(float) * maxS * KW);   /* (S,G*D) */
    float *v = malloc(sizeof(float) * maxS * KW);   /* (S,G*D) */
    float *ctx = malloc(sizeof(float) * maxL * QW); /* (L,H*D) */
    ref_rows rr = {malloc(sizeof(double) * maxS), malloc(sizeof(float) * maxS), malloc(maxS),
                   malloc(sizeof(double) * maxL * maxS)};
    if (!q || !k || !v || !ctx || !rr.p || !rr.w || !rr.taken || !rr.mean) {
        snprintf(err, errlen, "out of memory in the reference forward");
        goto cleanup;
    }
    size_t qo = 0, ko = 0;
    for (int i = 0; i < b->B; i++) {
        const attn_seq *s = &b->seqs[i];
        const float *xq = b->query + qo * E;
        const float *xk = b->key ? b->key + ko * Kd : xq;
        const float *xv = b->value ? b->value + ko * Vd : xk;
        project_ref(q, k, v, m, s, xq, xk, xv);
        attend_ref(ctx, q, k, v, s, m, &rr);
        linear_ref(b->out + qo * E, ctx, m, 3, (size_t)s->L);
        qo += s->L;
        ko += s->S;
    }
    rc = 0;
cleanup:
    free(q);
    free(k);
    free(v);
    free(ctx);
    free(rr.p);
    free(rr.w);
    free(rr.taken);
    free(rr.mean);
    return rc;
}
