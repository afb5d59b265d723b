/* decode.c - the forward of decoder attention (SPEC section 7): grouped
 * key/value heads, any head_dim and scale, rotary positions; for a whole
 * batch (attn_forward_decoder) and for session steps over a KV cache
 * (attn_step_forward). nn.MultiheadAttention models go through attn.c.
 *
 *   1. projections: over all new tokens at once, Q, K and V side by side
 *      (QKV (N, H*D + 2*G*D)), with the core's kernel on the weights packed
 *      at load (proj.c, gemm.c), as one parallel loop of tiles;
 *   2. rotary positions on q and k, angles in double from integer positions;
 *   3. per (row, key/value head g): the R = H/G query heads of the group
 *      score against g's keys together, so each key row is read once:
 *      scores (R, S') = q_g (R,D) @ k_g^T (D,S'), softmax (softmax.c),
 *      (R,D) = p @ v_g,
 *      where S' is the last key the row may see (causal rows stop early);
 *   4. out projection: the same way.
 * Steps write their rotated keys and their values into the session's cache
 * rows before attending, so a step's new rows see each other causally.
 * Every step splits over the compute context's threads when one is given
 * (projections by tiles, attention by rows, or by (row, key/value head)
 * when no mean weights are asked for), on the calling thread when it is
 * NULL; OpenBLAS (the attention's small products) stays single-threaded
 * (blas.c). The projection kernel computes each output alike whatever the
 * batch and the tiles, so a step's projections are the very bits of the
 * same rows in a whole sequence. Scratch is allocated per call. Legend: see
 * attn.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "internal.h"
#include "sizes.h"

/* ---- rotary positions ---------------------------------------------------- */

/* inv (dim/2): the frequency of each rotated pair, scaling applied (attn.h). */
static void rope_freqs(const attn_rope *r, double *inv) {
    for (int i = 0; i < r->dim / 2; i++) {
        double f = pow(r->theta, -2.0 * i / r->dim);
        if (r->scaling == ATTN_ROPE_SCALE_LINEAR) f /= r->factor;
        if (r->scaling == ATTN_ROPE_SCALE_LLAMA3) {
            double wavelen = 2 * M_PI / f, orig = r->original_max_position;
            if (wavelen > orig / r->low_freq_factor) {
                f /= r->factor;
            } else if (wavelen >= orig / r->high_freq_factor) {
                double s = (orig / wavelen - r->low_freq_factor) /
                           (r->high_freq_factor - r->low_freq_factor);
                f = (1 - s) * f / r->factor + s * f;
            }
        }
        inv[i] = f;
    }
}

/* Rotates the first dim columns of each head of rows x (n, heads*D, stride
 * ld), row i at position pos0 + i, or pos[i] when pos is given. */
static void rope_rows(float *x, size_t ld, int n, int heads, int D, const attn_rope *r,
                      const double *inv, const int32_t *pos, int pos0) {
    int half = r->dim / 2;
    int il = r->style == ATTN_ROPE_INTERLEAVED;
    for (int i = 0; i < n; i++) {
        double p = pos ? (double)pos[i] : (double)(pos0 + i);
        for (int j = 0; j < half; j++) {
            double a = p * inv[j];
            float c = (float)cos(a), s = (float)sin(a);
            int a0 = il ? 2 * j : j, a1 = il ? 2 * j + 1 : j + half;
            for (int h = 0; h < heads; h++) {
                float *row = x + (size_t)i * ld + (size_t)h * D;
                float x0 = row[a0], x1 = row[a1];
                row[a0] = x0 * c - x1 * s;
                row[a1] = x1 * c + x0 * s;
            }
        }
    }
}

/* ---- one row of attention --------------------------------------------- */

/* Where one query row's keys are and which it may see. */
typedef struct {
    const float *k, *v; /* key and value row 0 of head g; row stride ld */
    size_t ld;
    int S;             /* keys in all */
    int jend;          /* keys [jend, S) are hidden (causal) */
    const attn_seq *s; /* masks of a whole-sequence row, or NULL */
    int i;             /* the row's index in s (masks) */
} row_keys;

static int hidden(const row_keys *rk, int j) {
    const attn_seq *s = rk->s;
    if (!s) return 0;
    size_t at = (size_t)rk->i * s->S + j;
    if (s->key_padding_mask && s->key_padding_mask[j]) return 1;
    if (s->attn_mask_bool && s->attn_mask_bool[at]) return 1;
    return s->attn_mask_add && isinf(s->attn_mask_add[at]) && s->attn_mask_add[at] < 0;
}

/* ctx (R,D) = softmax(q (R,D) k^T * scale + masks) v for the R query heads
 * of one group at one row; sc holds R * S floats. Weights, when w is given,
 * go to w[r * wstride + j] (zeros past jend). */
static void attend_group(float *ctx, const float *q, const row_keys *rk, int R, int D, float scale,
                         float *sc, float *w, size_t wstride) {
    int n = rk->jend;
    if (n > 0) {
        // q (R,D) @ k^T (D,n) * scale -> sc (R,n)
        blas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, n, D, scale, q, D, rk->k,
                   (int)rk->ld, 0.0f, sc, n);
    }
    for (int r = 0; r < R; r++) {
        float *row = sc + (size_t)r * n;
        for (int j = 0; j < n; j++) {
            if (rk->s && rk->s->attn_mask_add)
                row[j] += rk->s->attn_mask_add[(size_t)rk->i * rk->s->S + j];
            if (hidden(rk, j)) row[j] = -INFINITY;
        }
    }
    attn_softmax_rows(sc, (size_t)n, R, n, n); /* every key hidden: weights 0 */
    for (int r = 0; w && r < R; r++) {
        memcpy(w + (size_t)r * wstride, sc + (size_t)r * n, sizeof(float) * (size_t)n);
        memset(w + (size_t)r * wstride + n, 0, sizeof(float) * (size_t)(rk->S - n));
    }
    if (n > 0) {
        // p (R,n) @ v (n,D) -> ctx (R,D)
        blas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, D, n, 1.0f, sc, n, rk->v,
                   (int)rk->ld, 0.0f, ctx, D);
    } else {
        memset(ctx, 0, sizeof(float) * (size_t)R * D);
    }
}

/* ---- shared steps ------------------------------------------------------ */

/* Widths of one token's projections. */
typedef struct {
    int E, H, G, D, R; /* R = H / G query heads per key/value head */
    int QW, KW, W;     /* H*D, G*D, QW + 2*KW */
    float scale;
} dims;

static dims dims_of(const attn_hparams *hp) {
    dims d = {hp->embed_dim, hp->num_heads, hp->num_kv_heads, hp->head_dim, 0, 0, 0, 0, 0};
    d.R = d.H / d.G;
    d.QW = d.H * d.D;
    d.KW = d.G * d.D;
    d.W = d.QW + 2 * d.KW;
    d.scale = (float)hp->scale;
    return d;
}

/* fn(arg, task, thread) for every task, on ctx's threads, or on the calling
 * thread when ctx is NULL. */
static void par(attn_ctx *ctx, int ntasks, void (*fn)(void *, int, int), void *arg) {
    if (ctx && attn_ctx_threads(ctx) > 1 && ntasks > 1) {
        attn_ctx_parallel(ctx, ntasks, fn, arg);
        return;
    }
    for (int t = 0; t < ntasks; t++)
        fn(arg, t, 0);
}

static int threads_of(attn_ctx *ctx) {
    return ctx ? attn_ctx_threads(ctx) : 1;
}

/* The projections parts (proj.c: tiles on the model's packed weights) on
 * ctx's threads, or on the calling thread when ctx is NULL. */
static void project(attn_ctx *ctx, const proj_part *parts, int n) {
    proj_run(attn_ctx_pool(ctx), threads_of(ctx), parts, n);
}

/* ---- rows of attention, in parallel ---------------------------------------- */

/* One query row: where its heads go, its keys, and its weights. */
typedef struct {
    float *ctx;     /* (H*D) the row's head outputs */
    const float *q; /* (H*D) its rotated query */
    row_keys rk;    /* key/value head 0; head g is D columns on */
    float *w;       /* HEADS: head 0's row, head h at w + h * wstride; or NULL */
    size_t wstride;
    float *mean; /* MEAN: the row (S), or NULL */
} row_job;

typedef struct {
    const row_job *rows;
    int G, R, D, H;
    float scale;
    int by_group; /* 1: a task is (row, g); 0: (row), every group */
    float *sc;    /* (threads, R * S) scores */
    size_t sc_each;
} rows_job;

static void rows_task(void *arg, int t, int thread) {
    const rows_job *a = arg;
    int r = a->by_group ? t / a->G : t;
    int g0 = a->by_group ? t % a->G : 0, g1 = a->by_group ? g0 + 1 : a->G;
    const row_job *j = &a->rows[r];
    float *sc = a->sc + (size_t)thread * a->sc_each;
    for (int g = g0; g < g1; g++) {
        row_keys rk = j->rk;
        rk.k += (size_t)g * a->D;
        rk.v += (size_t)g * a->D;
        size_t off = (size_t)g * a->R * a->D;
        attend_group(j->ctx + off, j->q + off, &rk, a->R, a->D, a->scale, sc,
                     j->w ? j->w + (size_t)g * a->R * j->wstride : NULL, j->wstride);
        if (j->mean) /* tasks are whole rows here: no other task adds to it */
            for (int h = 0; h < a->R; h++)
                for (int c = 0; c < rk.jend; c++)
                    j->mean[c] += sc[(size_t)h * rk.jend + c] / (float)a->H;
    }
}

/* Attends every row job; a row asking for MEAN weights is one task. */
static int run_rows(attn_ctx *ctx, const dims *d, const row_job *rows, size_t n, size_t maxS,
                    char *err, size_t errlen) {
    int nt = threads_of(ctx), any_mean = 0;
    for (size_t i = 0; i < n; i++) {
        if (!rows[i].mean) continue;
        any_mean = 1;
        memset(rows[i].mean, 0, sizeof(float) * (size_t)rows[i].rk.S);
    }
    uint64_t each, all;
    if (sz_mul((uint64_t)d->R, maxS, UINT64_MAX, &each) < 0 ||
        sz_mul(each, (uint64_t)nt, SIZE_MAX / sizeof(float), &all) < 0) {
        snprintf(err, errlen, "scores of %zu keys do not fit in memory", maxS);
        return -1;
    }
    float *sc = malloc(sizeof(float) * (size_t)(all ? all : 1));
    if (!sc) {
        snprintf(err, errlen, "out of memory for scores over %zu keys", maxS);
        return -1;
    }
    rows_job a = {rows, d->G, d->R, d->D, d->H, d->scale, !any_mean, sc, (size_t)each};
    par(ctx, (int)(n * (any_mean ? 1 : (size_t)d->G)), rows_task, &a);
    free(sc);
    return 0;
}

/* Scratch: projections of N tokens (N * W floats) and the heads' outputs
 * (N * H*D), and one row job per token. Free *rows and the result. */
static float *scratch(const dims *d, size_t N, float **qkv, float **ctx, row_job **rows, char *err,
                      size_t errlen) {
    uint64_t a, c, n;
    int bad = sz_mul(N, (uint64_t)d->W, UINT64_MAX, &a) < 0 ||
              sz_mul(N, (uint64_t)d->QW, UINT64_MAX, &c) < 0 ||
              sz_add(a, c, SIZE_MAX / sizeof(float), &n) < 0;
    float *p = bad ? NULL : malloc(sizeof(float) * (size_t)(n ? n : 1));
    *rows = bad ? NULL : calloc(N ? N : 1, sizeof(row_job));
    if (!p || !*rows) {
        free(p);
        free(*rows);
        *rows = NULL;
        snprintf(err, errlen, "out of memory for %zu tokens", N);
        return NULL;
    }
    *qkv = p;
    *ctx = p + a;
    return p;
}

/* ---- whole sequences ------------------------------------------------------ */

/* Where a batch's projections are: q (T, H*D) at stride ldq; k and v
 * (U, G*D) at stride ldkv. */
typedef struct {
    float *q;
    const float *k, *v;
    size_t ldq, ldkv;
} projected;

/* Projects a batch into qkv, (T, W) for self-attention, else (T, H*D) of
 * queries then (U, 2*G*D) of keys and values. */
static projected project_batch(attn_ctx *ctx, const attn_model *m, const attn_batch *b,
                               const dims *d, float *qkv, size_t T, size_t U) {
    const attn_hparams *hp = &m->hp;
    if (!b->key) {
        // query (T,E) @ [Wq;Wk;Wv]^T (E,W) + [bq;bk;bv] -> QKV (T,W)
        proj_part parts[3] = {proj_part_of(m, 0, qkv, d->W, b->query, d->E, T),
                              proj_part_of(m, 1, qkv + d->QW, d->W, b->query, d->E, T),
                              proj_part_of(m, 2, qkv + d->QW + d->KW, d->W, b->query, d->E, T)};
        project(ctx, parts, 3);
        return (projected){qkv, qkv + d->QW, qkv + d->QW + d->KW, (size_t)d->W, (size_t)d->W};
    }
    float *kv = qkv + T * d->QW;
    const float *value = b->value ? b->value : b->key; /* value = key */
    size_t ldv = b->value ? (size_t)hp->vdim : (size_t)hp->kdim, ldkv = 2 * (size_t)d->KW;
    // query (T,E) @ Wq^T (E,H*D) + bq -> Q (T,H*D)
    // key (U,Kd) @ Wk^T (Kd,G*D) + bk -> K; value (U,Vd) (or key) @ Wv^T + bv -> V
    proj_part parts[3] = {proj_part_of(m, 0, qkv, d->QW, b->query, d->E, T),
                          proj_part_of(m, 1, kv, ldkv, b->key, hp->kdim, U),
                          proj_part_of(m, 2, kv + d->KW, ldkv, value, ldv, U)};
    project(ctx, parts, 3);
    return (projected){qkv, kv, kv + d->KW, (size_t)d->QW, ldkv};
}

/* The row jobs of one sequence: ctx (L, H*D); q, k, v at its rows. */
static void seq_rows(row_job *rows, float *ctx, const attn_seq *s, const float *q, size_t ldq,
                     const float *k, const float *v, size_t ldkv, const dims *d) {
    for (int r = 0; r < s->L; r++) {
        row_job *j = &rows[r];
        *j = (row_job){.ctx = ctx + (size_t)r * d->QW,
                       .q = q + (size_t)r * ldq,
                       .rk = {k, v, ldkv, s->S, s->causal && r + 1 < s->S ? r + 1 : s->S, s, r}};
        if (s->weights == ATTN_WEIGHTS_HEADS) {
            j->w = s->attn + (size_t)r * s->S;
            j->wstride = (size_t)s->L * s->S;
        }
        if (s->weights == ATTN_WEIGHTS_MEAN) j->mean = s->attn + (size_t)r * s->S;
    }
}

int attn_forward_decoder(attn_ctx *ctx, const attn_model *m, attn_batch *b, char *err,
                         size_t errlen) {
    size_t T, U, maxS = 0;
    if (attn_check_batch(m, b, &T, &U, err, errlen) < 0) return -1;
    if (attn_check_packed(m, err, errlen) < 0) return -1;
    if (attn_blas_init(err, errlen) < 0) return -1;
    dims d = dims_of(&m->hp);
    for (int i = 0; i < b->B; i++)
        if ((size_t)b->seqs[i].S > maxS) maxS = b->seqs[i].S;
    float *qkv, *heads;
    row_job *rows;
    /* self: (T,W); cross: (T,H*D) + (U,2*G*D), within (T+U, W) */
    float *mem = scratch(&d, T + (b->key ? U : 0), &qkv, &heads, &rows, err, errlen);
    double *inv = malloc(sizeof(double) * (size_t)(m->hp.rope.dim / 2 + 1));
    int rc = -1;
    if (!mem || !inv) {
        if (mem) snprintf(err, errlen, "out of memory for the rotary frequencies");
        goto cleanup;
    }
    if (m->hp.rope.dim) rope_freqs(&m->hp.rope, inv);
    projected p = project_batch(ctx, m, b, &d, qkv, T, U);
    size_t t0 = 0, u0 = 0;
    for (int i = 0; i < b->B; t0 += (size_t)b->seqs[i].L, u0 += (size_t)b->seqs[i].S, i++) {
        const attn_seq *s = &b->seqs[i];
        float *q = p.q + t0 * p.ldq;
        if (m->hp.rope.dim) { /* self-attention (attn_check_batch): k rows are q's rows */
            rope_rows(q, p.ldq, s->L, d.H, d.D, &m->hp.rope, inv, s->positions, 0);
            rope_rows(q + d.QW, p.ldq, s->L, d.G, d.D, &m->hp.rope, inv, s->positions, 0);
        }
        seq_rows(rows + t0, heads + t0 * d.QW, s, q, p.ldq, p.k + u0 * p.ldkv, p.v + u0 * p.ldkv,
                 p.ldkv, &d);
    }
    if (run_rows(ctx, &d, rows, T, maxS, err, errlen) < 0) goto cleanup;
    // heads (T,H*D) @ Wo^T (H*D,E) + bo -> out (T,E)
    proj_part out = proj_part_of(m, 3, b->out, d.E, heads, d.QW, T);
    project(ctx, &out, 1);
    rc = 0;
cleanup:
    free(inv);
    free(rows);
    free(mem);
    return rc;
}

/* ---- session steps ------------------------------------------------------ */

static int check_steps(const attn_model *m, const attn_step *steps, int n, size_t *N, size_t *maxS,
                       char *err, size_t errlen) {
    *N = *maxS = 0;
    if (!m->mem || n < 1 || !steps) {
        snprintf(err, errlen, "steps need a model and at least one step");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const attn_step *st = &steps[i];
        if (st->n < 1 || st->len < 0 || st->len > INT32_MAX - st->n || !st->kv || !st->query ||
            !st->out || (st->weights != ATTN_WEIGHTS_NONE && !st->attn)) {
            snprintf(err, errlen, "step %d: needs n >= 1, len >= 0, a cache, a query and an output",
                     i);
            return -1;
        }
        *N += (size_t)st->n;
        if ((size_t)(st->len + st->n) > *maxS) *maxS = (size_t)(st->len + st->n);
    }
    return 0;
}

/* The row jobs of one step: its new rows over its cache [0, len + n). */
static void step_rows(row_job *rows, float *heads, const attn_step *st, const float *q,
                      const dims *d) {
    int S = st->len + st->n;
    size_t ld = 2 * (size_t)d->KW;
    for (int r = 0; r < st->n; r++) {
        row_job *j = &rows[r];
        *j = (row_job){.ctx = heads + (size_t)r * d->QW,
                       .q = q + (size_t)r * d->W,
                       .rk = {st->kv, st->kv + d->KW, ld, S, st->len + r + 1, NULL, 0}};
        if (st->weights == ATTN_WEIGHTS_HEADS) {
            j->w = st->attn + (size_t)r * S;
            j->wstride = (size_t)st->n * S;
        }
        if (st->weights == ATTN_WEIGHTS_MEAN) j->mean = st->attn + (size_t)r * S;
    }
}

int attn_step_forward(attn_ctx *ctx, const attn_model *m, attn_step *steps, int n, char *err,
                      size_t errlen) {
    size_t N, maxS;
    if (check_steps(m, steps, n, &N, &maxS, err, errlen) < 0) return -1;
    if (attn_check_packed(m, err, errlen) < 0) return -1;
    if (attn_blas_init(err, errlen) < 0) return -1;
    dims d = dims_of(&m->hp);
    float *qkv, *heads, *xo = NULL;
    row_job *rows = NULL;
    double *freqs = NULL;
    float *mem = scratch(&d, N, &qkv, &heads, &rows, err, errlen);
    int rc = -1;
    if (!mem) return -1;
    freqs = malloc(sizeof(double) * (size_t)(m->hp.rope.dim / 2 + 1));
    xo = malloc(sizeof(float) * N * (size_t)d.E); /* (N,E): queries in, outputs out */
    if (!freqs || !xo) {
        snprintf(err, errlen, "out of memory for %zu step rows", N);
        goto cleanup;
    }
    if (m->hp.rope.dim) rope_freqs(&m->hp.rope, freqs);
    for (int i = 0, t = 0; i < n; t += steps[i].n, i++)
        memcpy(xo + (size_t)t * d.E, steps[i].query, sizeof(float) * (size_t)steps[i].n * d.E);
    // queries (N,E) @ [Wq;Wk;Wv]^T (E,W) + [bq;bk;bv] -> QKV (N,W)
    proj_part parts[3] = {proj_part_of(m, 0, qkv, d.W, xo, d.E, N),
                          proj_part_of(m, 1, qkv + d.QW, d.W, xo, d.E, N),
                          proj_part_of(m, 2, qkv + d.QW + d.KW, d.W, xo, d.E, N)};
    project(ctx, parts, 3);
    for (int i = 0, t = 0; i < n; t += steps[i].n, i++) {
        attn_step *st = &steps[i];
        float *x = qkv + (size_t)t * d.W; /* (n,W) */
        if (m->hp.rope.dim) {
            rope_rows(x, d.W, st->n, d.H, d.D, &m->hp.rope, freqs, NULL, st->len);
            rope_rows(x + d.QW, d.W, st->n, d.G, d.D, &m->hp.rope, freqs, NULL, st->len);
        }
        for (int r = 0; r < st->n; r++) /* rotated key and value rows into the cache */
            memcpy(st->kv + (size_t)(st->len + r) * 2 * d.KW, x + (size_t)r * d.W + d.QW,
                   sizeof(float) * 2 * (size_t)d.KW);
        step_rows(rows + t, heads + (size_t)t * d.QW, st, x, &d);
    }
    if (run_rows(ctx, &d, rows, N, maxS, err, errlen) < 0) goto cleanup;
    // heads (N,H*D) @ Wo^T (H*D,E) + bo -> out (N,E)
    proj_part out = proj_part_of(m, 3, xo, d.E, heads, d.QW, N);
    project(ctx, &out, 1);
    for (int i = 0, t = 0; i < n; t += steps[i].n, i++)
        memcpy(steps[i].out, xo + (size_t)t * d.E, sizeof(float) * (size_t)steps[i].n * d.E);
    rc = 0;
cleanup:
    free(freqs);
    free(xo);
    free(rows);
    free(mem);
    return rc;
}
